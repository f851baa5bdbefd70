//! [`Process`]: a command spawned over the relay, and [`Sandbox::spawn`] that starts it
//! (defined here, not in `sandbox.rs`, so that `sandbox` need not know `Process`). Owns
//! the relay connection it was started on: a pump task reads its output frames, a feeder
//! task writes its stdin frames. Kills go on a fresh relay connection (silkd takes any
//! other frame during an exec as a protocol fault), and a `Process` dropped while running
//! kills its command.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_util::sync::PollSender;
use wire::{Request, Response};

use crate::command::Command;
use crate::error::{Error, Result};
use crate::outcome::{ExitStatus, Output, Signal};
use crate::relay::Relay;
use crate::sandbox::Sandbox;

/// Output frames queued per channel before the pump stops reading the relay. Frames are
/// at most 64 KiB, so a reader that falls behind holds at most ~1 MiB here; past that,
/// backpressure reaches the command through silkd.
const QUEUE: usize = 16;

/// Largest stdin frame sent (silkd's own output frames are this size too).
const STDIN_CHUNK: usize = 64 * 1024;

/// Bound on a kill made on a caller's behalf (drop, expired wait) and on the wait for the
/// exit that follows it.
const KILL_BOUND: Duration = Duration::from_secs(5);

impl Sandbox {
    /// Starts a command over the relay and returns as soon as it runs, with its output
    /// streaming. See [`Process`] for stdin, output, waiting and killing.
    pub async fn spawn(&self, cmd: &Command) -> Result<Process> {
        let mut relay = self.relay().await?;
        relay
            .send(cmd.exec_frame())
            .await
            .map_err(Error::transport)?;
        match relay.next().await {
            Some(Ok(Response::Started { pid })) => Ok(Process::start(
                self.clone(),
                pid,
                relay,
                Streams {
                    stdin: cmd.reads_stdin(),
                    resizable: cmd.has_pty(),
                    detached: cmd.is_detached(),
                },
            )),
            Some(Ok(Response::Error { kind, message })) => Err(Error::from_guest(kind, message)),
            Some(Ok(other)) => Err(Error::Protocol(format!("expected started, got {other:?}"))),
            Some(Err(e)) => Err(Error::transport(e)),
            None => Err(Error::Protocol(
                "the relay closed before the command started".into(),
            )),
        }
    }

    /// Follows a command started with [`Command::detach`](crate::Command::detach) (its pid
    /// from [`Process::pid`] or [`Sandbox::processes`]): the returned [`Process`] first
    /// delivers the output the guest's ring still holds, then live output, then the exit.
    /// Its stdin writes to the command's stdin (when it was started with one, or a pty),
    /// [`Process::resize`] reaches its terminal, and dropping it leaves the command
    /// running. An unknown pid is [`Error::NotFound`]; one not detached, `BadRequest`.
    pub async fn attach(&self, pid: u32) -> Result<Process> {
        let mut relay = self.relay().await?;
        relay
            .send(Request::Attach { pid })
            .await
            .map_err(Error::transport)?;
        match relay.next().await {
            Some(Ok(Response::Started { pid })) => Ok(Process::start(
                self.clone(),
                pid,
                relay,
                Streams {
                    stdin: true,
                    resizable: true,
                    detached: true,
                },
            )),
            Some(Ok(Response::Error { kind, message })) => Err(Error::from_guest(kind, message)),
            Some(Ok(other)) => Err(Error::Protocol(format!("expected started, got {other:?}"))),
            Some(Err(e)) => Err(Error::transport(e)),
            None => Err(Error::Protocol("the relay closed before attaching".into())),
        }
    }
}

/// What a started [`Process`] may do besides reading output.
struct Streams {
    /// It has a stdin writer.
    stdin: bool,
    /// `resize` is sent (a pty, or an attach: the guest checks).
    resizable: bool,
    /// It outlives this `Process`: dropping it or its stdin ends neither.
    detached: bool,
}

/// One thing a running command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Bytes it wrote to stdout.
    Stdout(Bytes),
    /// Bytes it wrote to stderr.
    Stderr(Bytes),
    /// It ended; no event follows.
    Exit(ExitStatus),
}

/// A command running in a sandbox, started by [`Sandbox::spawn`].
///
/// Its output can be read three ways, chosen before the first read:
/// - [`next_event`](Process::next_event): stdout, stderr and the exit, in order;
/// - [`take_stdout`](Process::take_stdout) / [`take_stderr`](Process::take_stderr): byte
///   streams ([`AsyncRead`] and [`Stream`]) of their own, then [`wait`](Process::wait);
/// - [`output`](Process::output): everything, collected.
///
/// Output nobody takes or reads is discarded by [`wait`](Process::wait). Output that is
/// taken but not read holds the command back (as a full pipe would).
///
/// A `Process` dropped before its exit was seen kills the command (its whole process
/// group) through a fresh relay connection, in a task on the current tokio runtime; its
/// own connection closes too, which makes the guest kill it as well.
pub struct Process {
    pid: u32,
    sandbox: Sandbox,
    stdin: Option<ProcessStdin>,
    /// The feeder's queue, kept for resizes (a pty command only).
    control: Option<mpsc::Sender<StdinMsg>>,
    events: mpsc::Receiver<Result<Event>>,
    pump: Arc<Pump>,
    /// How it ended, once `next_event` delivered the end.
    end: Option<Result<ExitStatus>>,
    /// Detached: dropping this `Process` leaves the command running.
    detached: bool,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("pid", &self.pid)
            .field("sandbox", &self.sandbox.id())
            .field("end", &self.end)
            .finish()
    }
}

impl Process {
    fn start(sandbox: Sandbox, pid: u32, relay: Relay, streams: Streams) -> Process {
        let (sink, frames) = relay.split();
        let (events_tx, events) = mpsc::channel(QUEUE);
        let pump = Arc::new(Pump {
            pending: Mutex::new(Some(PumpState {
                frames,
                events: events_tx,
                stdout: Route::Events,
                stderr: Route::Events,
            })),
            task: Mutex::new(None),
            over: AtomicBool::new(false),
        });
        // Without stdin the sink is dropped here; the connection lives on in `frames`.
        let started = streams
            .stdin
            .then(|| ProcessStdin::start(sink, !streams.detached));
        let (stdin, control) = match started {
            Some((stdin, control)) => (Some(stdin), streams.resizable.then_some(control)),
            None => (None, None),
        };
        Process {
            pid,
            sandbox,
            stdin,
            control,
            events,
            pump,
            end: None,
            detached: streams.detached,
        }
    }

    /// The command's pid in the guest (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The sandbox it runs in.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// Takes the stdin writer: `Some` once, for a command built with
    /// [`Command::stdin(true)`](crate::Command::stdin). Closing it (or dropping it) is EOF.
    pub fn stdin(&mut self) -> Option<ProcessStdin> {
        self.stdin.take()
    }

    /// Takes stdout as a byte stream of its own; `None` when already taken or when output
    /// has started to be read another way. [`OutputStream::lines`] reads it line by line.
    pub fn take_stdout(&mut self) -> Option<OutputStream> {
        self.pump.take(|state| &mut state.stdout)
    }

    /// Takes stderr as a byte stream of its own; as [`take_stdout`](Process::take_stdout).
    pub fn take_stderr(&mut self) -> Option<OutputStream> {
        self.pump.take(|state| &mut state.stderr)
    }

    /// The next event; `Ok(None)` after the exit was delivered. An error ends the events:
    /// [`Error::Timeout`] when the command's own timeout killed it, a guest or transport
    /// error when the relay broke.
    pub async fn next_event(&mut self) -> Result<Option<Event>> {
        if self.end.is_some() {
            return Ok(None);
        }
        self.pump.launch();
        let event = match self.events.recv().await {
            Some(event) => event,
            None => Err(Error::Protocol(
                "the output pump ended without an exit".into(),
            )),
        };
        match event {
            Ok(Event::Exit(status)) => {
                self.end = Some(Ok(status));
                Ok(Some(Event::Exit(status)))
            }
            Ok(output) => Ok(Some(output)),
            Err(e) => {
                self.end = Some(Err(e.clone()));
                Err(e)
            }
        }
    }

    /// Waits for the command to end. Closes stdin first if it is still held here (as
    /// `std::process::Child::wait` does); discards output not taken.
    pub async fn wait(&mut self) -> Result<ExitStatus> {
        drop(self.stdin.take());
        while self.end.is_none() {
            self.next_event().await?;
        }
        self.end.clone().expect("the loop ends once `end` is set")
    }

    /// Waits at most `limit`; past it, kills the command, waits (bounded) for it to end,
    /// and fails with [`Error::Timeout`].
    pub async fn wait_timeout(&mut self, limit: Duration) -> Result<ExitStatus> {
        if let Ok(ended) = tokio::time::timeout(limit, self.wait()).await {
            return ended;
        }
        self.kill().await?;
        match tokio::time::timeout(KILL_BOUND, self.wait()).await {
            Ok(_) => Err(Error::Timeout { partial: None }),
            Err(_) => Err(Error::Guest(format!(
                "pid {} was still running {}s after SIGKILL",
                self.pid,
                KILL_BOUND.as_secs()
            ))),
        }
    }

    /// Waits for the command and collects the output not taken, like a buffered exec
    /// (but with no cap: mind the command's output size).
    pub async fn output(mut self) -> Result<Output> {
        drop(self.stdin.take());
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        loop {
            match self.next_event().await? {
                Some(Event::Stdout(b)) => stdout.extend_from_slice(&b),
                Some(Event::Stderr(b)) => stderr.extend_from_slice(&b),
                Some(Event::Exit(exit)) => {
                    return Ok(Output {
                        exit,
                        stdout,
                        stderr,
                    })
                }
                None => unreachable!("`Exit` returns before events run out"),
            }
        }
    }

    /// Changes the window size of a command started with
    /// [`Command::pty`](crate::Command::pty); the guest's kernel sends SIGWINCH to the
    /// terminal's foreground process group. A size outside 1..=4096 is refused here, as
    /// the guest would take it as a protocol fault and end the command.
    pub async fn resize(&self, rows: u32, cols: u32) -> Result<()> {
        let Some(control) = &self.control else {
            return Err(Error::BadRequest(
                "resize needs a command started with Command::pty".into(),
            ));
        };
        wire::Pty::check_size(rows, cols).map_err(Error::BadRequest)?;
        control
            .send(StdinMsg::Resize(rows, cols))
            .await
            .map_err(|_| Error::transport(stdin_gone(())))
    }

    /// Kills the command's whole process group with SIGKILL (on a fresh relay
    /// connection). Killing a command that already ended is not an error.
    pub async fn kill(&self) -> Result<()> {
        self.kill_with(Signal::Kill).await
    }

    /// Sends `signal` ([`Signal::Term`], or a number) to the command's whole process group.
    pub async fn kill_with(&self, signal: impl Into<i32>) -> Result<()> {
        self.sandbox.kill(self.pid, Some(signal.into())).await
    }

    fn ended(&self) -> bool {
        self.end.is_some() || self.pump.over.load(Ordering::Acquire)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.pump.stop();
        if self.ended() || self.detached {
            return;
        }
        // Outside a runtime nothing can be spawned; the closed connection still makes the
        // guest kill the command.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let sandbox = self.sandbox.clone();
            let pid = self.pid;
            runtime.spawn(async move {
                let _ = tokio::time::timeout(KILL_BOUND, sandbox.kill(pid, None)).await;
            });
        }
    }
}

/// Where the pump sends one output stream.
enum Route {
    /// Into the event channel.
    Events,
    /// Into a taken [`OutputStream`].
    Stream(mpsc::Sender<Bytes>),
    /// Nowhere: the taken stream was dropped.
    Discard,
}

/// The output pump: started lazily, on the first read of any kind, so that taking a
/// stream never races output already routed to the events.
struct Pump {
    pending: Mutex<Option<PumpState>>,
    task: Mutex<Option<AbortHandle>>,
    /// Set once a terminal frame (or the connection's end) was read.
    over: AtomicBool,
}

struct PumpState {
    frames: SplitStream<Relay>,
    events: mpsc::Sender<Result<Event>>,
    stdout: Route,
    stderr: Route,
}

impl Pump {
    fn take(
        self: &Arc<Self>,
        route: impl FnOnce(&mut PumpState) -> &mut Route,
    ) -> Option<OutputStream> {
        let mut pending = self.pending.lock().expect("pump lock");
        let route = route(pending.as_mut()?);
        if !matches!(route, Route::Events) {
            return None;
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        *route = Route::Stream(tx);
        Some(OutputStream {
            rx,
            buf: Bytes::new(),
            pump: Arc::clone(self),
        })
    }

    fn launch(self: &Arc<Self>) {
        // `pending` stays locked until the task is recorded, so a concurrent `stop` either
        // finds the state (and nothing is launched) or finds the task to abort.
        let mut pending = self.pending.lock().expect("pump lock");
        let Some(state) = pending.take() else {
            return;
        };
        let task = tokio::spawn(pump(state, Arc::clone(self)));
        *self.task.lock().expect("pump lock") = Some(task.abort_handle());
    }

    fn stop(&self) {
        let mut pending = self.pending.lock().expect("pump lock");
        drop(pending.take());
        if let Some(task) = self.task.lock().expect("pump lock").take() {
            task.abort();
        }
    }
}

/// Reads frames until the exec's terminal one; the outcome goes last on the event channel,
/// after the taken streams were closed.
async fn pump(mut state: PumpState, shared: Arc<Pump>) {
    let outcome = loop {
        let (route, data) = match state.frames.next().await {
            Some(Ok(Response::Stdout { data })) => (&mut state.stdout, Event::Stdout(data.into())),
            Some(Ok(Response::Stderr { data })) => (&mut state.stderr, Event::Stderr(data.into())),
            Some(Ok(Response::Exit {
                timed_out: true, ..
            })) => break Err(Error::Timeout { partial: None }),
            Some(Ok(Response::Exit { code, signal, .. })) => {
                break ExitStatus::from_parts(code, signal)
                    .map(Event::Exit)
                    .ok_or_else(|| Error::Protocol("exit with neither code nor signal".into()))
            }
            Some(Ok(Response::Error { kind, message })) => {
                break Err(Error::from_guest(kind, message))
            }
            Some(Ok(other)) => {
                break Err(Error::Protocol(format!(
                    "unexpected {other:?} during an exec"
                )))
            }
            Some(Err(e)) => break Err(Error::transport(e)),
            None => {
                break Err(Error::Protocol(
                    "the relay closed before the command exited".into(),
                ))
            }
        };
        match route {
            Route::Events => {
                // A closed event channel means the Process is gone and this task is
                // being aborted; nothing left to deliver to.
                let _ = state.events.send(Ok(data)).await;
            }
            Route::Stream(tx) => {
                let (Event::Stdout(bytes) | Event::Stderr(bytes)) = data else {
                    unreachable!("only output is routed")
                };
                if tx.send(bytes).await.is_err() {
                    *route = Route::Discard;
                }
            }
            Route::Discard => {}
        }
    };
    shared.over.store(true, Ordering::Release);
    state.stdout = Route::Discard;
    state.stderr = Route::Discard;
    let _ = state.events.send(outcome).await;
}

/// One of a spawned command's output streams, taken with [`Process::take_stdout`] or
/// [`Process::take_stderr`]. Read it as [`AsyncRead`] or as a [`Stream`] of chunks; it
/// ends when the command ends (why it ended comes from [`Process::wait`]).
pub struct OutputStream {
    rx: mpsc::Receiver<Bytes>,
    buf: Bytes,
    pump: Arc<Pump>,
}

impl OutputStream {
    /// The next chunk of bytes as it arrived; `None` at the end. (The same as
    /// `StreamExt::next`, without importing `futures`.)
    pub async fn next_chunk(&mut self) -> Option<Bytes> {
        futures::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

impl Stream for OutputStream {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        self.pump.launch();
        if !self.buf.is_empty() {
            return Poll::Ready(Some(std::mem::take(&mut self.buf)));
        }
        self.rx.poll_recv(cx)
    }
}

impl AsyncRead for OutputStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.pump.launch();
        if self.buf.is_empty() {
            match ready!(self.rx.poll_recv(cx)) {
                Some(chunk) => self.buf = chunk,
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = self.buf.len().min(out.remaining());
        out.put_slice(&self.buf[..n]);
        self.buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

enum StdinMsg {
    Data(Bytes),
    Close,
    Resize(u32, u32),
}

/// A spawned command's stdin, from [`Process::stdin`]. Write with [`send`](ProcessStdin::send)
/// or as an [`AsyncWrite`] (e.g. `tokio::io::copy` into it); [`close`](ProcessStdin::close),
/// `shutdown` or dropping it sends EOF.
pub struct ProcessStdin {
    tx: PollSender<StdinMsg>,
    closed: bool,
}

impl ProcessStdin {
    /// The writer, and a second handle on its queue for resizes (dropped unless the
    /// command has a pty, so that dropping the writer still means EOF).
    fn start(
        sink: SplitSink<Relay, Request>,
        eof_on_drop: bool,
    ) -> (ProcessStdin, mpsc::Sender<StdinMsg>) {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(feed(sink, rx, eof_on_drop));
        let control = tx.clone();
        let stdin = ProcessStdin {
            tx: PollSender::new(tx),
            closed: false,
        };
        (stdin, control)
    }

    /// Writes all of `data` (what `write_all` does, with the SDK's error type).
    pub async fn send(&mut self, data: &[u8]) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        self.write_all(data).await.map_err(Error::transport)
    }

    /// Sends EOF: the command reads end-of-file once the bytes already written arrive.
    pub async fn close(mut self) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        self.shutdown().await.map_err(Error::transport)
    }
}

impl AsyncWrite for ProcessStdin {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "stdin was closed",
            )));
        }
        ready!(self.tx.poll_reserve(cx)).map_err(stdin_gone)?;
        let n = buf.len().min(STDIN_CHUNK);
        self.tx
            .send_item(StdinMsg::Data(Bytes::copy_from_slice(&buf[..n])))
            .map_err(stdin_gone)?;
        Poll::Ready(Ok(n))
    }

    /// Bytes are handed to the feeder task as they are written; nothing waits here.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.closed {
            return Poll::Ready(Ok(()));
        }
        ready!(self.tx.poll_reserve(cx)).map_err(stdin_gone)?;
        self.tx.send_item(StdinMsg::Close).map_err(stdin_gone)?;
        self.closed = true;
        self.tx.close();
        Poll::Ready(Ok(()))
    }
}

fn stdin_gone<T>(_: T) -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the command's stdin is gone (it ended or the relay broke)",
    )
}

/// Writes stdin (and resize) frames in order; EOF on `Close`, or when every handle is
/// dropped unless the command is detached (other clients may still be writing to it).
/// Resizes may still follow a `Close` (a pty's stdin closed, its window not).
async fn feed(
    mut sink: SplitSink<Relay, Request>,
    mut rx: mpsc::Receiver<StdinMsg>,
    eof_on_drop: bool,
) {
    let mut closed = false;
    while let Some(msg) = rx.recv().await {
        let frame = match msg {
            StdinMsg::Data(_) if closed => continue,
            StdinMsg::Data(data) => Request::Stdin { data: data.into() },
            StdinMsg::Close if closed => continue,
            StdinMsg::Close => {
                closed = true;
                Request::StdinClose
            }
            StdinMsg::Resize(rows, cols) => Request::Resize { rows, cols },
        };
        if sink.send(frame).await.is_err() {
            return;
        }
    }
    if !closed && eof_on_drop {
        let _ = sink.send(Request::StdinClose).await;
    }
}
