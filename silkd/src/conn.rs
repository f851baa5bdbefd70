//! One connection: requests served back to back, each answered until its terminal
//! response. Exec runs here, with the connection watched for EOF the whole time.
//!
//! Responses go through a small bounded queue to one writer task, so a slow reader
//! slows the output pumps (and so the child, through its pipe) while this loop keeps
//! watching for timeouts, exits and hang-ups. Protocol faults (malformed frames, a
//! request in the middle of an exec) are answered with `Error{bad_request}` and close
//! only this connection.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use nix::sys::signal::Signal;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::{FramedRead, FramedWrite};
use wire::{ErrorKind, GuestCodec, Request, Response};

use crate::proc::{spawn::Spec, ExitStatus, KillOutcome, ProcessTable};
use crate::{Error, Result};

/// Bytes read from a child's pipe per output frame: under sandboxd's 256 KiB cap on a
/// guest frame (`GUEST_FRAME_MAX`), with room for the frame's header.
const CHUNK: usize = 192 * 1024;
/// Frames queued for the writer: with `CHUNK`, bounds one exec's output buffering.
const OUT_QUEUE: usize = 4;
/// After the command's leader exits, a pipe still held open by something it left
/// behind is given this long of silence before the exec is answered.
const EXIT_GRACE: Duration = Duration::from_millis(200);
/// How long queued answers may take to flush once the connection is done.
const CLOSE_FLUSH: Duration = Duration::from_secs(5);

static STARTED: OnceLock<Instant> = OnceLock::new();

/// Marks silkd's start for `Info.uptime_ms`.
pub fn mark_start() {
    STARTED.get_or_init(Instant::now);
}

/// Serves one connection until the peer leaves or misbehaves.
pub async fn serve<S>(stream: S, table: Arc<ProcessTable>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    // The first frame decides what the stream is: a TCP tunnel (`Connect`) or requests.
    let (rd, wr) = tokio::io::split(Box::pin(stream));
    let mut reader = FramedRead::new(rd, GuestCodec::new());
    let head = match reader.next().await {
        None => return,
        Some(Ok(Request::Connect { port })) => {
            let early = reader.read_buffer().clone();
            let stream = reader.into_inner().unsplit(wr);
            return crate::tunnel::serve(stream, early, port).await;
        }
        Some(head) => head,
    };
    let (tx, rx) = mpsc::channel(OUT_QUEUE);
    let mut writer = tokio::spawn(write_loop(FramedWrite::new(wr, GuestCodec::new()), rx));
    if let Err(e) = rpc_loop(Some(head), &mut reader, &tx, &table).await {
        tracing::debug!("closing connection: {e}");
        let _ = tx.send(e.to_response()).await;
    }
    drop(tx);
    if tokio::time::timeout(CLOSE_FLUSH, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
}

/// The read half of a connection, framed.
pub(crate) type Reader<S> = FramedRead<tokio::io::ReadHalf<S>, GuestCodec>;
/// The queue to a connection's writer task.
pub(crate) type Out = mpsc::Sender<Response>;

/// Returns `Ok` when the peer leaves cleanly, `Err` for a fault to answer before closing.
async fn rpc_loop<S: AsyncRead>(
    mut head: Option<std::result::Result<Request, wire::Error>>,
    reader: &mut Reader<S>,
    tx: &Out,
    table: &ProcessTable,
) -> Result<()> {
    loop {
        let next = match head.take() {
            Some(h) => Some(h),
            None => reader.next().await,
        };
        let req = match next {
            None => return Ok(()),
            Some(r) => r?,
        };
        let answer = match req {
            Request::Exec {
                argv,
                cwd,
                env,
                stdin,
                timeout_ms,
                user,
                pty,
                detach,
            } => {
                let spec = Spec {
                    argv,
                    cwd,
                    env: env.unwrap_or_default(),
                    stdin,
                    user,
                    pty,
                };
                let ran = if detach {
                    exec_detached(spec, timeout_ms, reader, tx, table).await?
                } else {
                    exec(spec, timeout_ms, reader, tx, table).await?
                };
                match ran {
                    Some(answer) => answer,
                    None => return Ok(()),
                }
            }
            Request::Attach { pid } => match table.attachable(pid) {
                Err(e) => e.to_response(),
                Ok(det) => match crate::detach::attach(det, pid, reader, tx).await? {
                    Some(answer) => answer,
                    None => return Ok(()),
                },
            },
            Request::Kill { pid, signal } => kill(table, pid, signal),
            Request::Ps => Response::Procs {
                procs: table.list(),
            },
            Request::Info => Response::Info {
                version: env!("CARGO_PKG_VERSION").to_string(),
                proto: wire::PROTO_VERSION,
                uptime_ms: STARTED.get_or_init(Instant::now).elapsed().as_millis() as u64,
                procs: table.running(),
            },
            Request::Stdin { .. } | Request::StdinClose => {
                return Err(Error::BadRequest(
                    "stdin frame outside an exec with stdin: true".into(),
                ))
            }
            Request::Connect { .. } => {
                return Err(Error::BadRequest(
                    "connect is only valid as a stream's first frame".into(),
                ))
            }
            Request::Resize { .. } => {
                return Err(Error::BadRequest(
                    "resize frame outside an exec with a pty".into(),
                ))
            }
            Request::Data { .. } | Request::DataEnd => {
                return Err(Error::BadRequest(
                    "data frame outside a file write or unpack".into(),
                ))
            }
            file => match crate::files::serve(file, reader, tx).await? {
                crate::files::Flow::Answer(answer) => answer,
                crate::files::Flow::Answered => continue,
                crate::files::Flow::PeerGone => return Ok(()),
            },
        };
        if tx.send(answer).await.is_err() {
            return Ok(());
        }
    }
}

fn kill(table: &ProcessTable, pid: u32, signal: Option<i32>) -> Response {
    let signal = match signal.map(Signal::try_from).transpose() {
        Ok(s) => s.unwrap_or(Signal::SIGKILL),
        Err(_) => {
            return Response::error(
                ErrorKind::BadRequest,
                format!("unknown signal {}", signal.unwrap_or_default()),
            )
        }
    };
    match table.kill(pid, signal) {
        Ok(KillOutcome::Done) => Response::Done,
        Ok(KillOutcome::NotFound) => {
            Response::error(ErrorKind::NotFound, format!("no command with pid {pid}"))
        }
        Err(e) => e.to_response(),
    }
}

/// Runs one command to its end. Returns its terminal answer (`Exit`, or `Error` when it
/// could not start), `None` when the peer left (the command is then killed), or `Err`
/// for a protocol fault (the command is killed too).
async fn exec<S: AsyncRead>(
    spec: Spec,
    timeout_ms: Option<u64>,
    reader: &mut Reader<S>,
    tx: &Out,
    table: &ProcessTable,
) -> Result<Option<Response>> {
    // Under a pty stdin is the terminal: keystrokes are always accepted.
    let wants_stdin = spec.stdin || spec.pty.is_some();
    let (spawned, mut status_rx) = match table.spawn(&spec, false) {
        Ok(s) => s,
        Err(e) => return Ok(Some(e.to_response())),
    };
    let pid = spawned.pid;
    // Whatever way we leave, a command whose peer is gone must not run on.
    let mut group = GroupGuard {
        table,
        pid,
        armed: true,
    };
    if tx.send(Response::Started { pid }).await.is_err() {
        return Ok(None);
    }
    let mut pumps = PumpSet(vec![tokio::spawn(pump(
        spawned.stdout,
        tx.clone(),
        Stream::Stdout,
        status_rx.clone(),
    ))]);
    if let Some(stderr) = spawned.stderr {
        pumps.0.push(tokio::spawn(pump(
            stderr,
            tx.clone(),
            Stream::Stderr,
            status_rx.clone(),
        )));
    }
    let pty_master = spawned.pty;
    let mut stdin = StdinFeed::new(spawned.stdin);
    let deadline = timeout_ms.map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
    let mut timed_out = false;
    let mut status: Option<ExitStatus> = None;
    let mut pumps_done = std::pin::pin!(pumps.join());
    let mut pumps_finished = false;

    while status.is_none() || !pumps_finished {
        tokio::select! {
            changed = status_rx.changed(), if status.is_none() => {
                status = *status_rx.borrow_and_update();
                if changed.is_err() && status.is_none() {
                    return Err(Error::BadRequest("process table lost the command".into()));
                }
            }
            () = sleep_until(deadline), if status.is_none() && !timed_out => {
                timed_out = true;
                if let Err(e) = table.kill(pid, Signal::SIGKILL) {
                    tracing::error!(pid, "timeout kill failed: {e}");
                }
            }
            () = &mut pumps_done, if !pumps_finished => pumps_finished = true,
            written = stdin.write_pending(), if stdin.has_pending() => {
                if let Err(e) = written {
                    tracing::debug!(pid, "stdin closed by the command: {e}");
                    stdin.close();
                }
            }
            frame = reader.next(), if !stdin.has_pending() => match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(Request::Stdin { data })) if wants_stdin => stdin.push(data),
                Some(Ok(Request::StdinClose)) if wants_stdin => stdin.close_after_pending(),
                Some(Ok(Request::Resize { rows, cols })) if pty_master.is_some() => {
                    wire::Pty::check_size(rows, cols).map_err(Error::BadRequest)?;
                    let master = pty_master.as_ref().expect("guarded");
                    crate::proc::pty::resize(master, rows, cols)?;
                }
                Some(Ok(other)) => {
                    return Err(Error::BadRequest(format!(
                        "{} received while exec {pid} runs; only stdin frames may be sent during an exec",
                        verb(&other)
                    )))
                }
            },
        }
    }
    group.armed = false;
    let (code, signal) = match status.expect("loop ends with a status") {
        ExitStatus::Code(c) => (Some(c), None),
        ExitStatus::Signal(s) => (None, Some(s)),
    };
    Ok(Some(Response::Exit {
        code,
        signal,
        timed_out,
    }))
}

/// Starts a detached command (its output pumped into a ring of its own) and serves
/// this connection as its first attached client: leaving does not kill it.
async fn exec_detached<S: AsyncRead>(
    spec: Spec,
    timeout_ms: Option<u64>,
    reader: &mut Reader<S>,
    tx: &Out,
    table: &ProcessTable,
) -> Result<Option<Response>> {
    if timeout_ms.is_some() {
        // A timeout belongs to a caller waiting for the end; a detached command outlives
        // its caller, and is ended with `kill`.
        return Ok(Some(Response::error(
            ErrorKind::BadRequest,
            "timeout_ms cannot be combined with detach: a detached command is ended with kill",
        )));
    }
    let (spawned, status_rx) = match table.spawn(&spec, true) {
        Ok(s) => s,
        Err(e) => return Ok(Some(e.to_response())),
    };
    let pid = spawned.pid;
    let det = crate::detach::Detached::start(spawned, status_rx, table.ring_bytes());
    table.set_detached(pid, det.clone());
    crate::detach::attach(det, pid, reader, tx).await
}

pub(crate) fn verb(r: &Request) -> &'static str {
    match r {
        Request::Exec { .. } => "exec",
        Request::Stdin { .. } => "stdin",
        Request::StdinClose => "stdin_close",
        Request::Resize { .. } => "resize",
        Request::Attach { .. } => "attach",
        Request::Kill { .. } => "kill",
        Request::Ps => "ps",
        Request::Info => "info",
        Request::FileRead(_) => "file_read",
        Request::FileWrite(_) => "file_write",
        Request::Data { .. } => "data",
        Request::DataEnd => "data_end",
        Request::Stat(_) => "stat",
        Request::List(_) => "list",
        Request::Mkdir(_) => "mkdir",
        Request::Remove(_) => "remove",
        Request::Rename(_) => "rename",
        Request::TarOut(_) => "tar_out",
        Request::TarIn(_) => "tar_in",
        Request::Watch(_) => "watch",
        Request::Connect { .. } => "connect",
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// SIGKILLs the command's group on drop unless disarmed (the exec ran to its end).
struct GroupGuard<'a> {
    table: &'a ProcessTable,
    pid: u32,
    armed: bool,
}

impl Drop for GroupGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = self.table.kill(self.pid, Signal::SIGKILL) {
                tracing::error!(pid = self.pid, "kill on give-up failed: {e}");
            }
        }
    }
}

/// The output pumps of one exec; aborted on drop, so an abandoned exec leaves none.
struct PumpSet(Vec<tokio::task::JoinHandle<()>>);

impl PumpSet {
    async fn join(&mut self) {
        for h in &mut self.0 {
            // A pump only ends by returning; a join error would mean it was aborted.
            let _ = h.await;
        }
    }
}

impl Drop for PumpSet {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// Copies one pipe into output frames. Each frame waits for queue space, so a slow peer
/// stops the reads and the child blocks on its full pipe: nothing is dropped, nothing
/// piles up. Once the leader has exited, a pipe silent for [`EXIT_GRACE`] is abandoned
/// (something the command left behind still holds it open).
async fn pump(
    mut pipe: pipe::Receiver,
    tx: Out,
    stream: Stream,
    mut status: watch::Receiver<Option<ExitStatus>>,
) {
    let mut leader_exited = status.borrow().is_some();
    loop {
        // Read straight into the frame's own buffer (no zeroing, no copy out of a
        // scratch buffer): each byte is copied once here, from the pipe.
        let mut buf = Vec::with_capacity(CHUNK);
        let read = if leader_exited {
            match tokio::time::timeout(EXIT_GRACE, pipe.read_buf(&mut buf)).await {
                Ok(r) => r,
                Err(_) => return,
            }
        } else {
            tokio::select! {
                r = pipe.read_buf(&mut buf) => r,
                _ = status.changed() => {
                    leader_exited = true;
                    continue;
                }
            }
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        // A writer in small pieces (`head`, a shell loop) leaves several in the pipe by
        // the time we read: take what is already there, up to a whole chunk, so each
        // frame (encode, relay, decode, write on the client) carries more bytes. Never
        // waits: an empty pipe sends what we have now.
        while buf.len() < CHUNK {
            match pipe.try_read_buf(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let data = buf;
        let frame = match stream {
            Stream::Stdout => Response::Stdout { data },
            Stream::Stderr => Response::Stderr { data },
        };
        if tx.send(frame).await.is_err() {
            return;
        }
    }
}

/// The child's stdin: at most one chunk pending at a time, written without blocking the
/// exec loop, so a child that does not read its stdin stalls only the sender.
struct StdinFeed {
    pipe: Option<pipe::Sender>,
    pending: Vec<u8>,
    close_when_drained: bool,
}

impl StdinFeed {
    fn new(pipe: Option<pipe::Sender>) -> Self {
        StdinFeed {
            pipe,
            pending: Vec::new(),
            close_when_drained: false,
        }
    }

    fn has_pending(&self) -> bool {
        self.pipe.is_some() && !self.pending.is_empty()
    }

    fn push(&mut self, data: Vec<u8>) {
        if self.pipe.is_some() {
            self.pending = data;
        }
    }

    fn close_after_pending(&mut self) {
        if self.pending.is_empty() {
            self.close();
        } else {
            self.close_when_drained = true;
        }
    }

    fn close(&mut self) {
        self.pipe = None;
        self.pending.clear();
    }

    /// Writes some of the pending chunk; cancel-safe.
    async fn write_pending(&mut self) -> std::io::Result<()> {
        let Some(pipe) = self.pipe.as_mut() else {
            return Ok(());
        };
        let n = pipe.write(&self.pending).await?;
        self.pending.drain(..n);
        if self.pending.is_empty() && self.close_when_drained {
            self.close();
        }
        Ok(())
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut sink: FramedWrite<W, GuestCodec>,
    mut rx: mpsc::Receiver<Response>,
) {
    while let Some(msg) = rx.recv().await {
        if sink.feed(msg).await.is_err() {
            return;
        }
        if rx.is_empty() && sink.flush().await.is_err() {
            return;
        }
    }
    let _ = sink.close().await;
}
