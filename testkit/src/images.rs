//! Built template images under `target/images/` for tests that need a real userland.

use std::path::{Path, PathBuf};

/// `target/images/NAME`, which `cargo xtask image --template NAME` builds (and `cargo
/// xtask test` builds before the tests). Panics naming that command when it is missing.
pub fn template_image(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/images")
        .join(name);
    match dir.canonicalize() {
        Ok(d) if d.join("manifest.json").is_file() && d.join("rootfs").is_dir() => d,
        _ => panic!(
            "template image {name:?} missing at target/images/{name}: run \
             `cargo xtask image --template {name}` (cargo xtask test does it before the tests)"
        ),
    }
}
