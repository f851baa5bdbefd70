//! `exec` and `run`: a command spawned over the relay with its output copied to ours and
//! our stdin to it, signals to sbx turned into a kill, and the exit code sbx ends with.

use std::io::IsTerminal;
use std::time::Duration;

use bytes::Bytes;
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
    let copied = tokio::try_join!(copy_out(&mut out, 1), copy_out(&mut err, 2));
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

/// Most bytes handed to one write to our stdout or stderr.
const WRITE_BATCH: usize = 1 << 20;

/// Copies an output stream to our file descriptor `fd` (1 or 2) from a blocking thread
/// of its own, each write a `writev` of every chunk that has arrived (up to
/// [`WRITE_BATCH`]). tokio's stdout copies each write into a buffer of its own and
/// hands it to a blocking thread, and std's is line-buffered; here the chunks go to the
/// kernel as they came off the relay (no copy in sbx, `bench throughput`).
async fn copy_out(from: &mut sandbox_sdk::OutputStream, fd: i32) -> std::io::Result<()> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let writer = tokio::task::spawn_blocking(move || write_chunks(fd, rx));
    while let Some(chunk) = from.next_chunk().await {
        if tx.send(chunk).await.is_err() {
            break; // The writer stopped on an error, returned below.
        }
    }
    drop(tx);
    writer.await.map_err(std::io::Error::other)?
}

/// [`copy_out`]'s writer: until the channel closes or a write fails (EPIPE: our reader is
/// gone).
fn write_chunks(fd: i32, mut rx: tokio::sync::mpsc::Receiver<Bytes>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    // SAFETY: fd 1 or 2 stays open for the whole process; ManuallyDrop never closes it.
    let mut out = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let mut pending: std::collections::VecDeque<Bytes> = std::collections::VecDeque::new();
    while let Some(first) = rx.blocking_recv() {
        let mut size = first.len();
        pending.push_back(first);
        while size < WRITE_BATCH {
            match rx.try_recv() {
                Ok(more) => {
                    size += more.len();
                    pending.push_back(more);
                }
                Err(_) => break,
            }
        }
        while !pending.is_empty() {
            let slices: Vec<std::io::IoSlice<'_>> =
                pending.iter().map(|b| std::io::IoSlice::new(b)).collect();
            let mut wrote = match out.write_vectored(&slices) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    wait_writable(fd);
                    continue;
                }
                Err(e) => return Err(e),
            };
            drop(slices);
            while wrote > 0 {
                let head = pending.front_mut().expect("wrote no more than pending");
                if wrote >= head.len() {
                    wrote -= head.len();
                    pending.pop_front();
                } else {
                    bytes::Buf::advance(head, wrote);
                    wrote = 0;
                }
            }
        }
    }
    Ok(())
}

/// For an fd we inherited non-blocking: waits until it takes more.
fn wait_writable(fd: i32) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    // SAFETY: fd 1 or 2, open for the whole process.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let _ = poll(
        &mut [PollFd::new(fd, PollFlags::POLLOUT)],
        PollTimeout::NONE,
    );
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
