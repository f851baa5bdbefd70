//! TLS to etcd (`[cluster] etcd_ca`, `etcd_cert`, `etcd_key`): the client's TLS settings
//! (rustls, through `etcd-client`'s `tls` feature: no system OpenSSL to match) and the
//! start-time check that a reachable member takes them.

use etcd_client::{Certificate, Client, Identity, TlsOptions};

use super::config::ClusterConfig;
use super::etcd::{detail, CALL_TIMEOUT};
use crate::error::{Error, Result};

/// `[cluster] etcd_ca` (and the client identity) as the client's TLS settings; `None`
/// for plain `http://` endpoints.
pub(super) fn options(config: &ClusterConfig) -> Result<Option<TlsOptions>> {
    let read = |key: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| Error::Config(format!("[cluster] {key} {}: {e}", path.display())))
    };
    let Some(ca) = &config.etcd_ca else {
        return Ok(None);
    };
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read("etcd_ca", ca)?));
    if let (Some(cert), Some(key)) = (&config.etcd_cert, &config.etcd_key) {
        tls = tls.identity(Identity::from_pem(
            read("etcd_cert", cert)?,
            read("etcd_key", key)?,
        ));
    }
    Ok(Some(tls))
}

/// Refuses to start when a member accepts TCP connections but the TLS session with it
/// fails (a CA that does not match, a client certificate etcd does not take): retrying
/// never fixes that, so it is a config error now, not an endless "unreachable" later.
/// A member that is down, or too slow to answer, is left to the usual retries.
pub(super) async fn check(config: &ClusterConfig, clients: &[Client]) -> Result<()> {
    // A server that wants a client certificate drops the connection without one, which
    // is all the client sees: say so.
    let hint = match config.etcd_cert {
        Some(_) => "",
        None => "; etcd with --client-cert-auth drops clients without etcd_cert/etcd_key",
    };
    for (endpoint, client) in config.etcd.iter().zip(clients) {
        let host = endpoint
            .trim_start_matches("https://")
            .trim_end_matches('/');
        let tcp = tokio::time::timeout(CALL_TIMEOUT, tokio::net::TcpStream::connect(host)).await;
        if !matches!(tcp, Ok(Ok(_))) {
            continue;
        }
        let Some(e) = probe(client).await else {
            continue;
        };
        return Err(Error::Config(format!(
            "[cluster] TLS with etcd endpoint {endpoint:?} failed (check etcd_ca, etcd_cert, \
             etcd_key): {}{hint}",
            detail(&e)
        )));
    }
    Ok(())
}

/// Asks a member for its status up to [`PROBES`] times while it only times out; the
/// failure, or `None` when it answered or stayed too slow to tell.
async fn probe(client: &Client) -> Option<etcd_client::Error> {
    for _ in 0..PROBES {
        match client.clone().status().await {
            Ok(_) => return None,
            Err(e) if timed_out(&e) => continue,
            Err(e) => return Some(e),
        }
    }
    None
}

/// Status asks a member per probe: a loaded host can stall one call past the bound.
const PROBES: usize = 3;

/// A call that ran out of time (the client's own bound, or the server's deadline), as
/// opposed to one cut off: a connection dropped mid-call is `Cancelled` too, with
/// another message, and is what a server refusing the client's certificate looks like.
fn timed_out(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::DeadlineExceeded
                || (s.code() == tonic::Code::Cancelled
                    && s.message() == tonic::TimeoutExpired(()).to_string())
        }
        _ => false,
    }
}
