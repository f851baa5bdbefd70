//! `sandbox_sdk`: the Rust client for sandboxd — claim a sandbox, run commands in it
//! (buffered or streaming), give it back. The `sbx` CLI is built on it.
//!
//! # Layout
//! - [`Client`] (`client.rs`): a node's URL and caller token, one pooled connection (TCP or
//!   Unix socket); claim, list, info.
//! - [`Sandbox`] (`sandbox.rs`): one sandbox and its token; buffered [`exec`](Sandbox::exec),
//!   streaming [`spawn`](Sandbox::spawn), kill and ps over the relay, renew, release.
//! - [`Process`] (`process.rs`): a spawned command; stdin, output streams, wait, kill.
//!   Nothing it started keeps running once it is dropped.
//! - [`Command`], [`ExitStatus`], [`Output`] (`command.rs`): what to run and how it ended.
//! - [`Error`] (`error.rs`): one enum; HTTP statuses and guest errors map to variants.
//! - `transport.rs`: HTTP/1 over TCP or Unix sockets, and the relay's upgrade.
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

mod client;
mod command;
mod error;
mod process;
mod sandbox;
mod transport;

pub use api::{InfoResponse, SandboxState, SandboxSummary};
pub use client::{ClaimOptions, Client, DEFAULT_BUSY_RETRIES, DEFAULT_URL};
pub use command::{Command, ExitStatus, Output};
pub use error::{Error, Result, TransportError};
pub use process::{Event, OutputStream, Process, ProcessStdin};
pub use sandbox::Sandbox;
pub use wire::{ProcInfo, ProcState};
