//! Buffered exec: one fresh guest stream per exec, output collected on raw bytes against
//! the per-exec cap ([`capture`]), the bounded `Kill` on every give-up path, and the answer
//! handed to the API layer (which encodes the body, `api/exec.rs`). Admission lives in
//! [`admit`].
//!
//! Must not: answer before a give-up's `Kill` was answered or timed out, or count output
//! on encoded (escaped) bytes.

pub mod admit;
pub mod capture;

use std::sync::Arc;
use std::time::Duration;

use futures::SinkExt;
use tokio::sync::oneshot;
use wire::{ErrorKind, Request, Response};

pub use self::admit::{Admitted, Execs};
pub use self::capture::{Budget, Captured};
use crate::claims::Sandbox;
use crate::error::{Error, Result};
use crate::guest;

/// Largest `timeout_seconds` accepted (one year).
const MAX_TIMEOUT_SECONDS: f64 = 365.0 * 86_400.0;
/// Slack over `timeout_seconds` for silkd's own timer to answer first.
const TIMEOUT_GRACE: Duration = Duration::from_secs(1);

/// A finished command and its captured output, ready to encode.
pub struct Finished {
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Its stdout.
    pub stdout: Captured,
    /// Its stderr.
    pub stderr: Captured,
    /// Why the node cut the command short ([`Error::Timeout`] or
    /// [`Error::OutputTooLarge`]): it was killed, and the streams hold what it wrote until
    /// then. The answer still carries them, so a caller sees how far it got.
    pub cut: Option<Error>,
}

/// Checks a request before admission: non-empty argv, no NUL byte anywhere the kernel
/// takes a C string (argv, env, cwd), env keys non-empty and without `=` (a key with `=`
/// would set another variable than it names), positive finite timeout.
pub fn validate(req: &api::ExecRequest) -> Result<()> {
    if req.argv.is_empty() || req.argv[0].is_empty() {
        return Err(Error::BadRequest("argv must not be empty".into()));
    }
    if let Some(i) = req.argv.iter().position(|a| a.contains('\0')) {
        return Err(Error::BadRequest(format!("argv[{i}] contains a NUL byte")));
    }
    if req.cwd.as_ref().is_some_and(|c| c.contains('\0')) {
        return Err(Error::BadRequest("cwd contains a NUL byte".into()));
    }
    // Whether the user exists is the guest's to say (its /etc/passwd); here only what no
    // passwd file can hold.
    if let Some(user) = &req.user {
        if user.is_empty() || user.len() > 256 || user.contains(['\0', ':', '\n']) {
            return Err(Error::BadRequest(
                "user must be a name or uid of 1 to 256 bytes without NUL, ':' or newline".into(),
            ));
        }
    }
    for (key, value) in req.env.iter().flatten() {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(Error::BadRequest(format!(
                "env key {key:?} must be non-empty and contain no '=' or NUL byte"
            )));
        }
        if value.contains('\0') {
            return Err(Error::BadRequest(format!(
                "env value of {key:?} contains a NUL byte"
            )));
        }
    }
    if let Some(t) = req.timeout_seconds {
        // The upper bound keeps the value representable as a Duration and as silkd's
        // `timeout_ms`; no sandbox lives that long anyway.
        if !t.is_finite() || t <= 0.0 || t > MAX_TIMEOUT_SECONDS {
            return Err(Error::BadRequest(format!(
                "timeout_seconds must be a positive number up to {MAX_TIMEOUT_SECONDS}"
            )));
        }
    }
    Ok(())
}

/// Why collection stopped early.
enum GiveUp {
    Timeout,
    TooLarge,
    ClientGone,
    Guest(Error),
}

/// Runs the exec in its own task so that a client hanging up (which drops the HTTP
/// handler) still ends in a `Kill`; the handler awaits the returned receiver, and the task
/// notices the receiver's drop. A timeout or the output cap is `Ok` with
/// [`Finished::cut`] set: answer it with `status_of(cut)`, never 200.
pub fn spawn(
    execs: Arc<Execs>,
    admitted: Admitted,
    sandbox: Arc<Sandbox>,
    req: api::ExecRequest,
) -> oneshot::Receiver<Result<Finished>> {
    let (mut tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let outcome = match sandbox.failed_error() {
            Some(e) => Err(e),
            // A guest that died mid-exec shows as a closed channel; say what happened.
            None => match run(&execs, &sandbox, req, &mut tx).await {
                Err(e) => Err(sandbox.explain(e).await),
                ok => ok,
            },
        };
        drop(admitted);
        let _ = tx.send(outcome);
    });
    rx
}

async fn run(
    execs: &Execs,
    sandbox: &Sandbox,
    req: api::ExecRequest,
    client: &mut oneshot::Sender<Result<Finished>>,
) -> Result<Finished> {
    let guest = sandbox.guest();
    let guest = &*guest;
    let mut conn = guest::connect(guest).await?;
    let timeout = req.timeout_seconds.map(Duration::from_secs_f64);
    conn.send(Request::Exec {
        detach: false,
        pty: None,
        argv: req.argv,
        cwd: req.cwd,
        env: req.env.map(|m| m.into_iter().collect()),
        stdin: false,
        timeout_ms: timeout.map(|t| t.as_millis().max(1) as u64),
        user: req.user,
    })
    .await?;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t + TIMEOUT_GRACE);
    let mut stdout = execs.capture();
    let mut stderr = execs.capture();
    let mut pid = None;
    let mut total: u64 = 0;
    let give_up = loop {
        let frame = tokio::select! {
            frame = guest::next(&mut conn) => frame,
            () = sleep_until(deadline) => break GiveUp::Timeout,
            () = client.closed() => break GiveUp::ClientGone,
        };
        // A hostile guest must not keep this loop going for free: `Started` comes once and
        // every output frame carries a byte (silkd never sends an empty one), so at most
        // `max_output` frames pass before the cap below ends the exec.
        let (data, out) = match frame {
            Ok(Response::Started { pid: p }) if pid.is_none() => {
                pid = Some(p);
                continue;
            }
            Ok(Response::Started { .. }) => {
                break GiveUp::Guest(Error::Guest("a second Started in one exec".into()))
            }
            Ok(Response::Stdout { data } | Response::Stderr { data }) if data.is_empty() => {
                break GiveUp::Guest(Error::Guest("an empty output frame".into()))
            }
            Ok(Response::Stdout { data }) => (data, &mut stdout),
            Ok(Response::Stderr { data }) => (data, &mut stderr),
            Ok(Response::Exit {
                timed_out: true, ..
            }) => break GiveUp::Timeout,
            Ok(Response::Exit { code, signal, .. }) => {
                return Ok(Finished {
                    exit_code: code,
                    signal,
                    stdout,
                    stderr,
                    cut: None,
                })
            }
            Ok(Response::Error { kind, message }) => {
                let e = match kind {
                    ErrorKind::BadRequest => Error::BadRequest(message),
                    ErrorKind::ResourceExhausted => Error::Busy {
                        reason: format!("guest out of resources: {message}"),
                        retry_after: 1,
                    },
                    other => Error::Guest(format!("{}: {message}", other.as_str())),
                };
                break GiveUp::Guest(e);
            }
            Ok(other) => break GiveUp::Guest(Error::Guest(format!("unexpected frame {other:?}"))),
            Err(e) => break GiveUp::Guest(e),
        };
        // Output past the cap is cut at the cap: the answer keeps the first bytes.
        let mut data = data;
        let room = execs.max_output - total;
        let over = data.len() as u64 > room;
        if over {
            data.truncate(room as usize);
        }
        total += data.len() as u64;
        if let Err(e) = out.push(data, &execs.metrics).await {
            break GiveUp::Guest(e);
        }
        if over {
            break GiveUp::TooLarge;
        }
    };
    // Every give-up kills the command through a fresh stream, and answers only after.
    if let Some(pid) = pid {
        let _ = guest::kill(guest, pid).await;
    }
    drop(conn);
    let cut = match give_up {
        GiveUp::Timeout => Error::Timeout {
            seconds: req.timeout_seconds.unwrap_or_default(),
        },
        GiveUp::TooLarge => Error::OutputTooLarge {
            limit: execs.max_output,
        },
        GiveUp::ClientGone => {
            return Err(Error::ClientGone(
                "the client hung up before the exec finished",
            ))
        }
        GiveUp::Guest(e) => return Err(e),
    };
    // Both give-ups kill with SIGKILL (`guest::kill`, silkd's own timer), so that is how
    // the command ended.
    Ok(Finished {
        exit_code: None,
        signal: Some(libc::SIGKILL),
        stdout,
        stderr,
        cut: Some(cut),
    })
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let ok = api::ExecRequest {
            argv: vec!["true".into()],
            ..Default::default()
        };
        assert!(validate(&ok).is_ok());
        let empty = api::ExecRequest::default();
        assert!(matches!(validate(&empty), Err(Error::BadRequest(_))));
        let with_env = |k: &str, v: &str| api::ExecRequest {
            env: Some([(k.to_string(), v.to_string())].into()),
            ..ok.clone()
        };
        assert!(
            validate(&with_env("A", "b=c")).is_ok(),
            "'=' in a value is fine"
        );
        for (k, v) in [("", "x"), ("A=B", "x"), ("A\0", "x"), ("A", "x\0y")] {
            let e = validate(&with_env(k, v)).unwrap_err();
            assert!(matches!(e, Error::BadRequest(_)), "{k:?}={v:?}");
        }
        let nul_arg = api::ExecRequest {
            argv: vec!["echo".into(), "a\0b".into()],
            ..Default::default()
        };
        assert!(validate(&nul_arg)
            .unwrap_err()
            .to_string()
            .contains("argv[1]"));
        let nul_cwd = api::ExecRequest {
            cwd: Some("/tmp\0".into()),
            ..ok.clone()
        };
        assert!(validate(&nul_cwd).is_err());
        for bad in ["", "a\0b", "a:b", "a\nb", &"u".repeat(257)] {
            let r = api::ExecRequest {
                user: Some(bad.into()),
                ..ok.clone()
            };
            assert!(matches!(validate(&r), Err(Error::BadRequest(_))), "{bad:?}");
        }
        for t in [-1.0, 0.0, f64::NAN, f64::INFINITY, 1e20] {
            let r = api::ExecRequest {
                timeout_seconds: Some(t),
                ..ok.clone()
            };
            assert!(validate(&r).is_err(), "{t}");
        }
    }
}
