//! The proxy to another node: one fresh HTTP/1.1 connection per forwarded request, the
//! request's head and streamed body passed on with the peer header added, the answer's
//! head and streamed body passed back, and an upgrade (relay, port tunnel) joined into
//! one byte pipe once both sides switched. Hop-by-hop headers stay on their hop.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST, UPGRADE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::api::Body;
use crate::error::{Error, Result};

/// Marks a request as routed already, with the cluster's `peer_token`.
pub const PEER_HEADER: &str = "x-sandboxd-peer";
/// Names the node that served (owns) what the answer is about.
pub const NODE_HEADER: &str = "x-sandboxd-node";
/// Bound on reaching the other node (TCP connect and HTTP handshake).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 7] = [
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "proxy-authenticate",
    "proxy-authorization",
];

fn strip_hop_by_hop(headers: &mut HeaderMap, upgrading: bool) {
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
    if !upgrading {
        headers.remove(CONNECTION);
        headers.remove(UPGRADE);
    }
    headers.remove(PEER_HEADER);
}

/// Sends `req` to `url` (`http://host:port`) as a peer, and answers with what comes back.
/// Unreachable → 502 naming the node.
pub async fn forward<B>(
    node: &str,
    url: &str,
    peer_token: &str,
    mut req: Request<B>,
) -> Result<Response<Body>>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let peer_down = |e: String| Error::Peer(format!("node {node:?} ({url}) is unreachable: {e}"));
    let authority = url.trim_start_matches("http://").trim_end_matches('/');
    let upgrading = req.headers().contains_key(UPGRADE);
    let client_side = upgrading.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut out = Request::builder()
        .method(parts.method)
        .uri(path)
        .body(body)
        .map_err(|e| Error::BadRequest(format!("forwarding: {e}")))?;
    *out.headers_mut() = parts.headers;
    strip_hop_by_hop(out.headers_mut(), upgrading);
    let peer = HeaderValue::from_str(peer_token).map_err(|e| peer_down(e.to_string()))?;
    out.headers_mut().insert(PEER_HEADER, peer);
    if let Ok(host) = HeaderValue::from_str(authority) {
        out.headers_mut().insert(HOST, host);
    }
    let mut sender = tokio::time::timeout(CONNECT_TIMEOUT, async {
        let stream = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|e| peer_down(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| peer_down(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!("forwarded connection ended: {e}");
            }
        });
        Ok::<_, Error>(sender)
    })
    .await
    .map_err(|_| peer_down("connect timed out".into()))??;
    let mut resp = sender
        .send_request(out)
        .await
        .map_err(|e| peer_down(e.to_string()))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let owner_side = hyper::upgrade::on(&mut resp);
        let Some(client_side) = client_side else {
            return Err(peer_down("it switched protocols unasked".into()));
        };
        tokio::spawn(async move {
            let (client, owner) = match tokio::join!(client_side, owner_side) {
                (Ok(c), Ok(o)) => (c, o),
                (c, o) => {
                    return tracing::debug!(
                        "forwarded upgrade failed: client {:?}, owner {:?}",
                        c.err(),
                        o.err()
                    )
                }
            };
            let (mut client, mut owner) = (TokioIo::new(client), TokioIo::new(owner));
            // Ends when either side closes; a half-close is passed on.
            let _ = tokio::io::copy_bidirectional(&mut client, &mut owner).await;
        });
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(
            parts,
            http_body_util::Empty::new().boxed(),
        ));
    }
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    Ok(Response::from_parts(parts, Proxied(body).boxed()))
}

/// The owner's answer body passed on as it streams. A failure midway ends it short:
/// with the owner's `Content-Length` hyper then breaks the client's connection rather
/// than end a short body cleanly.
struct Proxied(Incoming);

impl HttpBody for Proxied {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, Infallible>>> {
        match Pin::new(&mut self.0).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(e))) => {
                tracing::debug!("forwarded answer cut short: {e}");
                Poll::Ready(None)
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

/// Adds the serving node's name to an answer.
pub fn name_node(resp: &mut Response<Body>, node: &str) {
    if let Ok(v) = HeaderValue::from_str(node) {
        resp.headers_mut()
            .insert(HeaderName::from_static(NODE_HEADER), v);
    }
}
