//! sandboxd: the host daemon that hands out sandboxes (silkd guests) over HTTP.
//!
//! # Layout
//! - [`config`]: the TOML file, strict, and its one `validate()`.
//! - [`api`]: route table, dispatch, errors → status in one place; handlers per resource.
//! - [`auth`]: root, tenant and sandbox tokens; who may call what.
//! - [`node`]: shared state and the lifecycle (claim, release, TTL reaper, shutdown).
//! - [`claims`]: the registry of claimed sandboxes, limits, deadlines.
//! - [`sandbox`]: one claimed sandbox: identity, deadline, guest, and whether it failed.
//! - [`pool`]: warm pools, goldens and their stamps, refill, persisted targets.
//! - [`exec`]: buffered exec: admission, bounded capture (budget, spill), kill on give-up;
//!   the JSON body is encoded next to its route, in `api/exec.rs`.
//! - [`relay`]: the relay's byte pipe (dial, then copy both ways); the upgrade is `api/agent.rs`.
//! - [`guest`]: RPCs sandboxd makes to silkd itself (Info, Kill, warmup).
//! - [`engine`]: the engine trait, each guest's [`engine::Fate`] (how it ended, written once
//!   by its supervisor), the `process` engine (bubblewrap + cgroups) and `qemu` (real VMs).
//! - [`store`]: the state database (`data_dir/state.db`): claims, pool targets, schema
//!   migrations.
//! - [`reconcile`]: on start, re-adopt recorded sandboxes that are alive, drop the rest,
//!   sweep what no record owns.
//! - [`metrics`]: Prometheus metrics.
//! - [`template`]: a template's default user, workdir and env (from its image's
//!   manifest), rendered as silkd's flags.
//! - [`cluster`]: `[cluster]`: membership in etcd, placement, ownership and forwarding to
//!   the owner (over mTLS with `peer_*`, on a listener of its own), tenant limits across
//!   nodes, drain.
//! - [`serve`]: connections: the `[http]` cap and the header, idle and write timeouts.
//! - [`e2b`]: the optional E2B-compatible listener (`[e2b]`), a translation onto the above.
//!
//! [`run`] takes a bound [`Listener`], so tests start the daemon in-process on port 0.
#![deny(missing_docs)]

pub mod api;
pub mod auth;
pub mod claims;
pub mod cluster;
pub mod config;
pub mod e2b;
pub mod engine;
pub mod error;
pub mod exec;
pub mod files;
pub mod guest;
pub mod hibernate;
pub mod metrics;
pub mod node;
pub mod pool;
pub mod reconcile;
pub mod relay;
pub mod sandbox;
pub mod serve;
pub mod snapshots;
pub mod store;
pub mod template;

use std::future::Future;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};

pub use config::Config;
pub use error::{Error, Result};

use config::ListenAddr;
use node::Node;
use serve::{Conn, Connections};

/// How long open connections get to finish after shutdown began and every sandbox died.
const DRAIN: Duration = Duration::from_secs(2);

/// A bound listening socket.
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// A Unix socket.
    Unix(UnixListener),
}

impl Listener {
    /// Binds `config.listen`; a stale Unix socket file is replaced.
    pub async fn bind(config: &Config) -> Result<Listener> {
        match config.listen_addr()? {
            ListenAddr::Tcp(addr) => TcpListener::bind(addr)
                .await
                .map(Listener::Tcp)
                .map_err(Error::io(format!("binding {addr}"))),
            ListenAddr::Unix(path) => {
                let _ = std::fs::remove_file(&path);
                UnixListener::bind(&path)
                    .map(Listener::Unix)
                    .map_err(Error::io(format!("binding {}", path.display())))
            }
        }
    }

    /// Where it listens, as `host:port` or `unix:/path`.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|e| format!("<tcp: {e}>")),
            Listener::Unix(l) => l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
                .unwrap_or_else(|| "unix:<unnamed>".into()),
        }
    }
}

/// Serves the API on `listener` until `shutdown` resolves, then destroys every idle guest
/// and, by `on_stop`, keeps or destroys the claimed ones, and returns.
pub async fn run(
    listener: Listener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    config.validate()?;
    serve::raise_fd_limit(&config.http);
    let node = Node::start(config).await?;
    let mut peer = None;
    if let Some(c) = node.config.cluster.clone() {
        let bound = match &listener {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(_) => None,
        };
        // Bound before joining: its address is what this node advertises.
        let peer_listener = match cluster::peer_tls::bind(&c).await {
            Ok(l) => l,
            Err(e) => {
                node.shutdown().await;
                return Err(e);
            }
        };
        let peer_bound = peer_listener.as_ref().and_then(|l| l.local_addr().ok());
        let cluster = match cluster::Cluster::join(c, bound, peer_bound).await {
            Ok(cluster) => cluster,
            Err(e) => {
                node.shutdown().await;
                return Err(e);
            }
        };
        let _ = node.cluster.set(cluster.clone());
        if let (Some(l), Some(tls)) = (peer_listener, &cluster.peer_tls) {
            peer = Some(cluster::peer_tls::serve(node.clone(), tls, l));
        }
        cluster::membership::spawn(cluster, node.clone());
    }
    let e2b = match &node.config.e2b {
        Some(c) => match e2b::start(node.clone(), c).await {
            Ok(l) => Some(l),
            Err(e) => {
                if let Some(peer) = peer {
                    peer.stop().await;
                }
                if let Some(cluster) = node.cluster.get() {
                    cluster.leave().await;
                }
                node.shutdown().await;
                return Err(e);
            }
        },
        None => None,
    };
    let slots = Connections::new(&node.config.http, node.metrics.clone());
    tracing::info!(listen = %listener.describe(), "sandboxd serving");
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = accept(&listener) => accepted,
        };
        match accepted {
            Ok(io) => {
                connections.spawn(slots.serve(node.clone(), io));
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Reap finished connection tasks so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
    tracing::info!(on_stop = ?node.config.on_stop, "shutting down");
    if let Some(e2b) = e2b {
        e2b.stop().await;
    }
    if let Some(peer) = peer {
        peer.stop().await;
    }
    if let Some(cluster) = node.cluster.get() {
        cluster.leave().await;
    }
    node.shutdown().await;
    let _ = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
    if let Listener::Unix(l) = &listener {
        let path = l
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(|p| p.to_path_buf()));
        if let Some(path) = path {
            let _ = std::fs::remove_file(path);
        }
    }
    tracing::info!("sandboxd stopped");
    Ok(())
}

async fn accept(listener: &Listener) -> std::io::Result<Box<dyn Conn>> {
    Ok(match listener {
        Listener::Tcp(l) => {
            let (s, _) = l.accept().await?;
            let _ = s.set_nodelay(true);
            Box::new(s)
        }
        Listener::Unix(l) => Box::new(l.accept().await?.0),
    })
}
