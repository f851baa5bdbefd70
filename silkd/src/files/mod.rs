//! The file verbs: read, write, stat, list, mkdir, remove, rename, tar out and in, watch.
//! Each runs on a thread of its own as the request's user ([`creds`]); this module
//! resolves paths, moves bytes between that thread and the connection, and watches the
//! connection so a peer that leaves stops the work.
//!
//! - [`creds`]: the per-verb thread with the user's file-system ids.
//! - [`io`]: reading and writing one file (temp file, fsync, rename).
//! - [`tree`]: stat, list, mkdir, remove, rename.
//! - [`archive`]: directories as tar, out and in (entries that would leave refused).
//! - [`watch`]: inotify events.
//!
//! A verb that fails answers `Error` and the connection goes on; a write or unpack that
//! fails answers at once and drops the peer's remaining frames through `data_end`.

pub mod archive;
pub mod creds;
pub mod io;
pub mod tree;
pub mod watch;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use tokio::io::AsyncRead;
use tokio::sync::mpsc;
use wire::files::MAX_PATH;
use wire::{Request, Response};

use crate::conn::{Out, Reader};
use crate::proc::user;
use crate::{Error, Result};

/// Chunks queued between the connection and a write's thread: with `DATA_CHUNK`, bounds
/// a write's buffering to about 1 MiB.
const IN_QUEUE: usize = 4;

/// One chunk handed to a writing thread.
pub enum Chunk {
    /// Bytes to write.
    Data(Vec<u8>),
    /// The peer's `data_end`: commit.
    End,
}

/// Set when the peer left: a streaming thread stops at its next chunk.
#[derive(Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// True once the peer has gone.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What the connection does after a file request.
pub enum Flow {
    /// Send this answer, then read the next request.
    Answer(Response),
    /// The answer was sent already; read the next request.
    Answered,
    /// The peer left.
    PeerGone,
}

/// Serves one file request. Its failures are answered with `Error` and the connection
/// goes on; `Err` is a protocol fault (answer it and close).
pub async fn serve<S: AsyncRead>(req: Request, reader: &mut Reader<S>, tx: &Out) -> Result<Flow> {
    match req {
        Request::FileWrite(_) | Request::TarIn(_) => feed(req, reader, tx).await,
        other => {
            let cancel = Cancel::default();
            match start(other, tx, &cancel) {
                Ok(done) => answer(reader, done, cancel).await,
                Err(e) => Ok(Flow::Answer(e.to_response())),
            }
        }
    }
}

/// Starts a verb that takes no `data` frames on its thread; its answer is what the
/// thread returns.
fn start(req: Request, tx: &Out, cancel: &Cancel) -> Result<creds::Done<Response>> {
    let (tx, c) = (tx.clone(), cancel.clone());
    let done = |()| Response::Done;
    match req {
        Request::Stat(a) => {
            let path = resolve(&a.path)?;
            creds::spawn(a.user.as_deref(), "stat", move || {
                tree::stat(&path).map(Response::Stat)
            })
        }
        Request::Mkdir(a) => {
            let path = resolve(&a.path)?;
            creds::spawn(a.user.as_deref(), "mkdir", move || {
                tree::mkdir(&path, a.parents, a.mode).map(done)
            })
        }
        Request::Remove(a) => {
            let path = resolve(&a.path)?;
            creds::spawn(a.user.as_deref(), "remove", move || {
                tree::remove(&path, a.recursive).map(done)
            })
        }
        Request::Rename(a) => {
            let (from, to) = (resolve(&a.from)?, resolve(&a.to)?);
            creds::spawn(a.user.as_deref(), "rename", move || {
                tree::rename(&from, &to).map(done)
            })
        }
        Request::List(a) => {
            let path = resolve(&a.path)?;
            if a.depth == 0 || a.depth > wire::files::MAX_LIST_DEPTH {
                return Err(Error::BadRequest(format!(
                    "list depth {} outside 1..={}",
                    a.depth,
                    wire::files::MAX_LIST_DEPTH
                )));
            }
            creds::spawn(a.user.as_deref(), "list", move || {
                tree::list(&path, a.depth, &tx, &c).map(done)
            })
        }
        Request::FileRead(a) => {
            let path = resolve(&a.path)?;
            creds::spawn(a.user.as_deref(), "read", move || {
                io::read(&path, a.offset, a.length, &tx, &c).map(done)
            })
        }
        Request::TarOut(a) => {
            let path = resolve(&a.path)?;
            creds::spawn(a.user.as_deref(), "tar-out", move || {
                archive::pack(&path, &tx, &c).map(done)
            })
        }
        Request::Watch(a) => {
            let path = resolve(&a.path)?;
            creds::spawn(a.user.as_deref(), "watch", move || {
                watch::run(&path, a.recursive, &tx, &c).map(done)
            })
        }
        other => Err(Error::BadRequest(format!(
            "{} is not a file request",
            crate::conn::verb(&other)
        ))),
    }
}

/// Waits for a verb's thread while reading the connection: EOF means the peer left (the
/// thread is told to stop), any frame is a protocol fault.
async fn answer<S: AsyncRead>(
    reader: &mut Reader<S>,
    done: creds::Done<Response>,
    cancel: Cancel,
) -> Result<Flow> {
    let mut done = std::pin::pin!(creds::join(done));
    tokio::select! {
        r = &mut done => Ok(Flow::Answer(r.unwrap_or_else(|e| e.to_response()))),
        frame = reader.next() => {
            cancel.set();
            match frame {
                None => Ok(Flow::PeerGone),
                Some(Err(e)) => Err(e.into()),
                Some(Ok(_)) => Err(Error::BadRequest(
                    "a request arrived before the file request was answered".into(),
                )),
            }
        }
    }
}

/// Runs a write or an unpack: hands the peer's `data` frames to its thread until
/// `data_end`, then answers what the thread returns. A thread that fails early is
/// answered at once (so the peer can stop sending) and the rest of its frames, up to
/// `data_end`, are read and dropped. A peer that leaves first drops the queue without
/// `End`, which the thread takes as an interrupted write (it removes what it staged);
/// this waits for that, so nothing staged outlives the request.
async fn feed<S: AsyncRead>(req: Request, reader: &mut Reader<S>, tx: &Out) -> Result<Flow> {
    let (chunks, rx) = mpsc::channel(IN_QUEUE);
    let started = match req {
        Request::FileWrite(a) => resolve(&a.path).and_then(|path| {
            creds::spawn(a.user.as_deref(), "write", move || {
                io::write(&path, a.mode, a.append, a.parents, rx).map(Response::Stat)
            })
        }),
        Request::TarIn(a) => resolve(&a.path).and_then(|path| {
            creds::spawn(a.user.as_deref(), "tar-in", move || {
                archive::unpack(&path, rx).map(|()| Response::Done)
            })
        }),
        other => unreachable!("feed called for {}", crate::conn::verb(&other)),
    };
    let done = match started {
        Ok(d) => d,
        Err(e) => return answer_then_drain(e.to_response(), reader, tx).await,
    };
    let mut done = std::pin::pin!(creds::join(done));
    loop {
        let frame = tokio::select! {
            // The thread ended before `data_end`: it failed (or refused the input).
            r = &mut done => {
                let answer = r.unwrap_or_else(|e| e.to_response());
                return answer_then_drain(answer, reader, tx).await;
            }
            frame = reader.next() => frame,
        };
        let chunk = match frame {
            Some(Ok(Request::Data { data })) => Chunk::Data(data),
            Some(Ok(Request::DataEnd)) => Chunk::End,
            gone_or_fault => {
                drop(chunks);
                let _ = done.await;
                return match gone_or_fault {
                    None => Ok(Flow::PeerGone),
                    Some(Err(e)) => Err(e.into()),
                    Some(Ok(other)) => Err(Error::BadRequest(format!(
                        "only data frames may follow a write, got {}",
                        crate::conn::verb(&other)
                    ))),
                };
            }
        };
        let end = matches!(chunk, Chunk::End);
        if chunks.send(chunk).await.is_err() || end {
            let answer = done.await.unwrap_or_else(|e| e.to_response());
            return if end {
                Ok(Flow::Answer(answer))
            } else {
                answer_then_drain(answer, reader, tx).await
            };
        }
    }
}

/// Sends `answer` now, then drops the peer's frames through its `data_end`.
async fn answer_then_drain<S: AsyncRead>(
    answer: Response,
    reader: &mut Reader<S>,
    tx: &Out,
) -> Result<Flow> {
    if tx.send(answer).await.is_err() {
        return Ok(Flow::PeerGone);
    }
    loop {
        match reader.next().await {
            None => return Ok(Flow::PeerGone),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(Request::Data { .. })) => {}
            Some(Ok(Request::DataEnd)) => return Ok(Flow::Answered),
            Some(Ok(other)) => {
                return Err(Error::BadRequest(format!(
                    "only data frames may follow a write, got {}",
                    crate::conn::verb(&other)
                )))
            }
        }
    }
}

/// A request's path: absolute, or relative to the template's workdir (`/` without one).
/// Empty paths, NUL bytes and paths over `PATH_MAX` are `bad_request`.
pub fn resolve(path: &str) -> Result<PathBuf> {
    if path.is_empty() || path.contains('\0') || path.len() >= MAX_PATH {
        return Err(Error::BadRequest(format!(
            "bad path {:?}: it must be non-empty, under {MAX_PATH} bytes, without NUL",
            path.chars().take(64).collect::<String>()
        )));
    }
    let p = PathBuf::from(path);
    if p.is_absolute() {
        return Ok(p);
    }
    let base = user::defaults().workdir.as_deref().unwrap_or("/");
    Ok(PathBuf::from(base).join(p))
}

/// Sends one frame from a verb's thread; `false` when the peer has gone.
pub fn send(tx: &Out, cancel: &Cancel, frame: Response) -> bool {
    !cancel.is_set() && tx.blocking_send(frame).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_paths_are_refused() {
        for bad in ["", "a\0b", &"x".repeat(MAX_PATH)] {
            assert!(matches!(resolve(bad), Err(Error::BadRequest(_))), "{bad:?}");
        }
        assert_eq!(resolve("/a/b").unwrap(), PathBuf::from("/a/b"));
        assert_eq!(resolve("a/b").unwrap(), PathBuf::from("/a/b"));
    }
}
