//! silkd, the guest agent: listens for sandboxd, runs commands, tracks and kills them.
//!
//! # Layout
//! - [`listen`]: where connections come from (`unix:PATH`, `vsock:PORT`, `serial:NAME`).
//! - [`conn`]: one connection = RPCs back to back (the verb dispatch and the exec loop).
//! - [`files`]: the file verbs (read, write, list, tar, watch...), each on a thread with
//!   the user's file-system ids.
//! - [`proc`]: the process table, spawning, the single reaper, kill.
//! - [`seed`]: copying template trees into fresh writable directories at start.
//! - [`init`]: PID-1 duties, only when silkd is the VM's init.
//! - [`error`]: the crate's error type.
//!
//! silkd knows nothing of HTTP, pools or tokens.

pub mod conn;
pub mod detach;
pub mod error;
pub mod files;
pub mod init;
pub mod listen;
pub mod proc;
pub mod seed;
pub mod tunnel;

use std::path::PathBuf;
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
    /// Most commands the process table holds, running and recently exited together: an
    /// `Exec` while this many run answers `resource_exhausted`; exited entries beyond it
    /// are forgotten oldest first.
    #[arg(long, default_value_t = proc::DEFAULT_MAX_PROCS,
          value_parser = clap::value_parser!(u32).range(1..=proc::MAX_MAX_PROCS as i64))]
    pub max_procs: u32,
    /// Bytes of output kept per detached command (its ring; the oldest are dropped and
    /// counted past it). At most 64 detached commands are kept at once.
    #[arg(long, default_value_t = detach::DEFAULT_RING_BYTES,
          value_parser = clap::value_parser!(u64).range(1..=detach::MAX_RING_BYTES))]
    pub detach_ring: u64,
    /// A writable cgroup2 directory: each command runs in its own child cgroup of it, and
    /// a kill takes the whole cgroup (processes that called `setsid` included). Without
    /// it, kills reach the command's process group only. As PID 1, silkd mounts cgroup2
    /// at /sys/fs/cgroup and uses that.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// The user commands run as unless a request names one (a name or uid from
    /// /etc/passwd): the template's user. silkd's own user when absent.
    #[arg(long)]
    pub user: Option<String>,
    /// The working directory of commands that give no cwd: the template's workdir.
    #[arg(long)]
    pub workdir: Option<String>,
    /// KEY=VALUE set for every command before the request's env: the template's env.
    /// Repeatable.
    #[arg(long = "env", value_parser = proc::user::parse_env_flag)]
    pub env: Vec<(String, String)>,
    /// SRC:DST: copy the tree SRC into DST at start, keeping what DST holds (the process
    /// engine seeds its fresh /home from the template's). Repeatable.
    #[arg(long = "seed", value_parser = seed::parse_flag)]
    pub seed: Vec<(PathBuf, PathBuf)>,
    /// A directory handed to `--user` at start, after seeding (owner of it and all it
    /// holds): the process engine's silkd is root in its sandbox and made the user's home
    /// as root. Repeatable; needs `--user`.
    #[arg(long = "own", requires = "user")]
    pub own: Vec<PathBuf>,

    /// As PID 1: a block device holding the template's read-only erofs root. silkd mounts
    /// it under an overlay whose writable layer is a tmpfs of `--disk-mib`, and switches
    /// root into it before serving, so commands see the template's tree.
    #[arg(long)]
    pub root_disk: Option<PathBuf>,
    /// Size in MiB of the writable layer over `--root-disk` (writes past it: ENOSPC).
    #[arg(long, default_value_t = init::DEFAULT_DISK_MIB,
          value_parser = clap::value_parser!(u64).range(1..=init::MAX_DISK_MIB))]
    pub disk_mib: u64,
}

/// Logs go to stderr; `RUST_LOG` filters (default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        // A stderr that cannot be written (the process engine's log file on a full disk)
        // must not kill the agent: by default a failed write is reported with eprintln!,
        // which panics when stderr itself fails.
        .log_internal_errors(false)
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
    for (src, dst) in &args.seed {
        let n = seed::seed(src, dst);
        tracing::info!(src = %src.display(), dst = %dst.display(), entries = n, "seeded");
    }
    if let Some(who) = &args.user {
        // Checked at start so a template naming a user its tree lacks fails loudly here,
        // not on every command.
        let a = proc::user::lookup(who)?;
        tracing::info!(user = %a.name, uid = a.uid, "commands run as the template's user");
        for dir in &args.own {
            let n = seed::hand_over(dir, a.uid, a.gid);
            tracing::info!(dir = %dir.display(), entries = n, "handed to the user");
        }
    }
    proc::user::set_defaults(proc::user::Defaults {
        user: args.user.clone(),
        workdir: args.workdir.clone(),
        env: args.env.clone(),
    });
    let table = Arc::new(
        proc::ProcessTable::new(args.max_procs, exec_cgroups(args.cgroup.as_deref())?)
            .with_ring_bytes(args.detach_ring),
    );
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

/// Opens `--cgroup`. An unusable directory stops a normal silkd (the operator asked for
/// it); as PID 1 it is logged and kills fall back to process groups, since init exiting
/// would take the VM down.
fn exec_cgroups(dir: Option<&std::path::Path>) -> Result<Option<proc::cgroup::ExecCgroups>> {
    let Some(dir) = dir else {
        tracing::info!("no --cgroup: a kill reaches the command's process group only");
        return Ok(None);
    };
    match proc::cgroup::ExecCgroups::open(dir) {
        Ok(c) => {
            tracing::info!(
                dir = %dir.display(),
                cgroup_kill = c.has_kill(),
                "each command runs in its own cgroup"
            );
            Ok(Some(c))
        }
        Err(e) if std::process::id() == 1 => {
            tracing::warn!("per-command cgroups off, kills reach process groups only: {e}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
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
