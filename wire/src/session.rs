//! The session layer of a VM channel (virtio-serial): a handshake that starts every host
//! session, then yamux with one stream per RPC.
//!
//! A virtio-serial port survives host disconnects and may deliver bytes from an earlier
//! session to the next one (a guest write blocked while the host was away completes
//! later; a restored clone may still be inside its golden's session). So each session
//! starts with a line-based handshake carrying a fresh nonce:
//!
//! ```text
//! host → guest: "\nSILKD-HELLO v1 nonce=<32 hex> time_ns=<u64> entropy=<64 hex> hostname=<name>\n"
//!               (resent every 50 ms until READY arrives)
//! guest → host: "\nSILKD-READY v1 nonce=<32 hex>\n"
//! host → guest: "\nSILKD-GO v1 nonce=<32 hex>\n"
//! ```
//! The guest discards input until a HELLO, answers READY, then discards input (duplicate
//! HELLOs) until the GO with its nonce. The host discards input until the READY with its
//! nonce. Resending covers a guest that swallowed the first HELLO in a stale session (a
//! restored clone still running its golden's yamux); GO fences the resends off from the
//! yamux bytes that follow. Then both sides run yamux: host = client, guest = server.
//!
//! This module does no I/O of its own: it runs on whatever `AsyncRead + AsyncWrite` it
//! is given.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

const HELLO_MAGIC: &[u8] = b"\nSILKD-HELLO v1 ";
const READY_MAGIC: &[u8] = b"\nSILKD-READY v1 nonce=";
const GO_MAGIC: &[u8] = b"\nSILKD-GO v1 nonce=";
/// How often the host repeats its HELLO until the guest answers.
const HELLO_RESEND: Duration = Duration::from_millis(50);
/// Longest handshake line accepted after its magic.
const MAX_LINE: usize = 512;

/// What the host hands every new session: identity and freshness for a restored clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Fresh per session, 16 random bytes.
    pub nonce: [u8; 16],
    /// Host wall clock, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// Random bytes for the guest kernel's pool.
    pub entropy: [u8; 32],
    /// Hostname for the guest (`[A-Za-z0-9.-]`, at most 63 bytes).
    pub hostname: String,
}

impl Hello {
    /// The exact bytes the host sends.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = HELLO_MAGIC.to_vec();
        out.extend_from_slice(
            format!(
                "nonce={} time_ns={} entropy={} hostname={}\n",
                hex(&self.nonce),
                self.time_ns,
                hex(&self.entropy),
                self.hostname
            )
            .as_bytes(),
        );
        out
    }

    fn parse(line: &str) -> io::Result<Hello> {
        let mut nonce = None;
        let mut time_ns = None;
        let mut entropy = None;
        let mut hostname = None;
        for field in line.split(' ') {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| bad("field without ="))?;
            match k {
                "nonce" => nonce = Some(unhex::<16>(v)?),
                "time_ns" => time_ns = Some(v.parse().map_err(|_| bad("bad time_ns"))?),
                "entropy" => entropy = Some(unhex::<32>(v)?),
                "hostname" => hostname = Some(valid_hostname(v)?.to_string()),
                _ => {} // Later versions may add fields.
            }
        }
        Ok(Hello {
            nonce: nonce.ok_or_else(|| bad("no nonce"))?,
            time_ns: time_ns.ok_or_else(|| bad("no time_ns"))?,
            entropy: entropy.ok_or_else(|| bad("no entropy"))?,
            hostname: hostname.ok_or_else(|| bad("no hostname"))?,
        })
    }
}

fn valid_hostname(v: &str) -> io::Result<&str> {
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok {
        Ok(v)
    } else {
        Err(bad("bad hostname"))
    }
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("handshake: {msg}"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> io::Result<[u8; N]> {
    if s.len() != N * 2 {
        return Err(bad("hex field of the wrong length"));
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).map_err(|_| bad("bad hex"))?;
    }
    Ok(out)
}

/// Finds `magic` in a byte stream and collects the rest of its line. Keeps its state
/// between bytes, so the reading around it may be cancelled and resumed.
struct LineScanner {
    magic: &'static [u8],
    matched: usize,
    line: Vec<u8>,
}

impl LineScanner {
    fn new(magic: &'static [u8]) -> Self {
        LineScanner {
            magic,
            matched: 0,
            line: Vec::new(),
        }
    }

    /// Feeds one byte; returns the line (without `\n`) once it is complete.
    fn feed(&mut self, byte: u8) -> io::Result<Option<String>> {
        if self.matched < self.magic.len() {
            if byte == self.magic[self.matched] {
                self.matched += 1;
            } else {
                // Every magic starts with '\n' and has no other: restarting is exact.
                self.matched = usize::from(byte == self.magic[0]);
            }
            return Ok(None);
        }
        if byte == b'\n' {
            self.matched = 0;
            let line = std::mem::take(&mut self.line);
            return String::from_utf8(line)
                .map(Some)
                .map_err(|_| bad("not UTF-8"));
        }
        if self.line.len() == MAX_LINE {
            return Err(bad("line too long"));
        }
        self.line.push(byte);
        Ok(None)
    }
}

/// Reads one byte; EOF is an error.
async fn read_byte<R: AsyncRead + Unpin>(io: &mut R) -> io::Result<u8> {
    let mut byte = [0u8; 1];
    if io.read(&mut byte).await? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "channel closed during the handshake",
        ));
    }
    Ok(byte[0])
}

/// Reads until a complete `magic` line; returns the rest of that line.
async fn read_line_after<R: AsyncRead + Unpin>(
    io: &mut R,
    magic: &'static [u8],
) -> io::Result<String> {
    let mut scan = LineScanner::new(magic);
    loop {
        if let Some(line) = scan.feed(read_byte(io).await?)? {
            return Ok(line);
        }
    }
}

/// Guest side: waits for the host's `HELLO` (skipping stale bytes), answers `READY`,
/// waits for `GO`, and returns the hello for the caller to apply (clock, entropy,
/// hostname) and the stream to run yamux on (it may hold bytes read ahead).
pub async fn guest_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    io: S,
) -> io::Result<(Hello, BufReader<S>)> {
    let mut io = BufReader::new(io);
    let hello = Hello::parse(&read_line_after(&mut io, HELLO_MAGIC).await?)?;
    let nonce = hex(&hello.nonce);
    let mut ready = READY_MAGIC.to_vec();
    ready.extend_from_slice(nonce.as_bytes());
    ready.push(b'\n');
    io.write_all(&ready).await?;
    io.flush().await?;
    while read_line_after(&mut io, GO_MAGIC).await? != nonce {}
    Ok((hello, io))
}

/// Host side: sends `hello` (again every 50 ms) until `READY` carrying its nonce comes
/// back, skipping anything an earlier session left in the channel, then sends `GO`.
/// Returns the stream to run yamux on (it may hold bytes read ahead).
pub async fn host_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    io: S,
    hello: &Hello,
) -> io::Result<BufReader<S>> {
    let mut io = BufReader::new(io);
    let want = hex(&hello.nonce);
    let mut scan = LineScanner::new(READY_MAGIC);
    'resend: loop {
        io.write_all(&hello.to_bytes()).await?;
        io.flush().await?;
        let resend = tokio::time::sleep(HELLO_RESEND);
        tokio::pin!(resend);
        loop {
            tokio::select! {
                byte = read_byte(&mut io) => {
                    if scan.feed(byte?)?.is_some_and(|nonce| nonce == want) {
                        break 'resend;
                    }
                }
                () = &mut resend => continue 'resend,
            }
        }
    }
    let mut go = GO_MAGIC.to_vec();
    go.extend_from_slice(want.as_bytes());
    go.push(b'\n');
    io.write_all(&go).await?;
    io.flush().await?;
    Ok(io)
}

/// Streams open at once on one channel, each side (yamux's limit). Past it yamux ends the
/// whole channel, on either side, so the host never asks for that many: it opens at most
/// [`HOST_STREAMS`], and sandboxd's own per-sandbox caps keep far below even that.
pub const MAX_STREAMS: usize = 256;

/// Streams the host keeps open at once; an open beyond fails that open only. The margin
/// below [`MAX_STREAMS`] covers streams the host dropped that yamux has not collected yet.
pub const HOST_STREAMS: usize = MAX_STREAMS - 32;

/// A yamux stream as a tokio `AsyncRead + AsyncWrite`; on the host it holds its place
/// among [`HOST_STREAMS`] until dropped.
///
/// Its halves may be polled from two tasks (silkd reads requests in one and writes
/// output in another, through `tokio::io::split`). yamux's `Stream` has one command
/// sender for both: `poll_read` asks it for room to queue a window update and
/// `poll_write` for room to queue data, and a full sender keeps one waker only, the
/// last poller's. A reader's poll would so take the writer's wake-up away, and the
/// writer, waiting for a sender the connection has long drained, would never run
/// again (the stream stalled, all else alive). Every poll therefore goes to yamux
/// with a waker that wakes both sides' latest tasks.
pub struct MuxStream {
    inner: Compat<yamux::Stream>,
    wakers: Arc<BothWakers>,
    _open: Option<OpenGuard>,
}

/// The latest reading and writing task of one stream; woken together.
#[derive(Default)]
struct BothWakers {
    read: Mutex<Option<Waker>>,
    write: Mutex<Option<Waker>>,
}

impl BothWakers {
    /// A waker for yamux that wakes both tasks, after noting `cx`'s as `side`'s.
    fn register(self: &Arc<Self>, side: &Mutex<Option<Waker>>, cx: &Context<'_>) -> Waker {
        let mut slot = side.lock().unwrap_or_else(|e| e.into_inner());
        if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *slot = Some(cx.waker().clone());
        }
        drop(slot);
        Waker::from(self.clone())
    }
}

impl Wake for BothWakers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        for side in [&self.read, &self.write] {
            let w = side.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(w) = w {
                w.wake();
            }
        }
    }
}

impl MuxStream {
    fn new(inner: yamux::Stream, open: Option<OpenGuard>) -> Self {
        MuxStream {
            inner: inner.compat(),
            wakers: Arc::default(),
            _open: open,
        }
    }
}

impl std::fmt::Debug for MuxStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MuxStream").finish_non_exhaustive()
    }
}

/// One host-side stream's place; freed on drop.
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl AsyncRead for MuxStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let waker = self.wakers.register(&self.wakers.read, cx);
        Pin::new(&mut self.inner).poll_read(&mut Context::from_waker(&waker), buf)
    }
}

impl AsyncWrite for MuxStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let waker = self.wakers.register(&self.wakers.write, cx);
        Pin::new(&mut self.inner).poll_write(&mut Context::from_waker(&waker), buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let waker = self.wakers.register(&self.wakers.write, cx);
        Pin::new(&mut self.inner).poll_flush(&mut Context::from_waker(&waker))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let waker = self.wakers.register(&self.wakers.write, cx);
        Pin::new(&mut self.inner).poll_shutdown(&mut Context::from_waker(&waker))
    }
}

fn mux_config() -> yamux::Config {
    let mut cfg = yamux::Config::default();
    // 256 KiB per stream × 256 streams; bounds what a peer can make us buffer.
    cfg.set_max_num_streams(MAX_STREAMS);
    cfg.set_max_connection_receive_window(Some(256 * 1024 * MAX_STREAMS));
    cfg
}

/// Opens streams on a host-side (client) mux session.
#[derive(Clone)]
pub struct MuxOpener {
    requests: mpsc::Sender<oneshot::Sender<io::Result<MuxStream>>>,
}

impl MuxOpener {
    /// Opens a fresh stream to the guest; fails once the session is gone.
    pub async fn open(&self) -> io::Result<MuxStream> {
        let (tx, rx) = oneshot::channel();
        let gone = || io::Error::new(io::ErrorKind::BrokenPipe, "guest session closed");
        self.requests.send(tx).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// True once the session's driver has stopped.
    pub fn is_closed(&self) -> bool {
        self.requests.is_closed()
    }
}

/// Host side: yamux client over `io` (after [`host_handshake`]). Returns the opener and
/// the driver future, which must be polled (spawned) for the session to make progress;
/// it ends when the channel closes.
pub fn mux_client<S>(io: S) -> (MuxOpener, impl Future<Output = ()> + Send)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<oneshot::Sender<io::Result<MuxStream>>>(16);
    let mut conn = yamux::Connection::new(io.compat(), mux_config(), yamux::Mode::Client);
    let open = Arc::new(AtomicUsize::new(0));
    let driver = async move {
        let mut waiting: Option<oneshot::Sender<io::Result<MuxStream>>> = None;
        let mut requests_open = true;
        std::future::poll_fn(|cx| loop {
            // Serve one open request at a time.
            if waiting.is_none() && requests_open {
                match rx.poll_recv(cx) {
                    Poll::Ready(Some(w)) => waiting = Some(w),
                    Poll::Ready(None) => requests_open = false,
                    Poll::Pending => {}
                }
            }
            // Too many streams fails this open only. It is refused here, before yamux,
            // which would end the whole channel (every RPC of the guest) instead.
            if waiting.is_some() && open.load(Ordering::SeqCst) >= HOST_STREAMS {
                let full = io::Error::other(format!(
                    "{HOST_STREAMS} streams are open on this guest channel; close one first"
                ));
                let _ = waiting.take().expect("checked").send(Err(full));
                continue;
            }
            if waiting.is_some() {
                if let Poll::Ready(r) = conn.poll_new_outbound(cx) {
                    let failed = r.is_err();
                    let r = r
                        .map(|s| {
                            open.fetch_add(1, Ordering::SeqCst);
                            MuxStream::new(s, Some(OpenGuard(open.clone())))
                        })
                        .map_err(|e| io::Error::new(io::ErrorKind::BrokenPipe, e));
                    let _ = waiting.take().expect("checked").send(r);
                    if failed {
                        return Poll::Ready(());
                    }
                    continue;
                }
            }
            // Drives the connection; the guest never opens streams, so any is dropped.
            match conn.poll_next_inbound(cx) {
                Poll::Ready(Some(Ok(_unexpected))) => continue,
                Poll::Ready(Some(Err(_))) | Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        })
        .await
    };
    (MuxOpener { requests: tx }, driver)
}

/// Guest side: yamux server over `io` (after [`guest_handshake`]); calls `on_stream` for
/// every stream the host opens, until the channel closes (`Ok`) or fails (`Err`).
pub async fn mux_server<S, F>(io: S, mut on_stream: F) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: FnMut(MuxStream),
{
    let mut conn = yamux::Connection::new(io.compat(), mux_config(), yamux::Mode::Server);
    loop {
        match std::future::poll_fn(|cx| conn.poll_next_inbound(cx)).await {
            Some(Ok(stream)) => on_stream(MuxStream::new(stream, None)),
            Some(Err(e)) => return Err(io::Error::new(io::ErrorKind::BrokenPipe, e)),
            None => return Ok(()),
        }
    }
}
