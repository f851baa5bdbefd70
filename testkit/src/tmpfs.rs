//! A small tmpfs of a test's own (a `data_dir` or `memory_dir` that can run out of
//! space), and a filler that takes every free byte of it: disk-full faults without
//! touching a real disk. Needs root (mount); unmounted (lazily) when dropped.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A mounted tmpfs; unmounted when dropped.
pub struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `mib` MiB on `path` (created), mode 0700 so sandboxd takes it as
    /// its own data directory.
    pub fn mount(path: &Path, mib: u64) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={mib}m,mode=0700"))
            .arg("test-tmpfs")
            .arg(path)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "mount tmpfs on {} (root?)",
            path.display()
        );
        Tmpfs {
            path: path.to_path_buf(),
        }
    }

    /// Fills every free byte with `name` (a file in the tmpfs's root); returns its path.
    pub fn fill(&self, name: &str) -> PathBuf {
        let filler = self.path.join(name);
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0xa5u8; 64 * 1024];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", filler.display()),
            }
        }
        // A few bytes may still fit in the last page; take them one by one.
        while f.write(&[0]).is_ok_and(|n| n == 1) {}
        filler
    }

    /// Free bytes left, as statvfs says.
    pub fn free_bytes(&self) -> u64 {
        let s = nix::sys::statvfs::statvfs(&self.path).unwrap();
        s.blocks_available() * s.fragment_size()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}
