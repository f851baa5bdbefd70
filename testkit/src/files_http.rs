//! The file routes over HTTP as a test drives them: binary bodies and extra headers, and a
//! raw upload cut off halfway.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::http::Resp;

/// One request with a binary body and extra headers, over TCP.
pub async fn call_bytes(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Resp {
    let mut req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(path)
        .header("host", "sandboxd")
        .header("authorization", format!("Bearer {token}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body))).unwrap();
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Resp {
        status,
        headers,
        body,
    }
}

/// A `PUT` announcing `announced` bytes that sends only `data`, then closes.
pub async fn put_cut_off(
    addr: std::net::SocketAddr,
    path: &str,
    token: &str,
    announced: usize,
    data: &[u8],
) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nhost: sandboxd\r\nauthorization: Bearer {token}\r\ncontent-length: {announced}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(data).await.unwrap();
    s.flush().await.unwrap();
    drop(s);
}
