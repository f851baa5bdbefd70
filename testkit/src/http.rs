//! One HTTP/1.1 request to a sandboxd on a fresh connection, over TCP or a Unix socket,
//! and its answer read whole.

use std::net::SocketAddr;
use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

/// Where a sandboxd listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// TCP.
    Tcp(SocketAddr),
    /// A Unix socket.
    Unix(PathBuf),
}

impl Endpoint {
    /// Parses sandboxd's own spelling: `host:port` or `unix:/path`.
    pub fn parse(text: &str) -> Endpoint {
        match text.strip_prefix("unix:") {
            Some(path) => Endpoint::Unix(path.into()),
            None => Endpoint::Tcp(
                text.parse()
                    .unwrap_or_else(|e| panic!("listen address {text:?}: {e}")),
            ),
        }
    }

    /// The TCP address; panics on a Unix socket.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Endpoint::Tcp(addr) => *addr,
            Endpoint::Unix(path) => panic!("listens on unix:{}, not TCP", path.display()),
        }
    }

    /// The URL the SDK and `sbx` take: `http://host:port` or `unix:/path`.
    pub fn url(&self) -> String {
        match self {
            Endpoint::Tcp(addr) => format!("http://{addr}"),
            Endpoint::Unix(path) => format!("unix:{}", path.display()),
        }
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(addr: SocketAddr) -> Endpoint {
        Endpoint::Tcp(addr)
    }
}

impl From<&Endpoint> for Endpoint {
    fn from(e: &Endpoint) -> Endpoint {
        e.clone()
    }
}

/// An HTTP answer.
pub struct Resp {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Resp {
    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// The body as (lossy) text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One request on a fresh connection; `token` goes in as a bearer token. Panics when
/// the connection fails ([`try_call`] does not).
pub async fn call(
    to: impl Into<Endpoint>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Resp {
    try_call(to, method, path, token, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// [`call`] that says why no answer came (refused, reset, closed early) instead of
/// panicking: for clients that outlive a daemon's restart.
pub async fn try_call(
    to: impl Into<Endpoint>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Result<Resp, String> {
    let mut req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(path)
        .header("host", "sandboxd");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or("").to_string())))
        .unwrap();
    let connect = |e: std::io::Error| format!("connect: {e}");
    match to.into() {
        Endpoint::Tcp(addr) => send(TcpStream::connect(addr).await.map_err(connect)?, req).await,
        Endpoint::Unix(path) => send(UnixStream::connect(path).await.map_err(connect)?, req).await,
    }
}

async fn send<S>(stream: S, req: Request<Full<Bytes>>) -> Result<Resp, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok(Resp {
        status,
        headers,
        body,
    })
}
