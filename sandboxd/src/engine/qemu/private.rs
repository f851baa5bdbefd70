//! Files only sandboxd can open: directories created exclusively with mode 0700 (or, when
//! one already exists, accepted only if it is ours and 0700), files created `O_EXCL`, and
//! the checks a file must pass before a VM may map or load it. Nothing here follows a
//! symlink. QEMU never opens these by path: sandboxd opens them and QEMU inherits the fd.

use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{Error, Result};

/// A file mode's permission and special bits.
const MODE_BITS: u32 = 0o7777;

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Makes sure `dir` can hold sandboxd's private directories: created (0700) when absent;
/// when present, a real directory owned by root or by sandboxd, and when others may write
/// to it (`/dev/shm`, `/tmp`) sticky, so nobody can rename or delete what we put there.
pub fn check_parent(dir: &Path) -> Result<()> {
    if let Err(e) = DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        return Err(Error::Io {
            context: format!("creating {}", dir.display()),
            source: e,
        });
    }
    let meta =
        std::fs::symlink_metadata(dir).map_err(Error::io(format!("stat {}", dir.display())))?;
    let mode = meta.mode() & MODE_BITS;
    if !meta.is_dir() || (meta.uid() != 0 && meta.uid() != euid()) {
        return Err(Error::Config(format!(
            "refusing {}: not a directory owned by root or by sandboxd (uid {}, mode {mode:o})",
            dir.display(),
            meta.uid()
        )));
    }
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(Error::Config(format!(
            "refusing {}: others may write to it and it is not sticky (mode {mode:o})",
            dir.display()
        )));
    }
    Ok(())
}

/// Creates `dir` with mode 0700, failing if the name exists, unless what exists is a
/// directory of sandboxd's (not a symlink) that nobody else could write to: one an
/// earlier run (or version) left is reused, tightened to 0700. Anything else (someone
/// else's, a symlink, one others could have written into) is refused.
pub fn private_dir(dir: &Path) -> Result<()> {
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(Error::Io {
                context: format!("creating {}", dir.display()),
                source: e,
            })
        }
    }
    let meta =
        std::fs::symlink_metadata(dir).map_err(Error::io(format!("stat {}", dir.display())))?;
    let mode = meta.mode() & MODE_BITS;
    if !meta.is_dir() || meta.uid() != euid() || mode & 0o022 != 0 {
        return Err(Error::Config(format!(
            "refusing {}: it must be a directory of uid {} that only it can write to, found \
             uid {} mode {mode:o}{}",
            dir.display(),
            euid(),
            meta.uid(),
            if meta.is_symlink() {
                " (a symlink)"
            } else {
                ""
            }
        )));
    }
    if mode != 0o700 {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(Error::io(format!("chmod 700 {}", dir.display())))?;
    }
    Ok(())
}

/// True when `dir` is a directory (not a symlink) of sandboxd's with mode 0700: one this
/// engine made, that nobody else could have written into.
pub fn is_private_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == euid() && m.mode() & MODE_BITS == 0o700)
}

/// Creates a new directory with mode 0700; an existing name is an error (never reused).
pub fn fresh_dir(dir: &Path) -> Result<()> {
    DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(Error::io(format!("creating {}", dir.display())))
}

/// Creates a new file, read-write, `mode` (0600 by default use), failing if the name
/// exists (a planted file or symlink is never opened).
pub fn create_file(path: &Path, mode: u32) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(Error::io(format!("creating {}", path.display())))
}

/// Opens `path` read-only for a VM to map or load, only if it is a regular file (not a
/// symlink) owned by sandboxd with exactly `mode`, and when `gid` is given, that group:
/// a file anyone else could have planted or altered is refused.
pub fn open_verified(path: &Path, mode: u32, gid: Option<u32>) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(Error::io(format!("opening {}", path.display())))?;
    let meta = file
        .metadata()
        .map_err(Error::io(format!("stat {}", path.display())))?;
    let found = meta.mode() & MODE_BITS;
    let gid_ok = gid.is_none_or(|g| g == meta.gid());
    if !meta.is_file() || meta.uid() != euid() || found != mode || !gid_ok {
        return Err(Error::Engine(format!(
            "refusing {}: expected a file of uid {} mode {mode:o}{}, found uid {} gid {} mode {found:o}",
            path.display(),
            euid(),
            gid.map(|g| format!(" gid {g}")).unwrap_or_default(),
            meta.uid(),
            meta.gid(),
        )));
    }
    Ok(file)
}

/// True when `path` would pass [`open_verified`].
pub fn is_verified(path: &Path, mode: u32, gid: Option<u32>) -> bool {
    open_verified(path, mode, gid).is_ok()
}

/// Gives a file to `uid:gid` (only when sandboxd is root; as any other user the file
/// stays sandboxd's, which is also the VM's user) and sets its mode.
pub fn hand_over(file: &File, path: &Path, owner: Option<(u32, u32)>, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(file, Some(uid), Some(gid))
            .map_err(Error::io(format!("chown {}", path.display())))?;
    }
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(Error::io(format!("chmod {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn private_dir_is_exclusive_or_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("p");
        private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        // Ours and 0700: accepted again (a restart).
        private_dir(&d).unwrap();
        // Readable by others (an older layout): tightened.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        // Writable by others: something may have been planted in it; refused.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(private_dir(&d).is_err());
        // A symlink planted at the name: refused, even to a good directory.
        let good = tmp.path().join("good");
        private_dir(&good).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(private_dir(&link).is_err());
        assert!(fresh_dir(&good).is_err(), "fresh_dir must not reuse a name");
        assert!(is_private_dir(&good));
        assert!(
            !is_private_dir(&link),
            "a symlink to a private dir is not one"
        );
        assert!(!is_private_dir(&d), "writable by others");
        assert!(!is_private_dir(&tmp.path().join("none")));
    }

    #[test]
    fn files_are_created_exclusively_and_verified_before_use() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        create_file(&f, 0o600).unwrap();
        assert!(
            create_file(&f, 0o600).is_err(),
            "an existing name is refused"
        );
        assert!(open_verified(&f, 0o600, None).is_ok());
        assert!(open_verified(&f, 0o400, None).is_err(), "wrong mode");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(
            open_verified(&f, 0o600, None).is_err(),
            "writable by others"
        );
        let link = tmp.path().join("l");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(create_file(&link, 0o600).is_err());
        assert!(
            open_verified(&link, 0o666, None).is_err(),
            "symlinks are not followed"
        );
        let dir = tmp.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        assert!(
            open_verified(&dir, 0o755, None).is_err(),
            "not a regular file"
        );
    }

    #[test]
    fn parents_writable_by_others_must_be_sticky() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_parent(&open).is_err());
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_parent(&open).unwrap();
        let fresh = tmp.path().join("a/b");
        check_parent(&fresh).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().mode() & 0o777, 0o700);
    }
}
