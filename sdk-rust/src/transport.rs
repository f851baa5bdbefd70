//! HTTP to sandboxd: one pooled hyper client over TCP or a Unix socket, JSON bodies,
//! answers streamed as they arrive (downloads), and the relay's `Upgrade: silkd`. Knows
//! routes only as paths; nothing about sandboxes.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_TYPE, UPGRADE};
use hyper::upgrade::Upgraded;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client as PooledClient;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::error::{retry_after, Error, Result, TransportError};

/// Largest response body read. A buffered exec answer is at most the node's output cap
/// (8 MiB by default) as JSON, which escaping can grow about sixfold.
const MAX_BODY: usize = 128 * 1024 * 1024;

/// Shortest wait between two tries of a busy request (a `Retry-After: 0` must not spin).
const MIN_BUSY_WAIT: Duration = Duration::from_millis(100);

/// Longest wait between two tries of a busy request, whatever `Retry-After` says.
const MAX_BUSY_WAIT: Duration = Duration::from_secs(30);

/// Where sandboxd listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `host:port` over TCP.
    Tcp(String),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl Endpoint {
    /// Parses `http://host:port`, a bare `host:port`, or `unix:/path` (also `unix:///path`).
    pub(crate) fn parse(url: &str) -> Result<Endpoint> {
        let bad = |why: &str| Error::InvalidUrl(format!("{url:?}: {why}"));
        if let Some(path) = url.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(bad("no socket path after unix:"));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let authority = match url.split_once("://") {
            Some(("http", rest)) => rest,
            Some(("https", _)) => {
                return Err(bad(
                    "https is not supported; put sandboxd behind a TLS proxy",
                ))
            }
            Some((scheme, _)) => return Err(bad(&format!("unknown scheme {scheme}"))),
            None => url,
        };
        let authority = authority.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(bad("expected http://host:port with no path"));
        }
        let parsed = authority
            .parse::<hyper::http::uri::Authority>()
            .map_err(|e| bad(&e.to_string()))?;
        // Without a port the connect would fail later with an unhelpful address error;
        // guessing 80 or 7777 would reach the wrong server behind a proxy. Say so now.
        if parsed.port().is_none() {
            return Err(bad(
                "no port; sandboxd listens on 7777 by default (http://host:7777)",
            ));
        }
        Ok(Endpoint::Tcp(authority.to_string()))
    }

    /// The scheme and authority put in request URIs. A Unix socket has no host; sandboxd
    /// ignores `Host`, so `localhost` stands in.
    fn base(&self) -> String {
        match self {
            Endpoint::Tcp(authority) => format!("http://{authority}"),
            Endpoint::Unix(_) => "http://localhost".to_string(),
        }
    }
}

/// A connection to sandboxd over either kind of socket.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// Dials the endpoint whatever the request URI says (it always names the same node).
#[derive(Clone)]
pub(crate) struct Connector(Arc<Endpoint>);

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<Stream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let endpoint = Arc::clone(&self.0);
        Box::pin(async move {
            let stream = match &*endpoint {
                Endpoint::Tcp(authority) => {
                    let s = TcpStream::connect(authority.as_str()).await.map_err(|e| {
                        io::Error::new(e.kind(), format!("connect to {authority}: {e}"))
                    })?;
                    // Small JSON requests and wire frames: latency matters, not batching.
                    s.set_nodelay(true)?;
                    Stream::Tcp(s)
                }
                Endpoint::Unix(path) => {
                    Stream::Unix(UnixStream::connect(path).await.map_err(|e| {
                        io::Error::new(e.kind(), format!("connect to {}: {e}", path.display()))
                    })?)
                }
            };
            Ok(TokioIo::new(stream))
        })
    }
}

/// An HTTP answer read whole.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: hyper::HeaderMap,
    pub(crate) body: Bytes,
    /// The request's path, for errors that name what they refer to.
    pub(crate) path: String,
}

impl Answer {
    /// The body decoded as `T` when the status is `expected`, else the matching [`Error`].
    pub(crate) fn json<T: serde::de::DeserializeOwned>(self, expected: StatusCode) -> Result<T> {
        self.expect(expected)?;
        serde_json::from_slice(&self.body)
            .map_err(|e| Error::Protocol(format!("cannot decode the {} answer: {e}", self.status)))
    }

    /// `Ok` when the status is `expected`, else the matching [`Error`].
    pub(crate) fn expect(&self, expected: StatusCode) -> Result<()> {
        if self.status == expected {
            Ok(())
        } else if self.status.is_success() {
            Err(Error::Unexpected {
                status: self.status.as_u16(),
                message: format!("expected {expected}"),
            })
        } else {
            Err(Error::from_response(
                self.status,
                &self.headers,
                &self.body,
                &self.path,
            ))
        }
    }
}

/// The pooled HTTP client for one node. Cheap to clone; clones share connections.
#[derive(Clone)]
pub(crate) struct Http {
    client: PooledClient<Connector, Full<Bytes>>,
    base: Arc<str>,
}

impl Http {
    /// A client for `endpoint`; no connection is made until the first request.
    pub(crate) fn new(endpoint: Endpoint) -> Http {
        let base = endpoint.base().into();
        // Idle connections are closed after 20 s, by a timer even when the client is not
        // used again: before sandboxd's 30 s header read timeout closes them, so a request
        // never races the server closing the connection it was sent on.
        let client = PooledClient::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(20))
            .build(Connector(Arc::new(endpoint)));
        Http { client, base }
    }

    /// Sends one request and reads the whole answer.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        json: Option<Vec<u8>>,
    ) -> Result<Answer> {
        let mut req = self.request(method, path, token)?;
        if let Some(body) = json {
            req.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            *req.body_mut() = Full::new(Bytes::from(body));
        }
        let resp = self.client.request(req).await.map_err(Error::transport)?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_BODY)
            .collect()
            .await
            .map_err(|e| Error::Transport(TransportError::from_boxed(e)))?
            .to_bytes();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
            path: path.to_string(),
        })
    }

    /// `send`, retrying a 503 at most `retries` times, waiting as `Retry-After` says. Only
    /// for requests that a 503 proves were not carried out (buffered exec).
    pub(crate) async fn send_retrying_busy(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        json: Vec<u8>,
        retries: u32,
    ) -> Result<Answer> {
        let mut tries = 0;
        loop {
            let answer = self
                .send(method.clone(), path, token, Some(json.clone()))
                .await?;
            if answer.status != StatusCode::SERVICE_UNAVAILABLE || tries >= retries {
                return Ok(answer);
            }
            tries += 1;
            let wait = retry_after(&answer.headers)
                .unwrap_or(Duration::from_secs(1))
                .clamp(MIN_BUSY_WAIT, MAX_BUSY_WAIT);
            tokio::time::sleep(wait).await;
        }
    }

    /// `GET path` with `Upgrade: protocol` (`silkd` for the relay, `tcp` for a port); the
    /// upgraded byte stream once the server said 101.
    pub(crate) async fn upgrade(
        &self,
        path: &str,
        token: Option<&str>,
        protocol: &'static str,
    ) -> Result<Upgraded> {
        let mut req = self.request(Method::GET, path, token)?;
        let headers = req.headers_mut();
        headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(UPGRADE, HeaderValue::from_static(protocol));
        let resp = self.client.request(req).await.map_err(Error::transport)?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Err(refusal(resp, StatusCode::SWITCHING_PROTOCOLS, path).await);
        }
        hyper::upgrade::on(resp).await.map_err(Error::transport)
    }

    /// Sends a body-less request and returns the answer with its body unread (to be
    /// streamed), when its status is `expected`; else the matching [`Error`]. No timeout:
    /// a transfer takes as long as its bytes take.
    pub(crate) async fn stream(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        expected: StatusCode,
    ) -> Result<Response<Incoming>> {
        let req = self.request(method, path, token)?;
        let resp = self.client.request(req).await.map_err(Error::transport)?;
        if resp.status() != expected {
            return Err(refusal(resp, expected, path).await);
        }
        Ok(resp)
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
    ) -> Result<Request<Full<Bytes>>> {
        let uri = format!("{}{path}", self.base);
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Full::new(Bytes::new()))
            .map_err(|e| Error::InvalidUrl(e.to_string()))?;
        if let Some(token) = token {
            let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                Error::BadRequest("the token has characters a header cannot carry".into())
            })?;
            req.headers_mut().insert(AUTHORIZATION, value);
        }
        Ok(req)
    }
}

/// The error an answer other than `expected` stands for; reads at most 64 KiB of its body.
async fn refusal(resp: Response<Incoming>, expected: StatusCode, path: &str) -> Error {
    let (parts, body) = resp.into_parts();
    let body = Limited::new(body, 64 * 1024)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let answer = Answer {
        status: parts.status,
        headers: parts.headers,
        body,
        path: path.to_string(),
    };
    answer
        .expect(expected)
        .expect_err("the status is not the expected one")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_url_forms() {
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:7777").unwrap(),
            Endpoint::Tcp("127.0.0.1:7777".into())
        );
        assert_eq!(
            Endpoint::parse("http://localhost:7777/").unwrap(),
            Endpoint::Tcp("localhost:7777".into())
        );
        assert_eq!(
            Endpoint::parse("127.0.0.1:7777").unwrap(),
            Endpoint::Tcp("127.0.0.1:7777".into())
        );
        assert_eq!(
            Endpoint::parse("unix:/run/sandboxd.sock").unwrap(),
            Endpoint::Unix("/run/sandboxd.sock".into())
        );
        assert_eq!(
            Endpoint::parse("unix:///run/sandboxd.sock").unwrap(),
            Endpoint::Unix("/run/sandboxd.sock".into())
        );
    }

    #[test]
    fn refuses_what_it_cannot_dial() {
        for url in [
            "https://example.org",
            "ftp://x:1",
            "http://host:1/v1",
            "unix:",
            "",
            "http://",
            "http://localhost",
            "sandbox.example:",
            "[::1]",
        ] {
            assert!(
                matches!(Endpoint::parse(url), Err(Error::InvalidUrl(_))),
                "{url:?} was accepted"
            );
        }
        let e = Endpoint::parse("http://localhost/")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no port") && e.contains("7777"), "{e}");
    }

    /// A server on 127.0.0.1:0 answering every request with 200 and an empty JSON body,
    /// counting the connections it accepts.
    async fn counting_server() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from_static(b"{}"),
                        )))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    #[tokio::test]
    async fn consecutive_requests_reuse_one_connection() {
        let (addr, accepted) = counting_server().await;
        let http = Http::new(Endpoint::parse(&addr).unwrap());
        for _ in 0..5 {
            let answer = http
                .send(Method::POST, "/v1/x", Some("t"), Some(b"{}".to_vec()))
                .await
                .unwrap();
            assert_eq!(answer.status, StatusCode::OK);
        }
        // Clones share the pool.
        let clone = http.clone();
        clone
            .send(Method::GET, "/healthz", None, None)
            .await
            .unwrap();
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
