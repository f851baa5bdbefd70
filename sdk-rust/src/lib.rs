//! `sandbox_sdk`: the Rust client for sandboxd — claim a sandbox, run commands in it
//! (buffered or streaming), move files in and out, give it back. The `sbx` CLI (its own crate) is built on it.
//!
//! # Layout
//!
//! Modules in dependency order: each uses only modules above it, never one below
//! (`tests::modules_form_a_dag` checks it).
//!
//! 1. `outcome.rs`: [`ExitStatus`], [`Signal`], [`Output`]: how a command ended and
//!    what it wrote.
//! 2. `command.rs`: [`Command`]: what to run.
//! 3. `error.rs`: [`Error`], one enum; HTTP statuses and guest errors map to variants
//!    (the cut-short ones carry the partial [`Output`]).
//! 4. `transport.rs`: HTTP/1 over TCP or Unix sockets, one pooled connection, busy
//!    retries, the `Upgrade: silkd` handshake.
//! 5. `relay.rs`: `wire` frames over an upgraded connection; one-answer RPCs.
//! 6. `sandbox.rs`: [`Sandbox`], one sandbox and its token; buffered
//!    [`exec`](Sandbox::exec), kill and ps over the relay, renew, release.
//! 7. `process.rs`: [`Process`], a spawned command (stdin, output streams, wait, kill),
//!    and [`Sandbox::spawn`] that starts it. Nothing it started keeps running once it is
//!    dropped.
//! 8. `archive.rs`: local directories as tar streams, packed and unpacked on the fly on a
//!    blocking thread; an archive from a sandbox is checked as untrusted.
//! 9. `files.rs`: [`Files`], a sandbox's files from [`Sandbox::files`]: read and write
//!    streamed, stat, list, mkdir, remove, rename, directories, [`Watch`].
//! 10. `port.rs`: [`PortStream`], a TCP connection to a port inside the sandbox, and
//!     [`Sandbox::connect_port`] that opens it.
//! 11. `lines.rs`: output as text lines: [`Lines`] over an [`OutputStream`], and
//!     [`Sandbox::exec_lines`] (a closure sees each line, the whole [`Output`] comes back).
//! 12. `client.rs`: [`Client`], a node's URL and caller token; claim (and
//!     [`Client::with_sandbox`], released however it ends), list, info. It makes
//!     [`Sandbox`] handles that share its connection pool.
//!
//! HTTP bodies come from the `api` crate that sandboxd uses too; relay frames from `wire`.
//!
//! # Example
//!
//! ```no_run
//! use sandbox_sdk::{ClaimOptions, Client, Command};
//!
//! # async fn run() -> Result<(), sandbox_sdk::Error> {
//! let client = Client::from_env()?; // SANDBOXD_URL, SANDBOXD_TOKEN
//! let sandbox = client.claim(ClaimOptions::new()).await?;
//! let out = sandbox.exec(&Command::new("uname").arg("-a")).await?;
//! print!("{}", String::from_utf8_lossy(&out.stdout));
//! sandbox.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! `examples/quickstart.rs` is the snippet of `docs/sdk.md`; the test suite runs it.
#![deny(missing_docs)]

mod archive;
mod client;
mod command;
mod error;
mod files;
mod lines;
mod outcome;
mod port;
mod process;
mod relay;
mod sandbox;
mod snapshot;
mod transport;

// Every type a public signature names is reachable from here, so callers need not
// depend on `api`, `wire` or `bytes` themselves.
pub use api::{
    ClaimsInfo, EngineInfo, GoldenInfo, InfoResponse, LimitsInfo, PoolInfo, SandboxState,
    SandboxSummary,
};
pub use bytes::Bytes;
pub use client::{ClaimOptions, Client, DEFAULT_BUSY_RETRIES, DEFAULT_URL};
pub use command::Command;
pub use error::{Error, Result, TransportError};
pub use files::{Files, Watch};
pub use lines::{Line, Lines};
pub use outcome::{ExitStatus, Output, Signal};
pub use port::PortStream;
pub use process::{Event, OutputStream, Process, ProcessStdin};
pub use sandbox::{DeadlineDisplay, ReleaseOnDrop, Sandbox};
pub use snapshot::{Snapshot, SnapshotInfo, SnapshotOptions};
pub use wire::files::{FileEntry, FileKind, FsEvent, FsEventKind};
pub use wire::{ProcInfo, ProcState, Pty};

#[cfg(test)]
mod tests {
    /// The modules of `# Layout`, in order, with their source.
    const LAYERS: [(&str, &str); 12] = [
        ("outcome", include_str!("outcome.rs")),
        ("command", include_str!("command.rs")),
        ("error", include_str!("error.rs")),
        ("transport", include_str!("transport.rs")),
        ("relay", include_str!("relay.rs")),
        ("sandbox", include_str!("sandbox.rs")),
        ("process", include_str!("process.rs")),
        ("archive", include_str!("archive.rs")),
        ("files", include_str!("files.rs")),
        ("port", include_str!("port.rs")),
        ("lines", include_str!("lines.rs")),
        ("client", include_str!("client.rs")),
    ];

    /// Every `crate::name` in a module's code (comments aside) names a module listed above
    /// it. A re-export from the crate root (`crate::Sandbox`) would hide which module is
    /// used, so code names the module.
    #[test]
    fn modules_form_a_dag() {
        for (at, (module, source)) in LAYERS.iter().enumerate() {
            let code = source
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"));
            for line in code {
                for (i, path) in line.match_indices("crate::") {
                    let name: String = line[i + path.len()..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    let used = LAYERS.iter().position(|(m, _)| *m == name);
                    assert!(
                        used.is_some_and(|used| used < at),
                        "{module}.rs uses `crate::{name}`, which is not a module above it: {line}"
                    );
                }
            }
        }
    }
}
