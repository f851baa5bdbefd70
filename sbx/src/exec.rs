//! `exec` and `run`: a command spawned over the relay with its output copied to ours and
//! our stdin to it, signals to sbx turned into a kill, and the exit code sbx ends with.

use std::io::IsTerminal;
use std::time::Duration;

use sandbox_sdk::{Client, Command, Error, ExitStatus, Process, Sandbox};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::cli::{claim_options, ClaimArgs, RunArgs};
use crate::progress::with_progress;

/// Exit code when sbx itself failed during `exec` or `run` (as `docker run` does), so it
/// does not collide with the command's own codes.
const EXIT_SBX_FAILED: u8 = 125;
/// Exit code when the command's `--timeout` expired (as coreutils `timeout` does).
const EXIT_TIMEOUT: u8 = 124;

/// Why `exec` or `run` stopped, when it was not the command ending by itself.
pub(crate) enum Stop {
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

/// The exit code of `exec` / `run`.
pub(crate) fn finish(result: Result<ExitStatus, Stop>) -> u8 {
    match result {
        // Codes outside 0..=255 cannot be an exit status; a shell would truncate them.
        Ok(status) => (status.shell_code() & 0xff) as u8,
        Err(Stop::Signal(sig)) => (128 + sig) as u8,
        Err(Stop::Failed(e @ Error::Timeout { .. })) => {
            print_partial(&e);
            eprintln!("sbx: {e}");
            EXIT_TIMEOUT
        }
        Err(Stop::Failed(e)) => {
            print_partial(&e);
            eprintln!("sbx: {e}");
            EXIT_SBX_FAILED
        }
    }
}

/// The output an error carries (a command cut short that was not streamed to us as it
/// ran), written where the command would have written it.
fn print_partial(e: &Error) {
    use std::io::Write;
    if let Some(out) = e.partial_output() {
        let _ = std::io::stdout().write_all(&out.stdout);
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().write_all(&out.stderr);
    }
}

/// `sbx exec ID -- ARGV`: the command in an existing sandbox; sbx's exit code.
pub async fn exec_cmd(client: &Client, id: String, run: RunArgs) -> u8 {
    let interrupts = match Interrupts::install() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("sbx: {e}");
            return EXIT_SBX_FAILED;
        }
    };
    if run.detach {
        return match command(&run) {
            Ok(cmd) => crate::detach::start(client, id, cmd).await,
            Err(e) => finish(Err(e)),
        };
    }
    finish(stream(&client.sandbox(id), run, &interrupts).await)
}

/// The command `--detach` starts: argv, env, cwd and user (no stdin, no timeout).
fn command(run: &RunArgs) -> Result<Command, Stop> {
    if run.timeout.is_some() || run.tty {
        return Err(Error::BadRequest(
            "--detach takes no --timeout or -t (end it with kill; attach with sbx attach)".into(),
        )
        .into());
    }
    let mut cmd = Command::from_argv(run.argv.clone()).envs(run.env.clone());
    if let Some(cwd) = &run.cwd {
        cmd = cmd.cwd(cwd.clone());
    }
    if let Some(user) = &run.user {
        cmd = cmd.user(user.clone());
    }
    Ok(cmd)
}

/// `sbx shell ID`: the user's login shell under a pty; sbx's exit code.
pub async fn shell_cmd(
    client: &Client,
    id: String,
    cwd: Option<String>,
    user: Option<String>,
) -> u8 {
    let interrupts = match Interrupts::install() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("sbx: {e}");
            return EXIT_SBX_FAILED;
        }
    };
    let mut cmd = Command::from_argv(crate::shell::login_shell());
    if let Some(cwd) = cwd {
        cmd = cmd.cwd(cwd);
    }
    if let Some(user) = user {
        cmd = cmd.user(user);
    }
    finish(crate::shell::session(&client.sandbox(id), cmd, &interrupts).await)
}

/// `sbx run -- ARGV`: claim, exec, release (also on failure or a signal); sbx's exit code.
pub async fn run_cmd(client: &Client, claim: ClaimArgs, run: RunArgs) -> u8 {
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
    // The stdin rule (docs/sdk.md): forwarded when it is not a terminal, unless `-n`.
    let forward_stdin = !args.tty && !args.no_stdin && !std::io::stdin().is_terminal();
    let mut cmd = Command::from_argv(args.argv)
        .envs(args.env)
        .stdin(forward_stdin);
    if let Some(cwd) = args.cwd {
        cmd = cmd.cwd(cwd);
    }
    if let Some(user) = args.user {
        cmd = cmd.user(user);
    }
    if let Some(secs) = args.timeout {
        if !(secs.is_finite() && secs > 0.0) {
            return Err(Error::BadRequest("--timeout must be a positive number".into()).into());
        }
        cmd = cmd.timeout(Duration::from_secs_f64(secs));
    }
    if args.tty {
        return crate::shell::session(sandbox, cmd, interrupts).await;
    }
    if args.detach {
        return Err(Error::BadRequest("--detach is `sbx exec` only".into()).into());
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
pub(crate) async fn copy_and_wait(process: &mut Process) -> Result<ExitStatus, Stop> {
    let mut out = process.take_stdout().expect("taken first");
    let mut err = process.take_stderr().expect("taken first");
    let (mut stdout, mut stderr) = (tokio::io::stdout(), tokio::io::stderr());
    let copied = tokio::try_join!(
        copy_out(&mut out, &mut stdout),
        copy_out(&mut err, &mut stderr),
    );
    if copied.is_err() {
        process.kill().await?;
        return Err(Stop::Signal(libc::SIGPIPE));
    }
    Ok(process.wait().await?)
}

/// SIGINT, SIGTERM and SIGHUP, caught from the start so that `run` always gets to
/// release its sandbox.
pub(crate) struct Interrupts {
    rx: watch::Receiver<Option<i32>>,
}

impl Interrupts {
    pub(crate) fn install() -> Result<Interrupts, std::io::Error> {
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

    pub(crate) async fn wait(&self) -> i32 {
        let mut rx = self.rx.clone();
        let sig = rx.wait_for(Option::is_some).await.map(|sig| *sig);
        match sig {
            Ok(sig) => sig.expect("waited for Some"),
            // The sender lives as long as the runtime; never ends otherwise.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Most bytes gathered into one write to our stdout or stderr.
const WRITE_BATCH: usize = 1 << 20;

/// Copies an output stream to `to` in large writes, then flushes. tokio's `copy` moved it
/// 8 KiB at a time, and each write to tokio's stdout is a hop to a blocking thread: 1 GiB
/// was 131,072 hops. Here each write takes every chunk that has already arrived (up to
/// [`WRITE_BATCH`]): one hop per batch, and no wait for more than is there.
async fn copy_out(
    from: &mut sandbox_sdk::OutputStream,
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
) -> std::io::Result<()> {
    use futures::FutureExt;
    use tokio::io::AsyncWriteExt;
    let mut batch = Vec::new();
    while let Some(first) = from.next_chunk().await {
        if first.len() >= WRITE_BATCH {
            to.write_all(&first).await?;
            continue;
        }
        batch.clear();
        batch.extend_from_slice(&first);
        while batch.len() < WRITE_BATCH {
            match from.next_chunk().now_or_never() {
                Some(Some(more)) => batch.extend_from_slice(&more),
                _ => break,
            }
        }
        to.write_all(&batch).await?;
    }
    to.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(finish(Ok(ExitStatus::Code(7))), 7);
        assert_eq!(finish(Ok(ExitStatus::Code(256 + 3))), 3);
        assert_eq!(finish(Ok(ExitStatus::Signal(9))), 137);
        assert_eq!(finish(Err(Stop::Signal(libc::SIGINT))), 130);
        let timeout = Error::Timeout { partial: None };
        assert_eq!(finish(Err(Stop::Failed(timeout))), EXIT_TIMEOUT);
        let gone = Error::NotFound {
            what: "sandbox sb-1 not found (released or expired)".into(),
        };
        assert_eq!(finish(Err(Stop::Failed(gone))), EXIT_SBX_FAILED);
    }
}
