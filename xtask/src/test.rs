//! `cargo xtask test`: the gate `.ci/run` runs. Format, lints, the debug silkd binary
//! (other crates' tests spawn `target/debug/silkd`), the guest image (sandboxd's qemu
//! tests boot `target/images/base`), then every test; stops at the first step that fails
//! and names it.

use crate::{image, tool, workspace_root, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Extra arguments for `cargo test --workspace` (e.g. a test name filter).
    #[arg(last = true)]
    pub cargo_test_args: Vec<String>,
}

/// One step of the gate: a cargo command, or the image build done in-process.
enum Step<'a> {
    Cargo(&'a [&'a str]),
    Image,
}

pub fn run(args: &Args) -> Result<()> {
    let test: Vec<&str> = ["test", "--workspace"]
        .into_iter()
        .chain(args.cargo_test_args.iter().map(String::as_str))
        .collect();
    let steps: [(&'static str, Step); 5] = [
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
        ("build silkd", Step::Cargo(&["build", "-p", "silkd"])),
        // Cached package downloads and an up-to-date static silkd make this a few seconds.
        ("image", Step::Image),
        ("test", Step::Cargo(&test)),
    ];
    let root = workspace_root();
    for (i, (step, what)) in steps.iter().enumerate() {
        eprintln!("xtask test: [{}/{}] {step}", i + 1, steps.len());
        match what {
            Step::Cargo(cargo_args) => {
                tool::stream(step, tool::cargo().args(*cargo_args).current_dir(&root))?
            }
            Step::Image => image::run(&image::Args::default())?,
        }
    }
    eprintln!("xtask test: all {} steps passed", steps.len());
    Ok(())
}
