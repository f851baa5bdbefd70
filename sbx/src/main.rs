//! `sbx`: sandboxd from a terminal — claim, exec (streamed over the relay; `-t` under a
//! pseudo-terminal; `--detach` outliving sbx), shell (an interactive login shell), ps,
//! attach (follow a detached command), run (claim, exec, release), release, renew, ls,
//! info, cp (files in and out), port-forward, mcp, snapshot (take, ls, rm), fork,
//! hibernate, wake. A thin layer over `sandbox_sdk`:
//! argument parsing, printing, exit codes and signals only.
//!
//! Exit codes: `exec` and `run` exit with the command's code (128 + signal when a signal
//! ended it), 124 when its `--timeout` expired, 130/143/129 when sbx was interrupted, 141
//! when sbx's output was closed under it (the command is killed), and 125 when sbx itself
//! failed. Other subcommands exit 1 on failure. Errors are one line on
//! stderr.
//!
//! The URL and token come from `--url` / `--token`, else `SANDBOXD_URL` /
//! `SANDBOXD_TOKEN`, else `${XDG_CONFIG_HOME:-$HOME/.config}/sbx/config.toml` (keys
//! `url`, `token`; `cargo xtask up` writes it), else the default URL and no token.

mod cli;
mod config;
mod detach;
mod exec;
mod files;
mod forward;
mod manage;
mod mcp;
mod progress;
mod shell;
mod snapshot;
mod terminal;

use std::process::ExitCode;

use clap::Parser;
use sandbox_sdk::{Client, Error};

use crate::cli::{Cli, Cmd};
use crate::config::resolve;
use crate::exec::{exec_cmd, run_cmd, shell_cmd};
use crate::files::{cp_cmd, ls_files_cmd};
use crate::manage::{claim_cmd, info_cmd, ls_cmd, renew_cmd};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let (url, token) = match resolve(cli.url, cli.token) {
        Ok(pair) => pair,
        Err(e) => return fail(&e, 1),
    };
    let client = match Client::new(&url) {
        Ok(c) => match token {
            Some(t) => c.with_token(t),
            None => c,
        },
        Err(e) => return fail(&e, 1),
    };
    let code = match cli.command {
        Cmd::Claim { claim, json } => plain(claim_cmd(&client, claim, json).await),
        Cmd::Exec { id, run } => exec_cmd(&client, id, run).await,
        Cmd::Run { claim, run } => run_cmd(&client, claim, run).await,
        Cmd::Ps { id } => detach::ps(&client, id).await,
        Cmd::Attach { id, pid } => detach::attach(&client, id, pid).await,
        Cmd::Shell { id, cwd, user } => shell_cmd(&client, id, cwd, user).await,
        Cmd::Snapshot { cmd } => plain(snapshot::snapshot_cmd(&client, cmd).await),
        Cmd::Fork {
            snapshot: snap,
            ttl,
            json,
        } => plain(snapshot::fork_cmd(&client, snap, ttl, json).await),
        Cmd::Hibernate { id } => plain(snapshot::power_cmd(&client, id, true).await),
        Cmd::Wake { id } => plain(snapshot::power_cmd(&client, id, false).await),
        Cmd::Release { id } => plain(client.sandbox(id).release().await),
        Cmd::Renew { id, ttl } => plain(renew_cmd(&client, id, ttl).await),
        Cmd::Ls { target: None, json } => plain(ls_cmd(&client, json).await),
        Cmd::Ls {
            target: Some(target),
            json,
        } => plain(ls_files_cmd(&client, &target, json).await),
        Cmd::Cp { src, dst, user } => plain(cp_cmd(&client, &src, &dst, user).await),
        Cmd::Info { id } => plain(info_cmd(&client, id).await),
        Cmd::Mcp => mcp::mcp_cmd(client).await,
        Cmd::PortForward {
            id,
            mapping: (local, remote),
        } => match forward::port_forward_cmd(&client, id, local, remote).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("sbx: port-forward: {e}");
                1
            }
        },
    };
    // Exit here rather than return: a stdin copy may still be blocked reading our stdin,
    // and the runtime would wait for it on shutdown.
    std::process::exit(code.into())
}

fn fail(e: &dyn std::fmt::Display, code: u8) -> ExitCode {
    eprintln!("sbx: {e}");
    // Exit here rather than return: a stdin copy may still be blocked reading our stdin,
    // and the runtime would wait for it on shutdown.
    std::process::exit(code.into())
}

fn plain(result: Result<(), Error>) -> u8 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sbx: {e}");
            1
        }
    }
}
