//! Local directory trees for the file-transfer tests: one built with many small files,
//! nested directories, modes and symlinks (relative, absolute, dangling), and an exact
//! comparison of two trees (types, permission bits, contents, link targets, file mtimes).

use std::collections::BTreeMap;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use crate::silkd_files::random_bytes;

/// What one path below a tree's root is, as the comparison sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory and its permission bits.
    Dir(u32),
    /// A file: permission bits, mtime (seconds), contents.
    File(u32, i64, Vec<u8>),
    /// A symlink and its target.
    Link(String),
}

/// Builds under `root` (which must exist) `files` small files (0..2 KiB, random) spread
/// over nested directories (`d{i}/e{j}/`), with modes 0600, 0640, 0644 and 0755, some
/// directories 0700 or 0750, an empty directory, and symlinks: relative, absolute
/// (`python -> /usr/bin/python3`, as in a venv) and dangling.
pub fn build(root: &Path, files: usize) {
    let modes = [0o600, 0o640, 0o644, 0o755];
    for i in 0..files {
        let dir = root.join(format!("d{}/e{}", i % 10, (i / 10) % 10));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join(format!("f{i}"));
        std::fs::write(&f, random_bytes(i * 37 % 2048, i as u64)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(modes[i % 4])).unwrap();
    }
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::create_dir_all(root.join("venv/bin")).unwrap();
    symlink("/usr/bin/python3", root.join("venv/bin/python")).unwrap();
    symlink("python", root.join("venv/bin/python3")).unwrap();
    symlink("../d0/e0/f0", root.join("venv/rel")).unwrap();
    symlink("nowhere/at/all", root.join("dangling")).unwrap();
    for (dir, mode) in [("d1", 0o700), ("d2/e3", 0o750)] {
        let d = root.join(dir);
        if d.exists() {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

/// Every path below `root` (relative) and what it is; links are not followed.
pub fn snapshot(root: &Path) -> BTreeMap<String, Node> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let m = std::fs::symlink_metadata(&path).unwrap();
            let node = if m.file_type().is_symlink() {
                Node::Link(
                    std::fs::read_link(&path)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                )
            } else if m.is_dir() {
                todo.push(path.clone());
                Node::Dir(m.mode() & 0o7777)
            } else {
                Node::File(m.mode() & 0o7777, m.mtime(), std::fs::read(&path).unwrap())
            };
            out.insert(rel, node);
        }
    }
    out
}

/// Panics naming the first difference between the trees under `a` and `b`.
pub fn assert_same(a: &Path, b: &Path) {
    let (sa, sb) = (snapshot(a), snapshot(b));
    for (path, node) in &sa {
        match sb.get(path) {
            None => panic!("{path} is missing from {}", b.display()),
            Some(other) if other != node => {
                panic!("{path} differs: {} vs {}", describe(node), describe(other))
            }
            Some(_) => {}
        }
    }
    let extra: Vec<_> = sb.keys().filter(|k| !sa.contains_key(*k)).collect();
    assert!(extra.is_empty(), "{} has more: {extra:?}", b.display());
}

fn describe(n: &Node) -> String {
    match n {
        Node::Dir(m) => format!("dir {m:o}"),
        Node::File(m, t, c) => format!("file {m:o} mtime {t} {} B", c.len()),
        Node::Link(t) => format!("link -> {t}"),
    }
}
