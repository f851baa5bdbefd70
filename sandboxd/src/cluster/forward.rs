//! The proxy to another node: one fresh HTTP/1.1 connection per forwarded request (over
//! mTLS to an `https://` member, with peer TLS), the request's head and streamed body
//! passed on with the peer header added, the answer's head and streamed body passed back,
//! and an upgrade (relay, port tunnel) joined into one byte pipe once both sides
//! switched. Hop-by-hop headers stay on their hop.

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

use super::Cluster;
use crate::api::Body;
use crate::error::{Error, Result};
use crate::serve::Conn;

/// Marks a request as routed already, with the cluster's `peer_token`.
pub const PEER_HEADER: &str = "x-sandboxd-peer";
/// Names the node that served (owns) what the answer is about.
pub const NODE_HEADER: &str = "x-sandboxd-node";
/// Bound on reaching the other node (TCP connect, TLS and HTTP handshakes).
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

/// Sends `req` to member `node` at `url` as a peer of `cluster`, and answers with what
/// comes back: over mTLS to an `https://` URL (this node's `peer_cert`, the member's
/// certificate checked against `peer_ca`), plain HTTP to an `http://` one. A scheme that
/// does not match this node's peer TLS (plaintext from a node with it, TLS from a node
/// without a certificate), or an unreachable node → 502 naming the node.
pub async fn forward<B>(
    cluster: &Cluster,
    node: &str,
    url: &str,
    mut req: Request<B>,
) -> Result<Response<Body>>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let peer_down = |e: String| Error::Peer(format!("node {node:?} ({url}) is unreachable: {e}"));
    let (tls, authority) = match target(node, url, cluster.peer_tls.is_some())? {
        (true, authority) => (cluster.peer_tls.as_ref(), authority),
        (false, authority) => (None, authority),
    };
    let peer_token = &cluster.config.peer_token;
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
        let stream: Box<dyn Conn> = match tls {
            Some(tls) => {
                let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
                let session = tls
                    .connect(host, stream)
                    .await
                    .map_err(|e| peer_down(format!("TLS: {e}")))?;
                Box::new(session)
            }
            None => Box::new(stream),
        };
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

/// Whether member `node` at `url` is reached over TLS, and its `host:port`: `https://`
/// when this node has peer TLS (`tls`), `http://` when it has not; the other way round
/// is refused (plaintext from a node that has TLS, TLS from a node with no certificate).
fn target<'u>(node: &str, url: &'u str, tls: bool) -> Result<(bool, &'u str)> {
    let refuse = |why: &str| Error::Peer(format!("not forwarding to node {node:?} ({url}): {why}"));
    let (secure, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => return Err(refuse("its URL is neither http:// nor https://")),
    };
    match (secure, tls) {
        (true, false) => Err(refuse(
            "it takes peer TLS only, and this node has no peer certificate ([cluster] \
             peer_listen, peer_ca, peer_cert, peer_key)",
        )),
        (false, true) => Err(refuse(
            "it advertises an http:// URL, and this node has peer TLS: the call would be \
             plaintext",
        )),
        _ => Ok((secure, rest.trim_end_matches('/'))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_matches_this_nodes_peer_tls() {
        let ok = |url, tls| target("b", url, tls).map_err(|e| e.to_string());
        assert_eq!(
            ok("http://10.0.0.2:8080/", false),
            Ok((false, "10.0.0.2:8080"))
        );
        assert_eq!(ok("https://node-b:8443", true), Ok((true, "node-b:8443")));
        let plaintext = ok("http://10.0.0.2:8080", true).unwrap_err();
        assert_eq!(
            plaintext,
            "cluster peer: not forwarding to node \"b\" (http://10.0.0.2:8080): it advertises \
             an http:// URL, and this node has peer TLS: the call would be plaintext"
        );
        let no_cert = ok("https://10.0.0.2:8443", false).unwrap_err();
        assert!(no_cert.contains("has no peer certificate"), "{no_cert}");
        for tls in [false, true] {
            let odd = ok("ftp://10.0.0.2:21", tls).unwrap_err();
            assert!(odd.contains("neither http:// nor https://"), "{odd}");
        }
    }
}
