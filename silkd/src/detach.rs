//! Detached commands: output pumped into a bounded ring owned by silkd (not by any
//! connection), and the attach loop that replays the ring then follows it live, passing
//! stdin, stdin close and resizes on. A client leaving never kills a detached command;
//! `Kill` does.
//!
//! Why a ring and not backpressure: nobody may be reading, and a detached command must
//! not block on its output; so the oldest bytes go, and are counted. Readers keep a
//! cursor into the ring's absolute byte offsets, so any number of them cost nothing
//! per byte but their own frames, and one that falls a whole ring behind skips ahead.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::watch;
use wire::{Request, Response};

use crate::conn::{verb, Out, Reader};
use crate::proc::ExitStatus;
use crate::{Error, Result};

/// Default `--detach-ring`: output kept per detached command.
pub const DEFAULT_RING_BYTES: u64 = 1 << 20;
/// Largest `--detach-ring`.
pub const MAX_RING_BYTES: u64 = 64 << 20;
/// Detached commands the table holds at once, running or exited: bounds ring memory
/// (with `--detach-ring`) and keeps the largest `Procs` answer within the wire's caps.
pub const MAX_DETACHED: usize = 64;
/// Bytes per output frame sent to an attached client.
const FRAME: usize = 64 * 1024;
/// As in `conn`: once the leader exited, a pipe silent this long is abandoned.
const EXIT_GRACE: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

struct Ring {
    /// Chunks with the absolute offset of their first byte.
    chunks: VecDeque<(u64, Stream, Bytes)>,
    /// Offset of the first byte still held.
    start: u64,
    /// Offset one past the last byte written.
    end: u64,
    cap: u64,
    /// Every pump has finished: nothing more will be written.
    closed: bool,
}

impl Ring {
    fn push(&mut self, stream: Stream, data: Bytes) {
        self.chunks.push_back((self.end, stream, data.clone()));
        self.end += data.len() as u64;
        while self.end - self.start > self.cap {
            let excess = self.end - self.start - self.cap;
            let (off, s, front) = self.chunks.pop_front().expect("bytes over cap are held");
            let len = front.len() as u64;
            if len <= excess {
                self.start = off + len;
            } else {
                self.start = off + excess;
                self.chunks
                    .push_front((self.start, s, front.slice(excess as usize..)));
            }
        }
    }

    /// Output from `cursor` on (at most about `max` bytes), and the cursor after it. A
    /// cursor the ring has already dropped past starts at the oldest byte held.
    fn read(&self, cursor: u64, max: usize) -> (Vec<Response>, u64) {
        let mut at = cursor.max(self.start);
        let mut out = Vec::new();
        let mut taken = 0;
        for (off, s, data) in &self.chunks {
            let chunk_end = off + data.len() as u64;
            if chunk_end <= at {
                continue;
            }
            if taken >= max {
                break;
            }
            let from = (at - off) as usize;
            let n = (data.len() - from).min(max - taken);
            let data = data.slice(from..from + n).to_vec();
            out.push(match s {
                Stream::Stdout => Response::Stdout { data },
                Stream::Stderr => Response::Stderr { data },
            });
            at += n as u64;
            taken += n;
        }
        (out, at)
    }
}

/// One detached command's ring, stdin, terminal and status, shared by its pumps and by
/// every attached connection.
pub struct Detached {
    ring: Mutex<Ring>,
    /// Bumped on every write and on close: attached loops wait on it.
    changed: watch::Sender<u64>,
    stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
    pty: Option<OwnedFd>,
    status: watch::Receiver<Option<ExitStatus>>,
}

impl Detached {
    /// Starts pumping `stdout` (and `stderr`) into a ring of `cap` bytes.
    pub fn start(
        spawned: crate::proc::spawn::Spawned,
        status: watch::Receiver<Option<ExitStatus>>,
        cap: u64,
    ) -> Arc<Detached> {
        let det = Arc::new(Detached {
            ring: Mutex::new(Ring {
                chunks: VecDeque::new(),
                start: 0,
                end: 0,
                cap,
                closed: false,
            }),
            changed: watch::channel(0).0,
            stdin: tokio::sync::Mutex::new(spawned.stdin),
            pty: spawned.pty,
            status,
        });
        let d = Arc::clone(&det);
        tokio::spawn(async move {
            let out = pump(&d, spawned.stdout, Stream::Stdout);
            match spawned.stderr {
                Some(err) => {
                    tokio::join!(out, pump(&d, err, Stream::Stderr));
                }
                None => out.await,
            }
            d.ring().closed = true;
            d.changed.send_modify(|v| *v += 1);
        });
        det
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Output bytes dropped so far.
    pub fn dropped(&self) -> u64 {
        self.ring().start
    }
}

/// Copies one pipe into the ring until EOF (or, once the leader exited, 200 ms of
/// silence: something it left behind holds the pipe).
async fn pump<R: AsyncRead + Unpin>(det: &Detached, mut pipe: R, stream: Stream) {
    let mut status = det.status.clone();
    let mut buf = vec![0u8; FRAME];
    let mut leader_exited = status.borrow().is_some();
    loop {
        let read = if leader_exited {
            match tokio::time::timeout(EXIT_GRACE, pipe.read(&mut buf)).await {
                Ok(r) => r,
                Err(_) => return,
            }
        } else {
            tokio::select! {
                r = pipe.read(&mut buf) => r,
                _ = status.changed() => {
                    leader_exited = true;
                    continue;
                }
            }
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                det.ring().push(stream, Bytes::copy_from_slice(&buf[..n]));
                det.changed.send_modify(|v| *v += 1);
            }
        }
    }
}

/// Serves one attached connection: `Started`, the ring from its oldest byte, live
/// output, then `Exit` once the command ended and its output was all sent. Returns
/// `None` when the peer left (the command runs on), `Err` for a protocol fault (the
/// command runs on too: it is detached).
pub async fn attach<S: AsyncRead>(
    det: Arc<Detached>,
    pid: u32,
    reader: &mut Reader<S>,
    tx: &Out,
) -> Result<Option<Response>> {
    if tx.send(Response::Started { pid }).await.is_err() {
        return Ok(None);
    }
    let mut changed = det.changed.subscribe();
    let mut cursor = 0;
    loop {
        changed.borrow_and_update();
        let (frames, next, closed) = {
            let ring = det.ring();
            let (frames, next) = ring.read(cursor, FRAME);
            (frames, next, ring.closed)
        };
        cursor = next;
        let idle = frames.is_empty();
        for f in frames {
            if tx.send(f).await.is_err() {
                return Ok(None);
            }
        }
        if idle && closed {
            break;
        }
        if !idle {
            continue;
        }
        tokio::select! {
            _ = changed.changed() => {}
            frame = reader.next() => match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(req)) => input(&det, pid, req).await?,
            },
        }
    }
    let mut status = det.status.clone();
    let status = match status.wait_for(Option::is_some).await {
        Ok(s) => s.expect("waited for Some"),
        Err(_) => return Err(Error::BadRequest("process table lost the command".into())),
    };
    let (code, signal) = match status {
        ExitStatus::Code(c) => (Some(c), None),
        ExitStatus::Signal(s) => (None, Some(s)),
    };
    Ok(Some(Response::Exit {
        code,
        signal,
        timed_out: false,
    }))
}

/// Stdin, its close, and resizes from an attached client; anything else is a fault.
async fn input(det: &Detached, pid: u32, req: Request) -> Result<()> {
    match req {
        Request::Stdin { data } => {
            let mut stdin = det.stdin.lock().await;
            if let Some(pipe) = stdin.as_mut() {
                // Output goes to the ring, never to us, so a command that stops reading
                // stdin cannot wedge this write against its own output.
                if pipe.write_all(&data).await.is_err() {
                    *stdin = None;
                }
            }
            Ok(())
        }
        Request::StdinClose => {
            // Under a pty the terminal stays; only a pipe reaches EOF.
            if det.pty.is_none() {
                *det.stdin.lock().await = None;
            }
            Ok(())
        }
        Request::Resize { rows, cols } if det.pty.is_some() => {
            wire::Pty::check_size(rows, cols).map_err(Error::BadRequest)?;
            crate::proc::pty::resize(det.pty.as_ref().expect("guarded"), rows, cols)
        }
        other => Err(Error::BadRequest(format!(
            "{} received while attached to {pid}; only stdin and resize frames may be sent",
            verb(&other)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(cap: u64) -> Ring {
        Ring {
            chunks: VecDeque::new(),
            start: 0,
            end: 0,
            cap,
            closed: false,
        }
    }

    fn bytes(frames: &[Response]) -> Vec<u8> {
        frames
            .iter()
            .flat_map(|f| match f {
                Response::Stdout { data } | Response::Stderr { data } => data.clone(),
                _ => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn drops_the_oldest_bytes_and_counts_them() {
        let mut r = ring(10);
        r.push(Stream::Stdout, Bytes::from_static(b"0123456"));
        r.push(Stream::Stderr, Bytes::from_static(b"789ab"));
        assert_eq!(r.start, 2, "two bytes dropped");
        let (frames, next) = r.read(0, 1024);
        assert_eq!(bytes(&frames), b"23456789ab");
        assert!(matches!(frames[1], Response::Stderr { .. }));
        assert_eq!(next, 12);
        // A chunk larger than the whole ring keeps its tail.
        r.push(Stream::Stdout, Bytes::from(vec![b'z'; 25]));
        assert_eq!((r.start, r.end), (27, 37));
        assert_eq!(bytes(&r.read(next, 1024).0), vec![b'z'; 10]);
    }

    #[test]
    fn reads_resume_at_the_cursor_in_bounded_frames() {
        let mut r = ring(1 << 20);
        r.push(Stream::Stdout, Bytes::from(vec![1u8; 100]));
        let (frames, next) = r.read(40, 50);
        assert_eq!((bytes(&frames).len(), next), (50, 90));
        let (frames, next) = r.read(next, 50);
        assert_eq!((bytes(&frames).len(), next), (10, 100));
        assert!(r.read(next, 50).0.is_empty());
    }
}
