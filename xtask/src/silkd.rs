//! `cargo xtask build-silkd`: silkd as a static release binary, the guest's `/init`.
//! It builds in its own target directory (`target/static`) so the static flags never
//! invalidate the normal build cache. `relocation-model=static` makes it a plain
//! static executable rather than static-pie, which `file` reports as "statically linked".

use std::path::PathBuf;
use std::process::Command;

use crate::{tool, workspace_root, Error, Result};

/// The target triple the static silkd is built for (the guest is x86_64 Linux).
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Builds the static silkd, checks with `file` that it is statically linked, and
/// returns its path.
pub fn build_static() -> Result<PathBuf> {
    tool::require(&["file"])?;
    let target_dir = workspace_root().join("target/static");
    tool::stream(
        "build static silkd",
        tool::cargo()
            .env(
                "RUSTFLAGS",
                "-C target-feature=+crt-static -C relocation-model=static",
            )
            .args(["build", "--release", "-p", "silkd", "--target", TARGET])
            .arg("--target-dir")
            .arg(&target_dir)
            .current_dir(workspace_root()),
    )?;
    let binary = target_dir.join(TARGET).join("release/silkd");
    let described = tool::output(Command::new("file").arg("-b").arg(&binary))?;
    if !described.contains("statically linked") {
        return Err(Error::Invalid(format!(
            "{} is not statically linked; `file` says: {}",
            binary.display(),
            described.trim()
        )));
    }
    Ok(binary)
}
