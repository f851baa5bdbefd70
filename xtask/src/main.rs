//! `cargo xtask`: parses the command line and hands off to one task module.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xtask::{bench, deps, dist, image, silkd, test, up};

#[derive(Parser)]
#[command(
    about = "Project automation: system packages, test gate, static silkd, guest image, benchmarks, up"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the system packages the tests need (bubblewrap, file, procps, mmdebstrap,
    /// erofs-utils, QEMU 10), as root; otherwise print the apt commands. Fails unless all
    /// are there afterwards.
    Deps,
    /// The gate CI runs: system packages (checked), fmt, clippy, every binary and example,
    /// the guest image, then every test.
    Test(test::Args),
    /// Build silkd as a static release binary and print its path.
    BuildSilkd,
    /// Build a template's image (kernel, initramfs, rootfs, manifest): `base` by default,
    /// `--template NAME` from templates/NAME.toml, or `--from-oci PATH` from an OCI image.
    Image(image::Args),
    /// Set up and start a node: system packages (as root), release build, guest image,
    /// config under target/up/, sbx configured and on PATH; then sandboxd in the foreground.
    Up,
    /// The operator's packages in target/dist/: a Debian package and a tarball (release
    /// sandboxd and sbx, static silkd, the base and default images, the systemd unit), as root.
    Dist,
    /// Run benchmark suites (all when none is named): `cargo xtask bench [SUITE...]
    /// [--quick] [--json FILE]`; each prints its rows next to a floor measured in the same run.
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Deps => deps::run(),
        Task::Test(args) => test::run(&args),
        Task::BuildSilkd => silkd::build_static().map(|path| println!("{}", path.display())),
        Task::Image(args) => image::run(&args),
        Task::Bench(args) => bench::run(&args),
        Task::Up => up::run(),
        Task::Dist => dist::run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {}", xtask::error_chain(&err));
            ExitCode::FAILURE
        }
    }
}
