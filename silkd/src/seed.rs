//! Seeding writable directories from read-only trees at start (`--seed SRC:DST`): the
//! process engine gives each sandbox a fresh, size-capped tmpfs `/home` and binds the
//! template's own `/home` read-only elsewhere; silkd copies it in, as the sandbox's user,
//! so the template's dotfiles are there and owned by whoever commands run as.

use std::path::{Path, PathBuf};

/// Most entries one seed copies; a template home is a handful of dotfiles, and this
/// bounds how long a start can take.
const MAX_ENTRIES: usize = 10_000;
/// Deepest directory followed.
const MAX_DEPTH: usize = 32;

/// Parses `SRC:DST` (both absolute).
pub fn parse_flag(s: &str) -> Result<(PathBuf, PathBuf), String> {
    match s.split_once(':') {
        Some((src, dst)) if src.starts_with('/') && dst.starts_with('/') => {
            Ok((PathBuf::from(src), PathBuf::from(dst)))
        }
        _ => Err(format!("--seed wants SRC:DST, both absolute, got {s:?}")),
    }
}

/// Copies `src`'s contents into `dst` (created if absent), keeping what exists there.
/// What cannot be read or written is skipped with a warning: a missing dotfile must not
/// stop the sandbox. Returns how many entries were copied.
pub fn seed(src: &Path, dst: &Path) -> usize {
    let mut copied = 0;
    if let Err(e) = std::fs::create_dir_all(dst) {
        tracing::warn!(dst = %dst.display(), "seed: {e}");
        return 0;
    }
    copy_dir(src, dst, 0, &mut copied);
    copied
}

fn copy_dir(src: &Path, dst: &Path, depth: usize, copied: &mut usize) {
    if depth > MAX_DEPTH {
        tracing::warn!(src = %src.display(), "seed: deeper than {MAX_DEPTH}, skipped");
        return;
    }
    let entries = match std::fs::read_dir(src) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(src = %src.display(), "seed: {e}");
            return;
        }
    };
    for entry in entries.flatten() {
        if *copied >= MAX_ENTRIES {
            tracing::warn!(src = %src.display(), "seed: stopped at {MAX_ENTRIES} entries");
            return;
        }
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let done = if kind.is_dir() {
            let made = match std::fs::create_dir(&to) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
                _ => Ok(()),
            };
            if made.is_ok() {
                if let Ok(m) = entry.metadata() {
                    let _ = std::fs::set_permissions(&to, m.permissions());
                }
                copy_dir(&from, &to, depth + 1, copied);
            }
            made
        } else if to.symlink_metadata().is_ok() {
            continue;
        } else if kind.is_symlink() {
            std::fs::read_link(&from).and_then(|t| std::os::unix::fs::symlink(t, &to))
        } else if kind.is_file() {
            std::fs::copy(&from, &to).map(drop)
        } else {
            continue;
        };
        match done {
            Ok(()) => *copied += 1,
            Err(e) => tracing::warn!(path = %from.display(), "seed: {e}"),
        }
    }
}

/// Makes `uid:gid` the owner of `dir` and everything below it (links themselves, never
/// what they point to), within the same bounds as seeding. Failures are warnings, as for
/// seeding. Returns how many entries changed owner.
pub fn hand_over(dir: &Path, uid: u32, gid: u32) -> usize {
    let mut done = 0;
    chown_tree(dir, uid, gid, 0, &mut done);
    done
}

fn chown_tree(path: &Path, uid: u32, gid: u32, depth: usize, done: &mut usize) {
    if depth > MAX_DEPTH || *done >= MAX_ENTRIES {
        tracing::warn!(path = %path.display(), "hand over: past the bounds, stopped");
        return;
    }
    if let Err(e) = std::os::unix::fs::lchown(path, Some(uid), Some(gid)) {
        tracing::warn!(path = %path.display(), "hand over: {e}");
        return;
    }
    *done += 1;
    let is_dir = path.symlink_metadata().is_ok_and(|m| m.is_dir());
    if let (true, Ok(entries)) = (is_dir, std::fs::read_dir(path)) {
        for entry in entries.flatten() {
            chown_tree(&entry.path(), uid, gid, depth + 1, done);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn copies_a_tree_keeping_modes_links_and_what_exists() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let s = src.path();
        std::fs::create_dir_all(s.join("user/.cache")).unwrap();
        std::fs::write(s.join("user/.bashrc"), "echo hi").unwrap();
        std::fs::set_permissions(s.join("user/.bashrc"), PermissionsExt::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink(".bashrc", s.join("user/link")).unwrap();
        std::fs::create_dir_all(dst.path().join("user")).unwrap();
        std::fs::write(dst.path().join("user/link"), "mine").unwrap();
        assert_eq!(seed(s, dst.path()), 3);
        let d = dst.path().join("user");
        assert_eq!(
            std::fs::read_to_string(d.join(".bashrc")).unwrap(),
            "echo hi"
        );
        let mode = std::fs::metadata(d.join(".bashrc"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        assert!(d.join(".cache").is_dir());
        assert_eq!(std::fs::read_to_string(d.join("link")).unwrap(), "mine");
    }

    /// As the test's own user (root or not), handing to one's own ids changes nothing
    /// but still walks the tree; links are not followed out of it.
    #[test]
    fn hand_over_walks_the_tree_without_following_links() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let d = dir.path().join("home");
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.join("out")).unwrap();
        std::fs::write(outside.path().join("g"), "y").unwrap();
        let me = std::fs::metadata(&d).unwrap();
        // home, a, a/b, a/b/f, out (the link itself); never outside/g.
        assert_eq!(hand_over(&d, me.uid(), me.gid()), 5);
        assert_eq!(
            hand_over(Path::new("/nonexistent/home"), me.uid(), me.gid()),
            0
        );
    }

    #[test]
    fn a_missing_source_and_bad_flags_do_not_panic() {
        let dst = tempfile::tempdir().unwrap();
        assert_eq!(seed(Path::new("/nonexistent/seed"), dst.path()), 0);
        for bad in ["", "a:b", "/a", "/a:b", "a:/b"] {
            assert!(parse_flag(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_flag("/a:/b").unwrap(),
            (PathBuf::from("/a"), PathBuf::from("/b"))
        );
    }
}
