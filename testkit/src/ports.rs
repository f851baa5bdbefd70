//! Port tunnels seen from a client: a one-shot HTTP/1.0 GET over any byte stream (a
//! `connect_port` stream, a forwarded local port), a Python `http.server` started detached
//! in a sandbox (a template with python3) and fetched through `connect_port`, and `sbx
//! port-forward` running as a guarded child with the local address it printed.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use sandbox_sdk::{Command, Error, Sandbox};

use crate::guard::ChildGuard;
use crate::wait::wait_until;

/// The port [`serve_hello`]'s server listens on.
pub const HELLO_PORT: u16 = 8000;

/// Starts `python3 -m http.server` DETACHED (it outlives the request that started it and
/// holds no connection) on 127.0.0.1:[`HELLO_PORT`] in the sandbox, serving a
/// `/hello.txt` that holds `port-ok`; waits up to `within` until it answers through
/// `connect_port`; returns its pid.
pub async fn serve_hello(sandbox: &Sandbox, within: Duration) -> u32 {
    let out = sandbox
        .exec(&Command::new("sh").args([
            "-c",
            "mkdir -p /tmp/www && echo port-ok > /tmp/www/hello.txt",
        ]))
        .await
        .unwrap();
    assert!(out.exit.success(), "{out:?}");
    let port = HELLO_PORT.to_string();
    let server = Command::new("python3")
        .args(["-m", "http.server", &port, "--bind", "127.0.0.1"])
        .args(["--directory", "/tmp/www"])
        .detach(true);
    let pid = sandbox.spawn(&server).await.unwrap().pid();
    let answer = wait_until(within, "the server to answer", async || {
        get_hello(sandbox).await
    })
    .await;
    assert_hello(&answer);
    pid
}

/// `GET /hello.txt` through a fresh tunnel to [`HELLO_PORT`].
pub async fn get_hello(sandbox: &Sandbox) -> Result<String, Error> {
    let mut tunnel = sandbox.connect_port(HELLO_PORT).await?;
    Ok(http_get(&mut tunnel, "/hello.txt").await)
}

/// Checks a [`get_hello`] answer: 200 and the file's bytes.
pub fn assert_hello(answer: &str) {
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nport-ok\n"), "{answer}");
}

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
