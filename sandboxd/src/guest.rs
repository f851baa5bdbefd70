//! RPCs sandboxd itself makes to silkd over fresh guest streams: the `Info` readiness
//! check, the bounded `Kill` every give-up path relies on, and running a command to
//! completion (golden warmup). Frames go through `wire` only, read with a cap of
//! [`GUEST_FRAME_MAX`]: the guest is as hostile as its user, so what one of its frames
//! can make sandboxd hold is bounded by what silkd legitimately sends here.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio_util::codec::Framed;
use wire::{ErrorKind, HostCodec, Request, Response};

use crate::engine::{Guest, GuestStream};
use crate::error::{Error, Result};

/// A framed connection to silkd.
pub type GuestConn = Framed<GuestStream, HostCodec>;

/// Bound on dial, write and reply of a give-up `Kill`.
pub const KILL_BOUND: Duration = Duration::from_secs(5);

/// Largest frame sandboxd reads from a guest on its own connections. silkd's largest
/// answer to what sandboxd asks (`Exec`, `Kill`, `Info`; never `Ps`) is an output frame
/// of 64 KiB, or an `Error` of at most 4 KiB of message; the 8 MiB protocol cap stays
/// for relays, which sandboxd does not decode.
pub const GUEST_FRAME_MAX: usize = 256 * 1024;

/// Opens a fresh framed connection.
pub async fn connect(guest: &dyn Guest) -> Result<GuestConn> {
    Ok(Framed::new(
        guest.dial().await?,
        HostCodec::new().with_max(GUEST_FRAME_MAX),
    ))
}

/// Reads the next frame; EOF is an error (the guest went away mid-RPC).
pub async fn next(conn: &mut GuestConn) -> Result<Response> {
    match conn.next().await {
        Some(r) => Ok(r?),
        None => Err(Error::Guest("silkd closed the connection".into())),
    }
}

/// Asks silkd `Info` on a fresh stream, within `bound`. A guest is ready once this answers.
pub async fn info(guest: &dyn Guest, bound: Duration) -> Result<Response> {
    let rpc = async {
        let mut conn = connect(guest).await?;
        conn.send(Request::Info).await?;
        match next(&mut conn).await? {
            r @ Response::Info { .. } => Ok(r),
            other => Err(Error::Guest(format!(
                "unexpected answer to Info: {other:?}"
            ))),
        }
    };
    tokio::time::timeout(bound, rpc)
        .await
        .map_err(|_| Error::Guest(format!("silkd did not answer Info within {bound:?}")))?
}

/// Sends `Kill{pid}` (SIGKILL to the command's process group) on a fresh stream, bounded by
/// [`KILL_BOUND`] in total, and checks the reply. `Done` and `not_found` (already gone) are
/// success; anything else is logged and returned, but the caller answers its client anyway.
pub async fn kill(guest: &dyn Guest, pid: u32) -> Result<()> {
    let rpc = async {
        let mut conn = connect(guest).await?;
        conn.send(Request::Kill { pid, signal: None }).await?;
        next(&mut conn).await
    };
    let outcome = match tokio::time::timeout(KILL_BOUND, rpc).await {
        Ok(Ok(Response::Done)) => return Ok(()),
        Ok(Ok(Response::Error {
            kind: ErrorKind::NotFound,
            ..
        })) => return Ok(()),
        Ok(Ok(other)) => Error::Guest(format!("unexpected answer to Kill: {other:?}")),
        Ok(Err(e)) => e,
        Err(_) => Error::Guest(format!("Kill not answered within {KILL_BOUND:?}")),
    };
    tracing::warn!(
        guest = guest.id(),
        pid,
        "kill after give-up failed: {outcome}"
    );
    Err(outcome)
}

/// Runs `argv` to completion with the base environment, discarding stdout and keeping the
/// last bytes of stderr for the error message. Bounded by `bound` (silkd enforces it too);
/// on expiry the command is killed. Ok only for exit code 0.
pub async fn run_checked(guest: &dyn Guest, argv: &[String], bound: Duration) -> Result<()> {
    let mut conn = connect(guest).await?;
    conn.send(Request::Exec {
        detach: false,
        pty: None,
        argv: argv.to_vec(),
        cwd: None,
        env: None,
        stdin: false,
        timeout_ms: Some(bound.as_millis() as u64),
        user: None,
    })
    .await?;
    let mut pid = None;
    let mut stderr: Vec<u8> = Vec::new();
    let collect = async {
        loop {
            match next(&mut conn).await? {
                Response::Started { pid: p } => pid = Some(p),
                Response::Stdout { .. } => {}
                Response::Stderr { data } => {
                    stderr.extend_from_slice(&data);
                    let excess = stderr.len().saturating_sub(1024);
                    stderr.drain(..excess);
                }
                Response::Exit {
                    code,
                    signal,
                    timed_out,
                } => return Ok((code, signal, timed_out)),
                Response::Error { kind, message } => {
                    return Err(Error::Guest(format!("{}: {message}", kind.as_str())))
                }
                other => return Err(Error::Guest(format!("unexpected frame {other:?}"))),
            }
        }
    };
    // A little slack over silkd's own timer, so its `timed_out` answer normally wins.
    let outcome = tokio::time::timeout(bound + Duration::from_secs(2), collect).await;
    let tail = String::from_utf8_lossy(&stderr).trim().to_string();
    match outcome {
        Ok(Ok((Some(0), _, false))) => Ok(()),
        Ok(Ok((code, signal, timed_out))) => {
            if timed_out {
                return Err(Error::Guest(format!("{argv:?} timed out after {bound:?}")));
            }
            Err(Error::Guest(format!(
                "{argv:?} failed (exit code {code:?}, signal {signal:?}): {tail}"
            )))
        }
        Ok(Err(e)) => Err(e),
        Err(_) => {
            if let Some(pid) = pid {
                let _ = kill(guest, pid).await;
            }
            Err(Error::Guest(format!("{argv:?} timed out after {bound:?}")))
        }
    }
}
