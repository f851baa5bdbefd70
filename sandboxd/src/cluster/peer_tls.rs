//! mTLS between cluster nodes (`[cluster] peer_listen`, `peer_ca`, `peer_cert`,
//! `peer_key`): the rustls settings both ways (the peer listener requires a client
//! certificate chaining to `peer_ca`; a forward trusts only `peer_ca` and presents
//! `peer_cert`), the peer listener itself, and [`VerifiedPeer`], the mark its requests
//! carry: with peer TLS only they may say they were routed already.
//!
//! rustls with the ring provider, named explicitly: it is how `etcd-client`'s TLS builds
//! rustls here, so no second crypto library (aws-lc-rs, OpenSSL) is linked.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_rustls::{client::TlsStream, TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

use super::config::ClusterConfig;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::serve::{self, Connections, Handler};

/// Bound on a peer's TLS handshake, taken in the connection's own task.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; a connection beyond is closed at once, so that
/// clients that never finish one cost at most this many tasks and descriptors.
const HANDSHAKES_MAX: usize = 256;
/// What both sides speak inside the session.
const ALPN: &[u8] = b"http/1.1";

/// In a request's extensions: it arrived on the peer listener, over a TLS session whose
/// client certificate chains to `peer_ca`.
#[derive(Debug, Clone, Copy)]
pub struct VerifiedPeer;

/// Both sides of peer TLS, loaded from the PEM files at start.
pub struct PeerTls {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

fn bad(key: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Config(format!("[cluster] {key} {}: {e}", path.display()))
}

fn read(key: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| bad(key, path, e))
}

/// Every certificate in PEM file `path`; none is an error.
fn certificates(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(&read(key, path)?)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(key, path, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad(key, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

impl PeerTls {
    /// Loads `peer_ca`, `peer_cert` and `peer_key`; `None` without peer TLS. A file that
    /// does not hold what its key names, or a key that is not the certificate's, is a
    /// config error naming the key and the path.
    pub fn load(config: &ClusterConfig) -> Result<Option<PeerTls>> {
        let (Some(ca), Some(cert), Some(key)) =
            (&config.peer_ca, &config.peer_cert, &config.peer_key)
        else {
            return Ok(None);
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for c in certificates("peer_ca", ca)? {
            roots.add(c).map_err(|e| bad("peer_ca", ca, e))?;
        }
        let roots = Arc::new(roots);
        let chain = certificates("peer_cert", cert)?;
        let private = PrivateKeyDer::from_pem_slice(&read("peer_key", key)?)
            .map_err(|e| bad("peer_key", key, format!("not a PEM private key: {e}")))?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| bad("peer_ca", ca, e))?;
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("peer_cert", cert, e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), private.clone_key())
            .map_err(|e| bad("peer_cert", cert, format!("with peer_key: {e}")))?;
        server.alpn_protocols = vec![ALPN.to_vec()];
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("peer_cert", cert, e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, private)
            .map_err(|e| bad("peer_cert", cert, format!("with peer_key: {e}")))?;
        client.alpn_protocols = vec![ALPN.to_vec()];
        Ok(Some(PeerTls {
            server: Arc::new(server),
            client: Arc::new(client),
        }))
    }

    /// The TLS session over `tcp` to the node at `host` (an IP address or a DNS name, as
    /// in its `advertise_url`), whose certificate must chain to `peer_ca` and name it.
    pub async fn connect(&self, host: &str, tcp: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string()).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("host {host:?}: {e}"))
        })?;
        TlsConnector::from(self.client.clone())
            .connect(name, tcp)
            .await
    }
}

/// Binds `[cluster] peer_listen`; `None` without peer TLS.
pub async fn bind(config: &ClusterConfig) -> Result<Option<TcpListener>> {
    let Some(addr) = config.peer_listen_addr()? else {
        return Ok(None);
    };
    TcpListener::bind(addr)
        .await
        .map(Some)
        .map_err(Error::io(format!("binding [cluster] peer_listen {addr}")))
}

/// The running peer listener; [`Listening::stop`] ends it.
pub struct Listening {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Listening {
    /// Stops accepting and closes open peer connections.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Serves the API on `listener` to verified peers: each connection's TLS handshake,
/// then the native handler with [`VerifiedPeer`] in every request's extensions.
pub fn serve(node: Arc<Node>, tls: &PeerTls, listener: TcpListener) -> Listening {
    let addr = listener.local_addr().ok();
    let stop = CancellationToken::new();
    let acceptor = TlsAcceptor::from(tls.server.clone());
    let task = tokio::spawn(accept_loop(node, acceptor, listener, stop.clone()));
    tracing::info!(addr = ?addr, "peer listener (mTLS) serving");
    Listening { stop, task }
}

async fn accept_loop(
    node: Arc<Node>,
    acceptor: TlsAcceptor,
    listener: TcpListener,
    stop: CancellationToken,
) {
    // The native listener's limits, with slots of its own: clients cannot starve the
    // other nodes' forwards, nor those the clients.
    let slots = Arc::new(Connections::new(&node.config.http, node.metrics.clone()));
    let api = serve::api_handler(node);
    let handler: Handler = Arc::new(move |mut req| {
        req.extensions_mut().insert(VerifiedPeer);
        api(req)
    });
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (tcp, from) = tokio::select! {
            () = stop.cancelled() => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("peer accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(handshake) = handshakes.clone().try_acquire_owned() else {
            tracing::debug!(%from, "peer connection closed: {HANDSHAKES_MAX} handshakes at once");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, slots, handler) = (acceptor.clone(), slots.clone(), handler.clone());
        conns.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return tracing::info!(%from, "peer TLS handshake failed: {e}"),
                Err(_) => return tracing::info!(%from, "peer TLS handshake timed out"),
            };
            drop(handshake);
            slots.serve_with(handler, Box::new(tls)).await;
        });
        while conns.try_join_next().is_some() {}
    }
    conns.shutdown().await;
}

/// The address a bound peer listener advertises: `https://` and its address, unless it
/// is a wildcard.
pub fn advertised(bound: SocketAddr) -> Option<String> {
    (!bound.ip().is_unspecified()).then(|| format!("https://{bound}"))
}
