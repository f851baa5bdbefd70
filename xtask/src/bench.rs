//! `cargo xtask bench <name>`: one subcommand per benchmark. Add a variant to
//! [`Bench`] and an arm to [`run`]; any other name is refused with the known list.

use clap::Subcommand;

use crate::{Error, Result};

#[derive(Subcommand)]
pub enum Bench {
    /// Any name that is not a known benchmark.
    #[command(external_subcommand)]
    Unknown(Vec<String>),
}

pub fn run(which: Bench) -> Result<()> {
    match which {
        Bench::Unknown(args) => Err(Error::UnknownBenchmark {
            name: args.first().cloned().unwrap_or_default(),
            known: known().join(", "),
        }),
    }
}

/// Names of the benchmarks [`Bench`] defines, or `(none yet)`.
pub fn known() -> Vec<String> {
    let names: Vec<String> = Bench::augment_subcommands(clap::Command::new("bench"))
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .filter(|name| name != "help")
        .collect();
    if names.is_empty() {
        vec!["(none yet)".to_string()]
    } else {
        names
    }
}
