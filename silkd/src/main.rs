//! silkd entry point: parse flags, do PID-1 duties when we are init, then serve.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let mut args = silkd::Args::parse();
    silkd::init_logging();
    if std::process::id() == 1 {
        if let Some(cgroup) = silkd::init::pid1_duties() {
            args.cgroup.get_or_insert(cgroup);
        }
    }
    match silkd::serve_blocking(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("silkd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
