//! The command line: clap's types for sbx's flags and subcommands, and turning their
//! arguments into SDK values. Parses only; runs nothing.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sandbox_sdk::ClaimOptions;

/// Claim sandboxes from sandboxd and run commands in them.
#[derive(Parser)]
#[command(name = "sbx", version)]
pub struct Cli {
    /// sandboxd's URL: http://host:port or unix:/path/to/socket [default: the config
    /// file's `url`, else http://127.0.0.1:7777].
    #[arg(long, global = true, env = "SANDBOXD_URL")]
    pub url: Option<String>,
    /// Bearer token: root or tenant; for `exec`, `renew` and `release` also the sandbox's own
    /// [default: the config file's `token`].
    #[arg(long, global = true, env = "SANDBOXD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Claim a sandbox; print its id, token and deadline.
    Claim {
        #[command(flatten)]
        claim: ClaimArgs,
        /// Print the claim answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a claimed sandbox, streaming its output; exit with its code.
    Exec {
        /// Sandbox id.
        id: String,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Claim a sandbox, run a command in it, release it (also on failure or Ctrl-C).
    Run {
        #[command(flatten)]
        claim: ClaimArgs,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Open an interactive login shell in a sandbox (a pseudo-terminal; the template's
    /// user, shell and working directory); exit with the shell's code.
    Shell {
        /// Sandbox id.
        id: String,
        /// Working directory instead of the template's.
        #[arg(long)]
        cwd: Option<String>,
        /// Run as this user (name or uid) instead of the template's user.
        #[arg(long, short = 'u')]
        user: Option<String>,
    },
    /// List a sandbox's commands (running and recently exited, detached or not).
    Ps {
        /// Sandbox id.
        id: String,
    },
    /// Follow a detached command: its retained output, then live, then its exit code.
    Attach {
        /// Sandbox id.
        id: String,
        /// The command's pid (from `sbx exec --detach` or `sbx ps`).
        pid: u32,
    },
    /// Snapshots: take one of a running sandbox, list them, delete one.
    Snapshot {
        #[command(subcommand)]
        cmd: crate::snapshot::SnapshotCmd,
    },
    /// Claim a fork of a snapshot; print its id, token and deadline.
    Fork {
        /// Snapshot id.
        snapshot: String,
        /// Lifetime in seconds (the node's default when absent).
        #[arg(long)]
        ttl: Option<u64>,
        /// Print the claim answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Hibernate a sandbox: written to disk, memory freed; the next call wakes it.
    Hibernate {
        /// Sandbox id.
        id: String,
    },
    /// Wake a hibernated sandbox now.
    Wake {
        /// Sandbox id.
        id: String,
    },
    /// Release a sandbox (an already released one is not an error).
    Release {
        /// Sandbox id.
        id: String,
    },
    /// Move a sandbox's deadline.
    Renew {
        /// Sandbox id.
        id: String,
        /// New lifetime from now, in seconds.
        #[arg(long)]
        ttl: u64,
    },
    /// List sandboxes (root: all; tenant: its own), or with ID:PATH a sandbox's directory.
    Ls {
        /// ID:PATH: list this directory (or describe this file) in the sandbox.
        target: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy files or directories into or out of a sandbox: `sbx cp ./dir ID:/home/user/dir`,
    /// `sbx cp ID:/path ./local`. Directories travel as a tar stream (modes, symlinks kept).
    Cp {
        /// The source: a local path or ID:PATH.
        src: String,
        /// The destination: ID:PATH or a local path.
        dst: String,
        /// Act as this user in the sandbox instead of the template's user.
        #[arg(long, short = 'u')]
        user: Option<String>,
    },
    /// Listen on 127.0.0.1:LOCAL and tunnel each connection to port REMOTE inside the
    /// sandbox (LOCAL 0 picks a free port; the address is printed). Runs until interrupted.
    PortForward {
        /// Sandbox id.
        id: String,
        /// LOCAL:REMOTE ports.
        #[arg(value_parser = crate::forward::parse_mapping)]
        mapping: (u16, u16),
    },
    /// Serve the Model Context Protocol over stdio: tools to create sandboxes, run
    /// commands, read, write and list files, and release sandboxes (docs/mcp.md). The
    /// sandboxes a session creates are released when it ends.
    Mcp,
    /// Show the node (pools, limits, engine) as JSON, or one sandbox when given its id.
    Info {
        /// Sandbox id.
        id: Option<String>,
    },
}

#[derive(Args)]
pub struct ClaimArgs {
    /// Template name (the node's default when absent).
    #[arg(long)]
    pub template: Option<String>,
    /// Size name (the node's default when absent).
    #[arg(long)]
    pub size: Option<String>,
    /// Lifetime in seconds (the node's default when absent).
    #[arg(long)]
    pub ttl: Option<u64>,
}

#[derive(Args)]
pub struct RunArgs {
    /// Working directory inside the sandbox.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Run as this user (name or uid) instead of the template's user.
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Kill the command after this many seconds (exit 124).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Run it under a pseudo-terminal sized like ours (our terminal goes raw meanwhile).
    #[arg(long, short = 't')]
    pub tty: bool,
    /// Never read our stdin (the command's is empty), as `ssh -n`: for `sbx exec` inside
    /// a `while read` loop, which would otherwise hand the loop's input to the command.
    /// Without it, stdin is forwarded whenever it is not a terminal.
    #[arg(long = "no-stdin", short = 'n')]
    pub no_stdin: bool,
    /// Start it detached and print its pid: it keeps running after sbx exits; follow it
    /// with `sbx attach`, end it with a kill.
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub argv: Vec<String>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// The claim that `--template`, `--size` and `--ttl` ask for; the node's defaults fill
/// what is absent.
pub fn claim_options(args: ClaimArgs) -> ClaimOptions {
    let mut opts = ClaimOptions::new();
    if let Some(t) = args.template {
        opts = opts.template(t);
    }
    if let Some(s) = args.size {
        opts = opts.size(s);
    }
    if let Some(ttl) = args.ttl {
        opts = opts.ttl(Duration::from_secs(ttl));
    }
    opts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_pairs_split_at_the_first_equals() {
        assert_eq!(parse_env("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert_eq!(parse_env("EMPTY="), Ok(("EMPTY".into(), String::new())));
        assert!(parse_env("NOVALUE").is_err());
    }

    #[test]
    fn command_line_shapes() {
        let cli = Cli::try_parse_from([
            "sbx", "exec", "sb-1", "-e", "K=V", "--", "sh", "-c", "exit 7",
        ])
        .unwrap();
        let Cmd::Exec { id, run } = cli.command else {
            panic!("not exec")
        };
        assert_eq!(id, "sb-1");
        assert_eq!(run.argv, ["sh", "-c", "exit 7"]);
        assert_eq!(run.env, [("K".to_string(), "V".to_string())]);
        assert!(!run.no_stdin);
        let cli = Cli::try_parse_from(["sbx", "exec", "-n", "sb-1", "--", "true"]).unwrap();
        let Cmd::Exec { run, .. } = cli.command else {
            panic!("not exec")
        };
        assert!(run.no_stdin);
        // The argv is required, after `--`.
        assert!(Cli::try_parse_from(["sbx", "run"]).is_err());
        assert!(Cli::try_parse_from(["sbx", "run", "--ttl", "5", "--", "true"]).is_ok());
    }
}
