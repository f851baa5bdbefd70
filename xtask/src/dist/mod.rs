//! `cargo xtask dist`: the operator's packages in `target/dist/`: a Debian package and a
//! tarball of the same tree (release `sandboxd` and `sbx`, the static `silkd`, the `base`
//! and `default` guest images, the systemd unit, the config template the postinst fills
//! in). It builds what it ships (binaries, images: cache hits when nothing changed) and
//! then hands a [`package::Inputs`] to [`package::build`]. docs/deploy.md says how the
//! result installs.
//!
//! Why `dpkg-deb` on a staged tree rather than cargo-deb: the package holds more than
//! cargo builds (two guest images, a static binary from another target directory,
//! generated maintainer scripts), dpkg-deb is already on every Debian host this project
//! builds images on, and it needs no crate or `cargo install`.

pub mod package;

use std::path::PathBuf;
use std::time::Instant;

use crate::{image, silkd, tool, workspace_root, Result};
pub use package::{Inputs, Outputs};

/// The guest images every package carries, by template name.
pub const IMAGES: [&str; 2] = ["base", "default"];

/// One progress line on stderr, with the time since `dist` started.
pub struct Progress(Instant);

impl Progress {
    pub fn start() -> Progress {
        Progress(Instant::now())
    }

    pub fn step(&self, what: &str) {
        eprintln!("dist: [{:>6.1}s] {what}", self.0.elapsed().as_secs_f64());
    }
}

/// Cargo's target directory for this build (`CARGO_TARGET_DIR` when set).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

pub fn run() -> Result<()> {
    let progress = Progress::start();
    let root = workspace_root();
    progress.step("release sandboxd and sbx");
    tool::stream(
        "build",
        tool::cargo()
            .args(["build", "--release", "--bin", "sandboxd", "--bin", "sbx"])
            .current_dir(&root),
    )?;
    progress.step("static silkd");
    let silkd = silkd::build_static()?;
    let mut images = Vec::new();
    for name in IMAGES {
        progress.step(&format!("guest image `{name}`"));
        let args = image::Args {
            template: name.to_string(),
            ..image::Args::default()
        };
        image::run(&args)?;
        images.push((name.to_string(), args.out()));
    }
    let release = target_dir().join("release");
    let outputs = package::build(
        &Inputs {
            sandboxd: release.join("sandboxd"),
            sbx: release.join("sbx"),
            silkd,
            images,
            version: env!("CARGO_PKG_VERSION").to_string(),
        },
        &root.join("target/dist"),
        &progress,
    )?;
    println!("{}", outputs.deb.display());
    println!("{}", outputs.tarball.display());
    Ok(())
}
