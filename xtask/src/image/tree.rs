//! The image's file tree, assembled once in memory and written twice: as the
//! initramfs (a newc cpio archive) and as the rootfs directory the process engine uses.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir {
        mode: u32,
    },
    File {
        data: Vec<u8>,
        mode: u32,
    },
    Symlink {
        target: String,
    },
    /// A character device; only the cpio carries it (the rootfs directory cannot
    /// hold device nodes without root, and the process engine provides its own /dev).
    CharDev {
        major: u32,
        minor: u32,
        mode: u32,
    },
}

/// Paths are relative (`bin/busybox`), sorted bytewise so output is reproducible.
#[derive(Debug, Default)]
pub struct Tree {
    entries: BTreeMap<String, Node>,
}

impl Tree {
    /// Adds `path` as a directory, and any missing parents with mode 0755.
    pub fn dir(&mut self, path: &str, mode: u32) {
        self.parents(path);
        self.entries.insert(path.to_string(), Node::Dir { mode });
    }

    pub fn file(&mut self, path: &str, data: Vec<u8>, mode: u32) {
        self.parents(path);
        self.entries
            .insert(path.to_string(), Node::File { data, mode });
    }

    pub fn symlink(&mut self, path: &str, target: &str) {
        self.parents(path);
        self.entries.insert(
            path.to_string(),
            Node::Symlink {
                target: target.to_string(),
            },
        );
    }

    pub fn char_dev(&mut self, path: &str, major: u32, minor: u32, mode: u32) {
        self.parents(path);
        self.entries
            .insert(path.to_string(), Node::CharDev { major, minor, mode });
    }

    pub fn contains(&self, path: &str) -> bool {
        self.entries.contains_key(path)
    }

    fn parents(&mut self, path: &str) {
        let mut end = 0;
        while let Some(slash) = path[end..].find('/') {
            end += slash;
            self.entries
                .entry(path[..end].to_string())
                .or_insert(Node::Dir { mode: 0o755 });
            end += 1;
        }
    }

    /// Writes the tree as a newc cpio archive: owner root, mtime 0, entries in path
    /// order, so equal trees give equal bytes.
    pub fn write_cpio(&self, out: &mut impl Write) -> io::Result<()> {
        let mut ino = 0;
        for (path, node) in &self.entries {
            ino += 1;
            let (mode, nlink, data, rdev): (u32, u32, &[u8], (u32, u32)) = match node {
                Node::Dir { mode } => (S_IFDIR | mode, 2, &[], (0, 0)),
                Node::File { data, mode } => (S_IFREG | mode, 1, data, (0, 0)),
                Node::Symlink { target } => (S_IFLNK | 0o777, 1, target.as_bytes(), (0, 0)),
                Node::CharDev { major, minor, mode } => (S_IFCHR | mode, 1, &[], (*major, *minor)),
            };
            write_newc(out, path, ino, mode, nlink, data, rdev)?;
        }
        write_newc(out, "TRAILER!!!", 0, 0, 1, &[], (0, 0))
    }

    /// Creates the tree under `root` (which must not exist yet). Device nodes are skipped.
    pub fn write_dir(&self, root: &Path) -> Result<()> {
        fs::create_dir(root).map_err(Error::io("creating rootfs directory", root))?;
        let mut dir_modes = Vec::new();
        for (rel, node) in &self.entries {
            let path = root.join(rel);
            match node {
                Node::Dir { mode } => {
                    fs::create_dir(&path).map_err(Error::io("creating directory", &path))?;
                    dir_modes.push((path, *mode));
                }
                Node::File { data, mode } => {
                    fs::write(&path, data).map_err(Error::io("writing file", &path))?;
                    fs::set_permissions(&path, fs::Permissions::from_mode(*mode))
                        .map_err(Error::io("setting file mode", &path))?;
                }
                Node::Symlink { target } => std::os::unix::fs::symlink(target, &path)
                    .map_err(Error::io("creating symlink", &path))?,
                Node::CharDev { .. } => {}
            }
        }
        // Modes last, so a read-only directory cannot block writing its children.
        for (path, mode) in dir_modes {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(Error::io("setting directory mode", &path))?;
        }
        Ok(())
    }

    /// sha256 (hex) of the tree as the rootfs directory holds it: device nodes are
    /// left out. One line per entry in path order, then hashed:
    /// `d <path>`, `f <mode in octal> <sha256 of content> <path>`, `l <path> <target>`.
    pub fn rootfs_digest(&self) -> String {
        let mut hasher = Sha256::new();
        for (path, node) in &self.entries {
            let line = match node {
                Node::Dir { .. } => format!("d {path}\n"),
                Node::File { data, mode } => {
                    format!("f {mode:o} {} {path}\n", hex::encode(Sha256::digest(data)))
                }
                Node::Symlink { target } => format!("l {path} {target}\n"),
                Node::CharDev { .. } => continue,
            };
            hasher.update(line.as_bytes());
        }
        hex::encode(hasher.finalize())
    }
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// One newc entry: the 110-byte ASCII header, the NUL-terminated name padded to 4
/// bytes, then the data padded to 4 bytes.
fn write_newc(
    out: &mut impl Write,
    name: &str,
    ino: u32,
    mode: u32,
    nlink: u32,
    data: &[u8],
    (rdev_major, rdev_minor): (u32, u32),
) -> io::Result<()> {
    let size = u32::try_from(data.len()).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{name} is over 4 GiB"))
    })?;
    let name_size = name.len() as u32 + 1;
    // magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor,
    // rdevmajor, rdevminor, namesize, check
    let fields = [
        ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev_major, rdev_minor, name_size, 0,
    ];
    let mut header = String::with_capacity(110);
    header.push_str("070701");
    for field in fields {
        header.push_str(&format!("{field:08x}"));
    }
    out.write_all(header.as_bytes())?;
    out.write_all(name.as_bytes())?;
    out.write_all(&[0])?;
    out.write_all(&[0; 3][..pad4(110 + name_size as usize)])?;
    out.write_all(data)?;
    out.write_all(&[0; 3][..pad4(data.len())])
}

fn pad4(len: usize) -> usize {
    (4 - len % 4) % 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_entries_have_exact_newc_layout() {
        let mut tree = Tree::default();
        tree.file("bin/x", b"hello".to_vec(), 0o755);
        tree.symlink("sbin/y", "/bin/x");
        tree.char_dev("dev/console", 5, 1, 0o600);
        let mut out = Vec::new();
        tree.write_cpio(&mut out).unwrap();

        let mut expected = Vec::new();
        let mut entry = |fields: [u32; 13], name: &str, data: &[u8]| {
            expected.extend_from_slice(b"070701");
            for f in fields {
                expected.extend_from_slice(format!("{f:08X}").to_lowercase().as_bytes());
            }
            expected.extend_from_slice(name.as_bytes());
            expected.push(0);
            while expected.len() % 4 != 0 {
                expected.push(0);
            }
            expected.extend_from_slice(data);
            while expected.len() % 4 != 0 {
                expected.push(0);
            }
        };
        entry([1, 0o40755, 0, 0, 2, 0, 0, 0, 0, 0, 0, 4, 0], "bin", b"");
        entry(
            [2, 0o100755, 0, 0, 1, 0, 5, 0, 0, 0, 0, 6, 0],
            "bin/x",
            b"hello",
        );
        entry([3, 0o40755, 0, 0, 2, 0, 0, 0, 0, 0, 0, 4, 0], "dev", b"");
        entry(
            [4, 0o20600, 0, 0, 1, 0, 0, 0, 0, 5, 1, 12, 0],
            "dev/console",
            b"",
        );
        entry([5, 0o40755, 0, 0, 2, 0, 0, 0, 0, 0, 0, 5, 0], "sbin", b"");
        entry(
            [6, 0o120777, 0, 0, 1, 0, 6, 0, 0, 0, 0, 7, 0],
            "sbin/y",
            b"/bin/x",
        );
        entry([0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 11, 0], "TRAILER!!!", b"");
        assert_eq!(out.len() % 4, 0);
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected)
        );
    }

    #[test]
    fn rootfs_digest_changes_with_content_mode_and_links_but_not_devices() {
        let base = || {
            let mut tree = Tree::default();
            tree.file("init", b"elf".to_vec(), 0o755);
            tree.symlink("bin/sh", "/bin/busybox");
            tree.dir("dev", 0o755);
            tree
        };
        let digest = base().rootfs_digest();
        let mut with_dev = base();
        with_dev.char_dev("dev/console", 5, 1, 0o600);
        assert_eq!(with_dev.rootfs_digest(), digest);
        let mut content = base();
        content.file("init", b"elf2".to_vec(), 0o755);
        let mut mode = base();
        mode.file("init", b"elf".to_vec(), 0o644);
        let mut link = base();
        link.symlink("bin/sh", "/bin/dash");
        for changed in [content, mode, link] {
            assert_ne!(changed.rootfs_digest(), digest);
        }
    }

    #[test]
    fn write_dir_materialises_files_links_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        let mut tree = Tree::default();
        tree.file("usr/bin/tool", b"#!".to_vec(), 0o750);
        tree.symlink("bin/tool", "/usr/bin/tool");
        tree.dir("tmp", 0o1777);
        tree.char_dev("dev/console", 5, 1, 0o600);
        tree.write_dir(&root).unwrap();
        let meta = fs::metadata(root.join("usr/bin/tool")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o750);
        assert_eq!(
            fs::read_link(root.join("bin/tool")).unwrap(),
            Path::new("/usr/bin/tool")
        );
        let tmp = fs::metadata(root.join("tmp")).unwrap();
        assert_eq!(tmp.permissions().mode() & 0o7777, 0o1777);
        assert!(root.join("dev").is_dir() && !root.join("dev/console").exists());
    }
}
