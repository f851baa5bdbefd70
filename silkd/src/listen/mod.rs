//! Where connections come from (`unix:`, `vsock:`, `serial:`). Each stream is served by
//! [`crate::conn`].

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::proc::ProcessTable;
use crate::{Error, Result};

mod serial;
mod unix;
#[cfg(target_os = "linux")]
mod vsock;

/// A listen address from `--listen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// `unix:/path/sock`
    Unix(PathBuf),
    /// `vsock:PORT` (any CID).
    Vsock(u32),
    /// `serial:NAME`: the virtio-serial port `/dev/virtio-ports/NAME` (or an absolute path).
    Serial(String),
}

impl ListenAddr {
    /// Parses `unix:/path`, `vsock:PORT` or `serial:NAME`.
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(Error::ListenAddr(s.into()));
            }
            return Ok(ListenAddr::Unix(path.into()));
        }
        if let Some(port) = s.strip_prefix("vsock:") {
            return port
                .parse()
                .map(ListenAddr::Vsock)
                .map_err(|_| Error::ListenAddr(s.into()));
        }
        if let Some(name) = s.strip_prefix("serial:") {
            if name.is_empty() {
                return Err(Error::ListenAddr(s.into()));
            }
            return Ok(ListenAddr::Serial(name.into()));
        }
        Err(Error::ListenAddr(s.into()))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Vsock(port) => write!(f, "vsock:{port}"),
            ListenAddr::Serial(name) => write!(f, "serial:{name}"),
        }
    }
}

/// A bound listener.
pub enum Listener {
    /// A Unix stream socket.
    Unix(tokio::net::UnixListener),
    /// A vsock socket.
    #[cfg(target_os = "linux")]
    Vsock(tokio_vsock::VsockListener),
    /// A virtio-serial port (opened lazily: it may appear after silkd starts).
    Serial(PathBuf),
}

/// Binds `addr`.
pub async fn bind(addr: &ListenAddr) -> Result<Listener> {
    match addr {
        ListenAddr::Unix(path) => unix::bind(path).map(Listener::Unix),
        #[cfg(target_os = "linux")]
        ListenAddr::Vsock(port) => vsock::bind(*port).map(Listener::Vsock),
        #[cfg(not(target_os = "linux"))]
        ListenAddr::Vsock(_) => Err(Error::ListenAddr("vsock needs Linux".into())),
        ListenAddr::Serial(name) => Ok(Listener::Serial(serial::port_path(name))),
    }
}

/// Accepts forever, serving each connection on its own task. Accept errors (EMFILE...)
/// are logged and retried after a pause instead of ending the loop.
pub async fn accept_loop(listener: Listener, table: Arc<ProcessTable>) {
    if let Listener::Serial(path) = listener {
        if let Err(e) = serial::serve(path, table).await {
            tracing::error!("serial listener stopped: {e}");
        }
        return;
    }
    loop {
        let accepted = match &listener {
            Listener::Unix(l) => l
                .accept()
                .await
                .map(|(s, _)| tokio::spawn(crate::conn::serve(s, table.clone()))),
            #[cfg(target_os = "linux")]
            Listener::Vsock(l) => l
                .accept()
                .await
                .map(|(s, _)| tokio::spawn(crate::conn::serve(s, table.clone()))),
            Listener::Serial(_) => unreachable!("served above"),
        };
        if let Err(e) = accepted {
            tracing::warn!("accept: {e}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}
