//! Port tunnels seen from a client: a one-shot HTTP/1.0 GET over any byte stream (a
//! `connect_port` stream, a forwarded local port), and `sbx port-forward` running as a
//! guarded child with the local address it printed.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::guard::ChildGuard;
use crate::wait::wait_until;

/// Sends `GET path` (HTTP/1.0, so the server closes after answering), half-closes the
/// write side, and reads the whole answer: head and body as text.
pub async fn http_get<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.0\r\nHost: sandbox\r\n\r\n");
    stream.write_all(req.as_bytes()).await.expect("sending GET");
    stream.shutdown().await.expect("half-closing");
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .expect("reading answer");
    String::from_utf8_lossy(&answer).into_owned()
}

/// `sbx port-forward ID 0:REMOTE` against `url` with `token`, its stdout in `dir`; returns
/// the guard and the local address once the child has printed it.
pub async fn port_forward(
    sbx: &Path,
    url: &str,
    token: &str,
    id: &str,
    remote: u16,
    dir: &Path,
) -> (ChildGuard, SocketAddr) {
    let out = dir.join(format!("port-forward-{id}-{remote}.out"));
    let stdout = std::fs::File::create(&out).expect("creating the port-forward log");
    let mut cmd = std::process::Command::new(sbx);
    cmd.args(["port-forward", id, &format!("0:{remote}")])
        .env("SANDBOXD_URL", url)
        .env("SANDBOXD_TOKEN", token)
        .stdin(std::process::Stdio::null())
        .stdout(stdout);
    let guard = ChildGuard::spawn("sbx port-forward", &mut cmd).grace(Duration::from_secs(2));
    // The one stdout line: `forwarding 127.0.0.1:PORT -> ID:REMOTE`.
    let addr = wait_until(
        Duration::from_secs(20),
        "port-forward's address",
        async || {
            std::fs::read_to_string(&out)
                .ok()
                .and_then(|t| t.split_whitespace().nth(1)?.parse::<SocketAddr>().ok())
        },
    )
    .await;
    (guard, addr)
}
