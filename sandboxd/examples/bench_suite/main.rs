//! `cargo xtask bench exec|throughput|claim|tti` run this example: `bench_suite SUITE
//! [--quick] [--engine process|qemu]`. Each suite starts the real sandboxd binary beside
//! it (release for a full run, debug for `--quick`), measures, and prints one table
//! ([`stats::Table`]) whose rows sit next to a floor measured on the host in the same run.

mod claim;
mod exec;
mod node;
mod stats;
mod throughput;
mod tti;

use node::{BoxError, Engine};

fn usage() -> String {
    "usage: bench_suite exec|throughput|claim|tti [--quick] [--engine process|qemu]".into()
}

async fn bench(args: Vec<String>) -> Result<(), BoxError> {
    let suite = args.first().ok_or_else(usage)?.clone();
    let quick = args.iter().any(|a| a == "--quick");
    let engines = match args.iter().position(|a| a == "--engine") {
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some("process") => vec![Engine::Process],
            Some("qemu") => vec![Engine::Qemu],
            _ => return Err(usage().into()),
        },
        // tti's hundred warm guests are process sandboxes only (tti.rs says why).
        None if suite == "tti" => vec![Engine::Process],
        None => vec![Engine::Process, Engine::Qemu],
    };
    if !nix::unistd::geteuid().is_root() {
        return Err("run as root: the process engine's sandboxes need their identities".into());
    }
    for engine in engines {
        match suite.as_str() {
            "exec" => exec::run(engine, quick).await?,
            "throughput" => throughput::run(engine, quick).await?,
            "claim" => claim::run(engine, quick).await?,
            "tti" => tti::run(engine, quick).await?,
            _ => return Err(usage().into()),
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench(std::env::args().skip(1).collect())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_suite: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
