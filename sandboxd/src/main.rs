//! sandboxd entry point: flags, logging, config, bind, then [`sandboxd::run`] until
//! SIGTERM or SIGINT; a second signal, or `stop_timeout_seconds`, forces the exit.

use std::path::PathBuf;

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};

/// Host daemon handing out sandboxes over HTTP.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The TOML config file.
    #[arg(long)]
    config: PathBuf,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match start(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandboxd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn start(args: Args) -> sandboxd::Result<()> {
    let config = sandboxd::Config::load(&args.config)?;
    tracing::info!("effective config:\n{}", config.redacted());
    let listener = sandboxd::Listener::bind(&config).await?;
    let mut term = signal(SignalKind::terminate())
        .map_err(sandboxd::Error::io("installing SIGTERM handler"))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(sandboxd::Error::io("installing SIGINT handler"))?;
    let stop_bound = std::time::Duration::from_secs(config.stop_timeout_seconds);
    let (begin, begun) = tokio::sync::oneshot::channel::<()>();
    // The first signal starts a graceful stop; a second one, or the stop outlasting
    // `stop_timeout_seconds`, exits at once (what is claimed keeps running either way
    // under `on_stop = "keep"`, and the next start sweeps the rest).
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
        let _ = begin.send(());
        tokio::select! {
            _ = term.recv() => tracing::warn!("second SIGTERM: exiting now"),
            _ = int.recv() => tracing::warn!("second SIGINT: exiting now"),
            () = tokio::time::sleep(stop_bound) => {
                tracing::warn!(?stop_bound, "graceful stop took too long: exiting now");
            }
        }
        std::process::exit(2);
    });
    let shutdown = async move {
        let _ = begun.await;
    };
    sandboxd::run(listener, config, shutdown).await
}
