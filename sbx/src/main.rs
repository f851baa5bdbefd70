//! `sbx`: sandboxd from a terminal — claim, exec (streamed over the relay), run (claim,
//! exec, release), release, renew, ls, info. A thin layer over `sandbox_sdk`: argument
//! parsing, printing, exit codes and signals only.
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

use std::future::Future;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use sandbox_sdk::{ClaimOptions, Client, Command, Error, ExitStatus, Process, Sandbox};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// Exit code when sbx itself failed during `exec` or `run` (as `docker run` does), so it
/// does not collide with the command's own codes.
const EXIT_SBX_FAILED: u8 = 125;
/// Exit code when the command's `--timeout` expired (as coreutils `timeout` does).
const EXIT_TIMEOUT: u8 = 124;

/// Claim sandboxes from sandboxd and run commands in them.
#[derive(Parser)]
#[command(name = "sbx", version)]
struct Cli {
    /// sandboxd's URL: http://host:port or unix:/path/to/socket [default: the config
    /// file's `url`, else http://127.0.0.1:7777].
    #[arg(long, global = true, env = "SANDBOXD_URL")]
    url: Option<String>,
    /// Bearer token: root or tenant; for `exec`, `renew` and `release` also the sandbox's own
    /// [default: the config file's `token`].
    #[arg(long, global = true, env = "SANDBOXD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
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
    /// List sandboxes (root: all; tenant: its own).
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the node (pools, limits, engine) as JSON, or one sandbox when given its id.
    Info {
        /// Sandbox id.
        id: Option<String>,
    },
}

#[derive(Args)]
struct ClaimArgs {
    /// Template name (the node's default when absent).
    #[arg(long)]
    template: Option<String>,
    /// Size name (the node's default when absent).
    #[arg(long)]
    size: Option<String>,
    /// Lifetime in seconds (the node's default when absent).
    #[arg(long)]
    ttl: Option<u64>,
}

#[derive(Args)]
struct RunArgs {
    /// Working directory inside the sandbox.
    #[arg(long)]
    cwd: Option<String>,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Kill the command after this many seconds (exit 124).
    #[arg(long)]
    timeout: Option<f64>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    argv: Vec<String>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// Why `exec` or `run` stopped, when it was not the command ending by itself.
enum Stop {
    /// sbx got this signal; the command was killed.
    Signal(i32),
    /// The call failed.
    Failed(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Failed(e)
    }
}

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
        Cmd::Exec { id, run } => {
            let interrupts = match Interrupts::install() {
                Ok(i) => i,
                Err(e) => return fail(&e, EXIT_SBX_FAILED),
            };
            finish(stream(&client.sandbox(id), run, &interrupts).await)
        }
        Cmd::Run { claim, run } => run_cmd(&client, claim, run).await,
        Cmd::Release { id } => plain(client.sandbox(id).release().await),
        Cmd::Renew { id, ttl } => plain(renew_cmd(&client, id, ttl).await),
        Cmd::Ls { json } => plain(ls_cmd(&client, json).await),
        Cmd::Info { id } => plain(info_cmd(&client, id).await),
    };
    // Exit here rather than return: a stdin copy may still be blocked reading our stdin,
    // and the runtime would wait for it on shutdown.
    std::process::exit(code.into())
}

/// `${XDG_CONFIG_HOME:-$HOME/.config}/sbx/config.toml`, as `cargo xtask up` writes it.
#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    url: Option<String>,
    token: Option<String>,
}

/// The URL and token to use: the flag or environment variable (clap has merged the two;
/// empty counts as unset), else the config file's, else the default URL and no token. The
/// file is read only when something is missing; a file that is absent is not an error.
fn resolve(url: Option<String>, token: Option<String>) -> Result<(String, Option<String>), String> {
    let given = |v: Option<String>| v.filter(|s| !s.is_empty());
    let (url, token) = (given(url), given(token));
    let file = match (&url, &token, config_path()) {
        (Some(_), Some(_), _) | (_, _, None) => ConfigFile::default(),
        (_, _, Some(path)) => read_config(&path)?,
    };
    let url = url
        .or(given(file.url))
        .unwrap_or_else(|| sandbox_sdk::DEFAULT_URL.to_string());
    Ok((url, token.or(given(file.token))))
}

fn config_path() -> Option<PathBuf> {
    let dir = |var| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    dir("XDG_CONFIG_HOME")
        .or_else(|| dir("HOME").map(|home| home.join(".config")))
        .map(|config| config.join("sbx/config.toml"))
}

fn read_config(path: &std::path::Path) -> Result<ConfigFile, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text).map_err(|e| {
            // toml's own rendering spans several lines; an sbx error is one.
            let line = e
                .span()
                .map_or(1, |at| text[..at.start].matches('\n').count() + 1);
            let message: Vec<&str> = e.message().lines().map(str::trim).collect();
            format!("{}: line {line}: {}", path.display(), message.join("; "))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ConfigFile::default()),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
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

/// The exit code of `exec` / `run`.
fn finish(result: Result<ExitStatus, Stop>) -> u8 {
    match result {
        // Codes outside 0..=255 cannot be an exit status; a shell would truncate them.
        Ok(status) => (status.shell_code() & 0xff) as u8,
        Err(Stop::Signal(sig)) => (128 + sig) as u8,
        Err(Stop::Failed(Error::Timeout)) => {
            eprintln!("sbx: {}", Error::Timeout);
            EXIT_TIMEOUT
        }
        Err(Stop::Failed(e)) => {
            eprintln!("sbx: {e}");
            EXIT_SBX_FAILED
        }
    }
}

fn claim_options(args: ClaimArgs) -> ClaimOptions {
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

async fn claim_cmd(client: &Client, args: ClaimArgs, json: bool) -> Result<(), Error> {
    let sandbox = with_progress("claiming a sandbox", client.claim(claim_options(args))).await?;
    let token = sandbox.token().unwrap_or_default();
    let deadline = sandbox.deadline_unix().unwrap_or_default();
    if json {
        let answer = api::ClaimResponse {
            id: sandbox.id().to_string(),
            token: token.to_string(),
            deadline,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&answer).expect("serializes")
        );
    } else {
        println!("id       {}", sandbox.id());
        println!("token    {token}");
        println!("deadline {deadline} (in {}s)", seconds_until(deadline));
    }
    Ok(())
}

async fn renew_cmd(client: &Client, id: String, ttl: u64) -> Result<(), Error> {
    let mut sandbox = client.sandbox(id);
    sandbox.renew(Duration::from_secs(ttl)).await?;
    let deadline = sandbox.deadline_unix().unwrap_or_default();
    println!("deadline {deadline} (in {}s)", seconds_until(deadline));
    Ok(())
}

async fn ls_cmd(client: &Client, json: bool) -> Result<(), Error> {
    let sandboxes = client.list().await?;
    if json {
        let list = api::SandboxList { sandboxes };
        println!(
            "{}",
            serde_json::to_string_pretty(&list).expect("serializes")
        );
        return Ok(());
    }
    println!(
        "{:<20} {:<12} {:<8} {:<7} {:>9}  TENANT",
        "ID", "TEMPLATE", "SIZE", "STATE", "EXPIRES"
    );
    for s in sandboxes {
        let state = match s.state {
            sandbox_sdk::SandboxState::Ready => "ready",
            sandbox_sdk::SandboxState::Failed => "failed",
        };
        println!(
            "{:<20} {:<12} {:<8} {:<7} {:>8}s  {}",
            s.id,
            s.template,
            s.size,
            state,
            seconds_until(s.deadline),
            s.tenant.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

async fn info_cmd(client: &Client, id: Option<String>) -> Result<(), Error> {
    let text = match id {
        Some(id) => serde_json::to_string_pretty(&client.sandbox_info(&id).await?),
        None => serde_json::to_string_pretty(&client.info().await?),
    };
    println!("{}", text.expect("serializes"));
    Ok(())
}

async fn run_cmd(client: &Client, claim: ClaimArgs, run: RunArgs) -> u8 {
    let interrupts = match Interrupts::install() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("sbx: {e}");
            return EXIT_SBX_FAILED;
        }
    };
    // The claim is not raced with signals: a claim abandoned mid-flight could still be
    // granted, and its id would never be known to release. A signal is acted on once the
    // claim has answered.
    let claimed = with_progress("claiming a sandbox", client.claim(claim_options(claim))).await;
    let sandbox = match claimed {
        Ok(s) => s,
        Err(e) => return finish(Err(Stop::Failed(e))),
    };
    let outcome = match interrupts.received() {
        Some(sig) => Err(Stop::Signal(sig)),
        None => stream(&sandbox, run, &interrupts).await,
    };
    let code = finish(outcome);
    match with_progress("releasing the sandbox", sandbox.release()).await {
        Ok(()) => code,
        Err(e) => {
            eprintln!("sbx: releasing {}: {e}", sandbox.id());
            EXIT_SBX_FAILED
        }
    }
}

/// Spawns the command over the relay, copies its output to ours (and our stdin to it
/// when ours is not a terminal), and waits for it. A signal to sbx kills the command.
async fn stream(
    sandbox: &Sandbox,
    args: RunArgs,
    interrupts: &Interrupts,
) -> Result<ExitStatus, Stop> {
    let forward_stdin = !std::io::stdin().is_terminal();
    let mut cmd = Command::from_argv(args.argv)
        .envs(args.env)
        .stdin(forward_stdin);
    if let Some(cwd) = args.cwd {
        cmd = cmd.cwd(cwd);
    }
    if let Some(secs) = args.timeout {
        if !(secs.is_finite() && secs > 0.0) {
            return Err(Error::BadRequest("--timeout must be a positive number".into()).into());
        }
        cmd = cmd.timeout(Duration::from_secs_f64(secs));
    }
    let mut process = tokio::select! {
        spawned = sandbox.spawn(&cmd) => spawned?,
        sig = interrupts.wait() => return Err(Stop::Signal(sig)),
    };
    // Not awaited: a command may exit without reading its stdin, and the copy blocks on
    // our stdin until it does; the copy ends with the process.
    if let Some(mut stdin) = process.stdin() {
        tokio::spawn(async move {
            if tokio::io::copy(&mut tokio::io::stdin(), &mut stdin)
                .await
                .is_ok()
            {
                let _ = stdin.close().await;
            }
        });
    }
    let ended = tokio::select! {
        ended = copy_and_wait(&mut process) => ended,
        sig = interrupts.wait() => {
            if let Err(e) = process.kill().await {
                eprintln!("sbx: killing pid {}: {e}", process.pid());
            }
            return Err(Stop::Signal(sig));
        }
    };
    ended
}

/// Copies the command's output to ours until it ends, then waits for its status. When our
/// stdout or stderr is closed (`sbx exec ... | head`), the command is killed, as SIGPIPE
/// would end a local one, and sbx exits 128 + SIGPIPE.
async fn copy_and_wait(process: &mut Process) -> Result<ExitStatus, Stop> {
    let mut out = process.take_stdout().expect("taken first");
    let mut err = process.take_stderr().expect("taken first");
    let (mut stdout, mut stderr) = (tokio::io::stdout(), tokio::io::stderr());
    // `copy` flushes once its reader ends.
    let copied = tokio::try_join!(
        tokio::io::copy(&mut out, &mut stdout),
        tokio::io::copy(&mut err, &mut stderr),
    );
    if copied.is_err() {
        process.kill().await?;
        return Err(Stop::Signal(libc::SIGPIPE));
    }
    Ok(process.wait().await?)
}

/// SIGINT, SIGTERM and SIGHUP, caught from the start so that `run` always gets to
/// release its sandbox.
struct Interrupts {
    rx: watch::Receiver<Option<i32>>,
}

impl Interrupts {
    fn install() -> Result<Interrupts, std::io::Error> {
        let (tx, rx) = watch::channel(None);
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        tokio::spawn(async move {
            loop {
                let sig = tokio::select! {
                    _ = int.recv() => libc::SIGINT,
                    _ = term.recv() => libc::SIGTERM,
                    _ = hup.recv() => libc::SIGHUP,
                };
                if tx.borrow().is_none() {
                    eprintln!("sbx: interrupted; cleaning up");
                }
                tx.send_replace(Some(sig));
            }
        });
        Ok(Interrupts { rx })
    }

    fn received(&self) -> Option<i32> {
        *self.rx.borrow()
    }

    async fn wait(&self) -> i32 {
        let mut rx = self.rx.clone();
        let sig = rx.wait_for(Option::is_some).await.map(|sig| *sig);
        match sig {
            Ok(sig) => sig.expect("waited for Some"),
            // The sender lives as long as the runtime; never ends otherwise.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Runs `work`; when stderr is a terminal and it takes over a second, shows the label and
/// the seconds elapsed until it is done.
async fn with_progress<T>(label: &str, work: impl Future<Output = T>) -> T {
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    let start = Instant::now();
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    tokio::pin!(work);
    let mut shown = false;
    let result = loop {
        tokio::select! {
            result = &mut work => break result,
            _ = tick.tick() => {
                eprint!("\r{label}... {}s", start.elapsed().as_secs());
                shown = true;
            }
        }
    };
    if shown {
        eprint!("\r\x1b[K");
    }
    result
}

fn seconds_until(deadline: u64) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    deadline as i64 - now as i64
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
    fn exit_codes() {
        assert_eq!(finish(Ok(ExitStatus::Code(7))), 7);
        assert_eq!(finish(Ok(ExitStatus::Code(256 + 3))), 3);
        assert_eq!(finish(Ok(ExitStatus::Signal(9))), 137);
        assert_eq!(finish(Err(Stop::Signal(libc::SIGINT))), 130);
        assert_eq!(finish(Err(Stop::Failed(Error::Timeout))), EXIT_TIMEOUT);
        assert_eq!(finish(Err(Stop::Failed(Error::NotFound))), EXIT_SBX_FAILED);
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
        // The argv is required, after `--`.
        assert!(Cli::try_parse_from(["sbx", "run"]).is_err());
        assert!(Cli::try_parse_from(["sbx", "run", "--ttl", "5", "--", "true"]).is_ok());
    }
}
