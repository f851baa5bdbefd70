//! `sbx port-forward ID LOCAL:REMOTE`: listens on `127.0.0.1:LOCAL` and tunnels each
//! accepted connection to port REMOTE inside the sandbox through its own
//! [`connect_port`](sandbox_sdk::Sandbox::connect_port). Runs until interrupted; a
//! connection that fails (nothing listens in the sandbox, the relay cap) is closed and
//! reported on stderr, the listener goes on.

use sandbox_sdk::Client;
use tokio::net::TcpListener;

/// Parses `LOCAL:REMOTE` (ports; LOCAL 0 picks a free one, printed on stdout).
pub fn parse_mapping(s: &str) -> Result<(u16, u16), String> {
    let (local, remote) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not LOCAL:REMOTE"))?;
    let local = local
        .parse::<u16>()
        .map_err(|_| format!("local port {local:?} is not 0..=65535"))?;
    let remote = match remote.parse::<u16>() {
        Ok(p) if p != 0 => p,
        _ => return Err(format!("remote port {remote:?} is not 1..=65535")),
    };
    Ok((local, remote))
}

/// Serves until the process is interrupted; returns only when the listener fails.
pub async fn port_forward_cmd(
    client: &Client,
    id: String,
    local: u16,
    remote: u16,
) -> Result<(), std::io::Error> {
    let listener = TcpListener::bind(("127.0.0.1", local)).await?;
    let bound = listener.local_addr()?;
    // The one line on stdout: scripts (and the tests) read the port from it when LOCAL is 0.
    println!("forwarding {bound} -> {id}:{remote}");
    let sandbox = client.sandbox(id);
    loop {
        let (mut conn, peer) = listener.accept().await?;
        let sandbox = sandbox.clone();
        tokio::spawn(async move {
            match sandbox.connect_port(remote).await {
                Ok(mut tunnel) => {
                    if let Err(e) = tokio::io::copy_bidirectional(&mut conn, &mut tunnel).await {
                        eprintln!("sbx: {peer}: {e}");
                    }
                }
                Err(e) => eprintln!("sbx: {peer}: port {remote}: {e}"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mappings() {
        assert_eq!(super::parse_mapping("8080:80"), Ok((8080, 80)));
        assert_eq!(super::parse_mapping("0:8000"), Ok((0, 8000)));
        for bad in ["8080", "8080:0", "x:80", "80:70000", ":80"] {
            assert!(super::parse_mapping(bad).is_err(), "{bad}");
        }
    }
}
