//! What the VM tests need from the host: `qemu-system-x86_64` and the guest image in
//! `target/images/base`. Without either they fail with one message naming the missing
//! piece and how to get it; they never pass silently.

use std::path::{Path, PathBuf};

/// Checks for QEMU and the guest image; returns the image's directory.
pub fn require() -> PathBuf {
    let qemu = std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        qemu,
        "qemu-system-x86_64 is not installed: run .ci/run, or add bookworm-backports to apt's \
         sources and `apt-get install -t bookworm-backports qemu-system-x86`"
    );
    guest_image()
}

/// `target/images/base` (in the workspace, whatever `CARGO_TARGET_DIR` says: that is
/// where `cargo xtask image` writes it).
pub fn guest_image() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/images/base")
        .canonicalize()
        .unwrap_or_else(|_| {
            panic!(
                "guest image missing at target/images/base: run `cargo xtask image` \
                 (cargo xtask test does it before the tests)"
            )
        })
}
