//! `cargo xtask test`: the gate `.ci/run` runs. The system packages the tests need (checked,
//! not installed: `cargo xtask deps` does that), format, lints, every binary and example
//! (tests spawn the prebuilt `target/debug/{silkd,sandboxd,sbx}` and examples and never
//! build them), the guest images (sandboxd's qemu tests boot `target/images/base`; its
//! `templates` and `qemu_templates` tests use `target/images/default`), then every test;
//! stops at the first step that fails and names it.

use crate::{deps, image, tool, workspace_root, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Extra arguments for `cargo test --workspace` (e.g. a test name filter).
    #[arg(last = true)]
    pub cargo_test_args: Vec<String>,
}

/// One step of the gate: a cargo command, or work done in-process.
enum Step<'a> {
    Cargo(&'a [&'a str]),
    /// bwrap, file, ps and QEMU 10: first, so a host without them hears it in a second
    /// and in one line, not after the build as a wall of failing tests.
    Packages,
    /// A guest image: `base`, or a template (`default`, with its root disk).
    Image(&'a str),
}

pub fn run(args: &Args) -> Result<()> {
    let test: Vec<&str> = ["test", "--workspace"]
        .into_iter()
        .chain(args.cargo_test_args.iter().map(String::as_str))
        .collect();
    let steps: [(&'static str, Step); 7] = [
        ("system packages", Step::Packages),
        ("fmt", Step::Cargo(&["fmt", "--all", "--check"])),
        (
            "clippy",
            Step::Cargo(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]),
        ),
        (
            "build",
            Step::Cargo(&["build", "--workspace", "--bins", "--examples"]),
        ),
        // Cached package downloads and an up-to-date static silkd make this a few seconds.
        ("image", Step::Image("base")),
        // Cached by its spec and resolved package versions: a rebuild only when they (or
        // silkd, or the boot stage) changed.
        ("image --template default", Step::Image("default")),
        ("test", Step::Cargo(&test)),
    ];
    let root = workspace_root();
    for (i, (step, what)) in steps.iter().enumerate() {
        eprintln!("xtask test: [{}/{}] {step}", i + 1, steps.len());
        match what {
            Step::Cargo(cargo_args) => {
                tool::stream(step, tool::cargo().args(*cargo_args).current_dir(&root))?
            }
            Step::Packages => deps::check()?,
            Step::Image(template) => image::run(&image::Args {
                template: (*template).into(),
                ..image::Args::default()
            })?,
        }
    }
    eprintln!("xtask test: all {} steps passed", steps.len());
    Ok(())
}
