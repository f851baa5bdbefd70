//! Clients that misbehave on purpose, over raw TCP: connections that never speak, a
//! request head that trickles and never ends, a body that never ends, a response nobody
//! reads; and what to observe them by (the peer closing, descriptors of the process, a
//! metric's value).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

/// Raises this process's soft open-files limit to at least `want` (up to the hard limit);
/// returns the soft limit now in effect.
pub fn raise_nofile(want: u64) -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft >= want {
        return soft;
    }
    let new = want.min(hard);
    setrlimit(Resource::RLIMIT_NOFILE, new, hard).expect("setrlimit");
    new
}

/// `n` connections that send nothing.
pub async fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(TcpStream::connect(addr).await.expect("connect"));
    }
    all
}

/// True once the peer closed `stream` (EOF or a reset); whatever it sent before is
/// returned through `seen`. Never blocks.
pub fn peer_closed(stream: &TcpStream, seen: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match stream.try_read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// How many of `streams` the peer has closed.
pub fn closed_count(streams: &[TcpStream]) -> usize {
    streams
        .iter()
        .filter(|s| peer_closed(s, &mut Vec::new()))
        .count()
}

/// Starts a request head and then sends one more header byte every `every`, never the
/// blank line that ends it: the slow-headers (slowloris) client. Returns the stream and the
/// task that trickles (it stops once writing fails).
pub async fn slow_headers(
    addr: SocketAddr,
    every: Duration,
) -> (std::sync::Arc<TcpStream>, tokio::task::JoinHandle<()>) {
    let stream = std::sync::Arc::new(TcpStream::connect(addr).await.expect("connect"));
    write_all(&stream, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ").await;
    let trickle = stream.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if trickle.writable().await.is_err() || trickle.try_write(b"a").is_err() {
                return;
            }
        }
    });
    (stream, task)
}

/// A `POST` to `path` announcing a `Content-Length` of 1000 bytes and sending 10.
pub async fn unfinished_body(addr: SocketAddr, path: &str, token: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"argv\": ["
    );
    write_all(&stream, head.as_bytes()).await;
    stream
}

/// Sends a whole `POST` with a JSON `body` on a connection with a small receive buffer,
/// and never reads the answer.
pub async fn unread_request(addr: SocketAddr, path: &str, token: &str, body: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let stream = socket.connect(addr).await.expect("connect");
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    write_all(&stream, req.as_bytes()).await;
    stream
}

/// Reads whatever arrives on `stream` until the peer closes it.
pub async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let _ = stream.read_to_end(&mut all).await;
    String::from_utf8_lossy(&all).into_owned()
}

async fn write_all(stream: &TcpStream, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        stream.writable().await.expect("writable");
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("write: {e}"),
        }
    }
}

/// Descriptors of this process open on files under `dir` (spill files are unlinked, so
/// they show only here, as `dir/... (deleted)`).
pub fn fds_under(dir: &std::path::Path) -> usize {
    let prefix = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with(&prefix))
        .count()
}

/// The value of an un-labelled metric line `name value` in Prometheus text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
