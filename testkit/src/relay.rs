//! The relay's HTTP side from a client: the upgrade request on a raw TCP connection and
//! its `101` (or refusal), leaving the stream to speak `wire` frames on.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Asks for the relay on a fresh connection (`Connection: upgrade`, `Upgrade: silkd`);
/// returns the status, the stream and any bytes read past the response head.
pub async fn upgrade(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> (u16, tokio::net::TcpStream, Vec<u8>) {
    upgrade_with(addr, path, token, true).await
}

/// As [`upgrade`]; without the upgrade headers unless `ask`.
pub async fn upgrade_with(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
    ask: bool,
) -> (u16, tokio::net::TcpStream, Vec<u8>) {
    upgrade_to(addr, path, token, ask.then_some("silkd")).await
}

/// As [`upgrade`], asking for `protocol` (`silkd`, `tcp`), or without upgrade headers.
pub async fn upgrade_to(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
    protocol: Option<&str>,
) -> (u16, tokio::net::TcpStream, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nhost: x\r\n");
    if let Some(t) = token {
        head.push_str(&format!("authorization: Bearer {t}\r\n"));
    }
    if let Some(p) = protocol {
        head.push_str(&format!("connection: upgrade\r\nupgrade: {p}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let end = loop {
        let mut chunk = [0u8; 1024];
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed before the response head");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let status: u16 = String::from_utf8_lossy(&buf[9..12]).parse().unwrap();
    let rest = buf[end..].to_vec();
    (status, s, rest)
}
