//! `cargo xtask test`: the gate `.ci/run` runs. Format, lints, the debug silkd binary
//! (other crates' tests spawn `target/debug/silkd`), then every test; stops at the
//! first step that fails and names it.

use crate::{tool, workspace_root, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Extra arguments for `cargo test --workspace` (e.g. a test name filter).
    #[arg(last = true)]
    pub cargo_test_args: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    let test: Vec<&str> = ["test", "--workspace"]
        .into_iter()
        .chain(args.cargo_test_args.iter().map(String::as_str))
        .collect();
    let steps: [(&'static str, &[&str]); 4] = [
        ("fmt", &["fmt", "--all", "--check"]),
        (
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ),
        ("build silkd", &["build", "-p", "silkd"]),
        ("test", &test),
    ];
    let root = workspace_root();
    for (i, (step, cargo_args)) in steps.iter().enumerate() {
        eprintln!("xtask test: [{}/{}] {step}", i + 1, steps.len());
        tool::stream(step, tool::cargo().args(*cargo_args).current_dir(&root))?;
    }
    eprintln!("xtask test: all {} steps passed", steps.len());
    Ok(())
}
