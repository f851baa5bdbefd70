//! Connections: accepting under the `[http] max_connections` cap (a fixed 503 beyond it),
//! and what one connection may hold of the node without making progress. A request head
//! must be complete within `header_timeout_seconds` of its first byte; a connection with
//! no request in progress is closed after `idle_timeout_seconds` without a byte (new
//! connections that never speak, idle keep-alive ones); a response write that makes no
//! progress for `write_timeout_seconds` closes the connection, and dropping the response
//! body frees the exec output (memory budget, spill file) it held. Request bodies are timed
//! where they are read (`api::read_json`), and a handler at work (a long exec) is never
//! timed here. An upgraded connection (a relay) keeps its slot under the cap until it
//! closes, but leaves every timeout behind: a relay may be quiet for as long as it likes.
//!
//! The same limits serve every listener: the native API's and, with `[e2b]`, the E2B
//! surface's, and with `[cluster] peer_listen` the other nodes' (each with slots of its
//! own), through a [`Handler`].
//!
//! Must not: know about routes or statuses beyond the one fixed 503 (that is `api`'s).

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::api;
use crate::config::HttpConfig;
use crate::metrics::{Metrics, TimeoutLabel};
use crate::node::Node;

/// Connections refused at once (each gets the 503 and at most [`REFUSE_FOR`]); beyond,
/// a refused connection is closed without an answer, so a flood costs no more fds.
const REFUSING_MAX: usize = 64;
/// How long a refused connection may take to receive its 503.
const REFUSE_FOR: Duration = Duration::from_secs(1);
/// The answer beyond the connection cap.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\nretry-after: 1\r\nconnection: close\r\n\
content-length: 64\r\n\r\n{\"error\":\"too many open connections ([http] max_connections)\"}\n";

/// Any stream a listener hands out.
pub trait Conn: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Conn for T {}

/// The timeouts of `[http]`, in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Limits {
    header_ms: u64,
    idle_ms: u64,
    write_ms: u64,
}

impl Limits {
    fn of(config: &HttpConfig) -> Limits {
        Limits {
            header_ms: config.header_timeout_seconds * 1000,
            idle_ms: config.idle_timeout_seconds * 1000,
            write_ms: config.write_timeout_seconds * 1000,
        }
    }
}

/// What answers a connection's requests.
pub type Handler = Arc<
    dyn Fn(
            hyper::Request<hyper::body::Incoming>,
        ) -> futures::future::BoxFuture<'static, hyper::Response<api::Body>>
        + Send
        + Sync,
>;

/// The native API as a [`Handler`].
pub fn api_handler(node: Arc<Node>) -> Handler {
    Arc::new(move |req| {
        let node = node.clone();
        Box::pin(async move {
            // Until the response head: a relay's or a body's streaming is not counted.
            let _busy = node.pools.busy();
            match api::handle(node, req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            }
        })
    })
}

/// The node's connection slots.
pub struct Connections {
    slots: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    limits: Limits,
    metrics: Arc<Metrics>,
}

impl Connections {
    /// `[http] max_connections` slots.
    pub fn new(config: &HttpConfig, metrics: Arc<Metrics>) -> Connections {
        Connections {
            slots: Arc::new(Semaphore::new(config.max_connections as usize)),
            refusing: Arc::new(Semaphore::new(REFUSING_MAX)),
            limits: Limits::of(config),
            metrics,
        }
    }

    /// Serves `io` in a slot, or refuses it when every slot is taken. The returned future
    /// ends when the connection does (or when it is upgraded: the relay then holds the
    /// slot until it closes).
    pub fn serve(
        &self,
        node: Arc<Node>,
        io: Box<dyn Conn>,
    ) -> impl std::future::Future<Output = ()> {
        self.serve_with(api_handler(node), io)
    }

    /// [`Connections::serve`] with another handler (the E2B surface's, or the native one
    /// wrapped by the cluster's peer listener).
    pub fn serve_with(
        &self,
        handler: Handler,
        io: Box<dyn Conn>,
    ) -> impl std::future::Future<Output = ()> {
        let slot = self.slots.clone().try_acquire_owned().ok().map(|permit| {
            self.metrics.http_connections.inc();
            Slot {
                _permit: permit,
                metrics: self.metrics.clone(),
            }
        });
        let refusing = self.refusing.clone().try_acquire_owned().ok();
        let (limits, metrics) = (self.limits, self.metrics.clone());
        async move {
            match slot {
                Some(slot) => serve(handler, io, slot, limits, metrics).await,
                None => {
                    metrics.http_refused.inc();
                    if let Some(refusing) = refusing {
                        refuse(io).await;
                        drop(refusing);
                    }
                }
            }
        }
    }
}

/// Raises the soft open-files limit to the hard one: every connection, relay, guest
/// channel and spill file is a descriptor, and the usual soft default (1024) is below
/// `max_connections`' default. Warns when even the hard limit leaves too little room.
pub fn raise_fd_limit(config: &HttpConfig) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft < hard {
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::warn!("raising the open-files limit from {soft} to {hard}: {e}");
        }
    }
    // Room for guests' channels, spill files and the process's own beyond the connections.
    let want = u64::from(config.max_connections) + 1024;
    if hard < want {
        tracing::warn!(
            "the open-files limit ({hard}) is below [http] max_connections + 1024 ({want}); \
             connections beyond it fail to be accepted instead of getting a 503"
        );
    }
}

/// One connection's place under the cap; freed (and the gauge lowered) when the
/// connection's stream is dropped, by hyper or by the relay that took it over.
struct Slot {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.metrics.http_connections.dec();
    }
}

/// Writes the fixed 503, then reads (and drops) what the client sent for a moment so
/// that closing does not reset the connection before the answer is read.
async fn refuse(mut io: Box<dyn Conn>) {
    let _ = tokio::time::timeout(REFUSE_FOR, async {
        io.write_all(REFUSAL).await?;
        io.shutdown().await?;
        let mut sink = [0u8; 4096];
        while io.read(&mut sink).await? > 0 {}
        Ok::<_, io::Error>(())
    })
    .await;
}

async fn serve(
    handler: Handler,
    io: Box<dyn Conn>,
    slot: Slot,
    limits: Limits,
    metrics: Arc<Metrics>,
) {
    let watch = Arc::new(Watch::new());
    let io = Watched {
        inner: io,
        watch: watch.clone(),
        _slot: slot,
    };
    let service = {
        let watch = watch.clone();
        service_fn(move |req| {
            let guard = Watch::request(&watch);
            let answer = handler(req);
            async move {
                let resp = answer.await;
                Ok::<_, Infallible>(resp.map(|body| GuardedBody {
                    body,
                    _guard: guard,
                }))
            }
        })
    };
    // hyper's own header timer would also run on idle connections; ours tells the two
    // apart (see `Watch::deadline`), so hyper's is off.
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::select! {
        ended = conn => if let Err(e) = ended {
            tracing::debug!("connection ended: {e}");
        },
        kind = watch.expired(limits) => {
            metrics.http_timeouts.get_or_create(&TimeoutLabel { kind }).inc();
            tracing::debug!("closing a connection: {kind} timeout");
            // Dropping the connection closes the socket and drops any response body in
            // flight, with the exec output it held.
        }
    }
}

/// What a connection is doing, as its stream and its service see it. Times are
/// milliseconds since the connection's start plus one, so 0 means "not set".
struct Watch {
    start: Instant,
    /// Requests handed to the service whose response body has not ended.
    requests: AtomicU32,
    /// The first byte of a request head that is not complete yet.
    head_since: AtomicU64,
    /// The last byte read or written, or the last response's end.
    active_at: AtomicU64,
    /// Since when a write has been refused (the client is not reading).
    stalled_since: AtomicU64,
    /// Wakes the watchdog when a deadline may have moved earlier.
    changed: Notify,
}

/// Frees a request's place in [`Watch::requests`] when dropped.
struct RequestGuard(Arc<Watch>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let w = &self.0;
        w.active_at.store(w.now(), Ordering::SeqCst);
        w.requests.fetch_sub(1, Ordering::SeqCst);
        w.changed.notify_one();
    }
}

impl Watch {
    fn new() -> Watch {
        Watch {
            start: Instant::now(),
            requests: AtomicU32::new(0),
            head_since: AtomicU64::new(0),
            active_at: AtomicU64::new(1),
            stalled_since: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    /// A request's head is complete and the service has it.
    fn request(watch: &Arc<Watch>) -> RequestGuard {
        watch.requests.fetch_add(1, Ordering::SeqCst);
        watch.head_since.store(0, Ordering::SeqCst);
        RequestGuard(watch.clone())
    }

    fn read(&self, n: usize) {
        if n == 0 {
            return;
        }
        let now = self.now();
        self.active_at.store(now, Ordering::SeqCst);
        if self.requests.load(Ordering::SeqCst) == 0
            && self
                .head_since
                .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.changed.notify_one();
        }
    }

    fn wrote(&self, n: usize) {
        self.stalled_since.store(0, Ordering::SeqCst);
        if n > 0 {
            self.active_at.store(self.now(), Ordering::SeqCst);
        }
    }

    fn write_refused(&self) {
        let now = self.now();
        if self
            .stalled_since
            .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.changed.notify_one();
        }
    }

    /// When the connection times out if nothing changes, and why; `None` while a handler
    /// works (its body read is timed by the handler, its run by its own limits).
    fn deadline(&self, l: Limits) -> Option<(u64, &'static str)> {
        let stalled = self.stalled_since.load(Ordering::SeqCst);
        if stalled != 0 {
            return Some((stalled + l.write_ms, "write"));
        }
        if self.requests.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let head = self.head_since.load(Ordering::SeqCst);
        if head != 0 {
            return Some((head + l.header_ms, "header"));
        }
        Some((self.active_at.load(Ordering::SeqCst) + l.idle_ms, "idle"))
    }

    /// Resolves with the timeout's kind once a deadline passes. Progress only moves
    /// deadlines later, so a wake-up at a stale deadline just computes the next one;
    /// changes that can move it earlier notify.
    async fn expired(&self, l: Limits) -> &'static str {
        loop {
            match self.deadline(l) {
                Some((at, kind)) => {
                    let now = self.now();
                    if at <= now {
                        return kind;
                    }
                    let sleep = tokio::time::sleep(Duration::from_millis(at - now));
                    tokio::select! {
                        () = sleep => {}
                        () = self.changed.notified() => {}
                    }
                }
                None => self.changed.notified().await,
            }
        }
    }
}

/// A connection's stream, reporting its progress to the [`Watch`] and holding its
/// [`Slot`].
struct Watched {
    inner: Box<dyn Conn>,
    watch: Arc<Watch>,
    _slot: Slot,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            self.watch.read(buf.filled().len() - before);
        }
        r
    }
}

impl Watched {
    fn track(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Pending => self.watch.write_refused(),
            Poll::Ready(Ok(n)) => self.watch.wrote(*n),
            Poll::Ready(Err(_)) => {}
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.track(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.track(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A response body that keeps its request counted in the [`Watch`] until hyper is done
/// with it.
struct GuardedBody {
    body: api::Body,
    _guard: RequestGuard,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        header_ms: 2_000,
        idle_ms: 10_000,
        write_ms: 5_000,
    };

    async fn advance(ms: u64) {
        tokio::time::advance(Duration::from_millis(ms)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_times_out_idle() {
        let w = Watch::new();
        let at = tokio::time::Instant::now();
        assert_eq!(w.expired(L).await, "idle");
        assert_eq!(at.elapsed(), Duration::from_millis(L.idle_ms));
    }

    #[tokio::test(start_paused = true)]
    async fn a_started_head_gets_the_shorter_header_timeout() {
        let w = Arc::new(Watch::new());
        advance(1_000).await;
        w.read(5);
        assert_eq!(w.deadline(L), Some((1_001 + L.header_ms, "header")));
        // Trickling bytes does not extend the head's deadline.
        advance(1_500).await;
        w.read(1);
        assert_eq!(w.deadline(L), Some((1_001 + L.header_ms, "header")));
        assert_eq!(w.expired(L).await, "header");
    }

    #[tokio::test(start_paused = true)]
    async fn a_working_handler_is_never_timed_and_its_end_restarts_idle() {
        let w = Arc::new(Watch::new());
        w.read(10);
        let guard = Watch::request(&w);
        // Body bytes read while the request is in the service are not a new head.
        w.read(10);
        assert_eq!(w.deadline(L), None);
        advance(3_600_000).await;
        assert_eq!(w.deadline(L), None);
        drop(guard);
        let now = w.now();
        assert_eq!(w.deadline(L), Some((now + L.idle_ms, "idle")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_write_times_out_even_while_the_request_is_counted() {
        let w = Arc::new(Watch::new());
        let _guard = Watch::request(&w);
        w.write_refused();
        let since = w.now();
        advance(1_000).await;
        // Refused again: the stall still dates from the first refusal.
        w.write_refused();
        assert_eq!(w.deadline(L), Some((since + L.write_ms, "write")));
        // Progress ends the stall.
        w.wrote(100);
        assert_eq!(w.deadline(L), None);
        w.write_refused();
        assert_eq!(w.expired(L).await, "write");
    }
}
