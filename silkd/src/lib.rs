//! silkd, the guest agent: listens for sandboxd, runs commands, tracks and kills them.
//!
//! # Layout
//! - [`listen`]: where connections come from (`unix:PATH`, `vsock:PORT`, `serial:NAME`).
//! - [`conn`]: one connection = RPCs back to back (the verb dispatch and the exec loop).
//! - [`proc`]: the process table, spawning, the single reaper, kill.
//! - [`init`]: PID-1 duties, only when silkd is the VM's init.
//! - [`error`]: the crate's error type.
//!
//! silkd knows nothing of HTTP, pools or tokens.

pub mod conn;
pub mod error;
pub mod init;
pub mod listen;
pub mod proc;

use std::sync::Arc;

pub use error::{Error, Result};
use listen::ListenAddr;

/// Command-line flags.
#[derive(Debug, clap::Parser)]
#[command(name = "silkd", version, about = "Guest agent for sandboxd")]
pub struct Args {
    /// Where to listen: `unix:/path/sock`, `vsock:PORT` or `serial:NAME`. Repeatable.
    #[arg(long = "listen", required = true, value_parser = ListenAddr::parse)]
    pub listen: Vec<ListenAddr>,
}

/// Logs go to stderr; `RUST_LOG` filters (default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Builds a runtime and serves until SIGTERM/SIGINT.
pub fn serve_blocking(args: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("building the runtime", e))?;
    rt.block_on(serve(args))
}

/// Binds every listener, starts the reaper, serves until SIGTERM/SIGINT, then kills every
/// command still running.
pub async fn serve(args: Args) -> Result<()> {
    conn::mark_start();
    let table = Arc::new(proc::ProcessTable::new());
    proc::reaper::become_subreaper();
    let reaper = tokio::spawn(proc::reaper::run(table.clone())?);
    let mut tasks = Vec::new();
    for addr in &args.listen {
        let listener = listen::bind(addr).await?;
        tracing::info!(%addr, "listening");
        tasks.push(tokio::spawn(listen::accept_loop(listener, table.clone())));
    }
    wait_for_shutdown().await?;
    tracing::info!("shutting down: killing every running command");
    table.kill_all();
    for t in tasks {
        t.abort();
    }
    reaper.abort();
    Ok(())
}

async fn wait_for_shutdown() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| Error::io("installing SIGTERM", e))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| Error::io("installing SIGINT", e))?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
