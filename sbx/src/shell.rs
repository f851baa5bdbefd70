//! Pseudo-terminal sessions: `sbx shell ID` and `sbx exec -t`. Our terminal goes raw,
//! keystrokes go to the command's terminal in the sandbox, its output to ours, our window
//! size follows on SIGWINCH, and our terminal is restored before sbx exits.

use sandbox_sdk::{Command, ExitStatus, Process, Sandbox};
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{signal, SignalKind};

use crate::exec::{Interrupts, Stop};
use crate::terminal::{window_size, RawMode};

/// The argv of `sbx shell`: the user's login shell from the guest's `/etc/passwd` (silkd
/// passes it as `SHELL`; only the guest knows it), as a login shell. The working
/// directory is the template's, which silkd uses when the request names none.
pub fn login_shell() -> Vec<String> {
    ["sh", "-c", "exec \"${SHELL:-/bin/sh}\" -l"]
        .map(String::from)
        .to_vec()
}

/// `TERM` to ask for: ours when it is a name the guest accepts, else its default.
fn our_term() -> Option<String> {
    let t = std::env::var("TERM").ok()?;
    let pty = sandbox_sdk::Pty {
        rows: 1,
        cols: 1,
        term: Some(t.clone()),
    };
    pty.check().is_ok().then_some(t)
}

/// Runs `cmd` under a pty sized like our window until it ends; our terminal is raw in
/// between and restored on every way out.
pub async fn session(
    sandbox: &Sandbox,
    cmd: Command,
    interrupts: &Interrupts,
) -> Result<ExitStatus, Stop> {
    let (rows, cols) = window_size();
    let mut cmd = cmd.pty(rows, cols);
    if let Some(term) = our_term() {
        cmd = cmd.term(term);
    }
    let mut resizes = signal(SignalKind::window_change())
        .map_err(|e| Stop::Failed(sandbox_sdk::Error::Guest(format!("SIGWINCH: {e}"))))?;
    let mut process = tokio::select! {
        spawned = sandbox.spawn(&cmd) => spawned?,
        sig = interrupts.wait() => return Err(Stop::Signal(sig)),
    };
    let raw = RawMode::enter().map_err(|e| {
        Stop::Failed(sandbox_sdk::Error::BadRequest(format!(
            "cannot open a terminal session: {e}"
        )))
    });
    let _raw = match raw {
        Ok(r) => r,
        Err(e) => {
            let _ = process.kill().await;
            return Err(e);
        }
    };
    if let Some(mut stdin) = process.stdin() {
        // Not awaited: it blocks on our stdin until the next keystroke; sbx exits anyway.
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut stdin).await;
        });
    }
    let mut out = process.take_stdout().expect("taken first");
    let mut stdout = tokio::io::stdout();
    let copy = async {
        let r = tokio::io::copy(&mut out, &mut stdout).await;
        let _ = stdout.flush().await;
        r
    };
    tokio::pin!(copy);
    loop {
        tokio::select! {
            copied = &mut copy => {
                if copied.is_err() {
                    let _ = process.kill().await;
                    return Err(Stop::Signal(libc::SIGPIPE));
                }
                return Ok(process.wait().await?);
            }
            _ = resizes.recv() => {
                let (rows, cols) = window_size();
                resize_quietly(&process, rows, cols).await;
            }
            sig = interrupts.wait() => {
                let _ = process.kill().await;
                return Err(Stop::Signal(sig));
            }
        }
    }
}

/// A failed resize (the command just ended) is not worth ending the session over.
async fn resize_quietly(process: &Process, rows: u32, cols: u32) {
    let _ = process.resize(rows, cols).await;
}
