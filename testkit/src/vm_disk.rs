//! What the template-disk VM tests need: a built template image (`target/images/NAME`,
//! with its `rootfs.erofs`), the digest of a file, files found by name (a golden's
//! state), and a count of what a qemu-engine daemon leaves on the host.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::procs::procs_with;

/// `target/images/NAME` with its read-only root disk; fails naming the command that
/// builds it (`cargo xtask test` builds `default` before the tests).
pub fn template_image(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/images")
        .join(name);
    assert!(
        dir.join("rootfs.erofs").is_file() && dir.join("manifest.json").is_file(),
        "template image missing at target/images/{name} (no rootfs.erofs or manifest.json): \
         run `cargo xtask image --template {name}` (as root; cargo xtask test does it)"
    );
    dir.canonicalize().unwrap()
}

/// Hex SHA-256 of a file's content, streamed (template disks are hundreds of MB).
pub fn sha256_file(path: &Path) -> String {
    let mut f =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex::encode(h.finalize())
}

/// What a qemu-engine daemon with `data_dir` leaves: QEMU processes (their command lines
/// name the data dir) and per-VM run dirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QemuLeftovers {
    /// QEMU processes.
    pub qemus: usize,
    /// `data_dir/qemu/run/*`.
    pub run_dirs: usize,
}

/// Counts them.
pub fn qemu_leftovers(data_dir: &Path) -> QemuLeftovers {
    QemuLeftovers {
        qemus: procs_with(&data_dir.to_string_lossy()).len(),
        run_dirs: std::fs::read_dir(data_dir.join("qemu/run")).map_or(0, |d| d.flatten().count()),
    }
}

/// Every file named `name` below `dir` (e.g. a golden's `state.mig` in a data dir).
pub fn files_named(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => pending.push(path),
                Ok(t) if t.is_file() && entry.file_name() == name => found.push(path),
                _ => {}
            }
        }
    }
    found
}
