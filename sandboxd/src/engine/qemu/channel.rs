//! The host end of a VM's guest channel: connect to QEMU's chardev socket for the
//! `silkd` virtio-serial port, run the session handshake (which also gives the guest
//! its wall clock, fresh entropy and hostname), then open one yamux stream per RPC.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::RngCore;
use tokio::net::UnixStream;
use wire::session::{host_handshake, mux_client, Hello, MuxOpener, MuxStream};

use crate::error::{Error, Result};

/// An open session to one guest's silkd.
pub struct Channel {
    opener: MuxOpener,
    driver: tokio::task::JoinHandle<()>,
}

impl Channel {
    /// Connects and handshakes, bounded by `within` (the guest may still be booting: the
    /// hello waits in the socket until silkd opens its port).
    pub async fn open(socket: &Path, hostname: &str, within: Duration) -> Result<Channel> {
        let attempt = async {
            let stream = loop {
                match UnixStream::connect(socket).await {
                    Ok(s) => break s,
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            };
            let hello = fresh_hello(hostname);
            host_handshake(stream, &hello)
                .await
                .map_err(|e| Error::Guest(format!("handshake on {}: {e}", socket.display())))
        };
        let stream = tokio::time::timeout(within, attempt).await.map_err(|_| {
            Error::Guest(format!(
                "silkd did not answer the handshake on {} within {within:?}",
                socket.display()
            ))
        })??;
        let (opener, driver) = mux_client(stream);
        Ok(Channel {
            opener,
            driver: tokio::spawn(driver),
        })
    }

    /// A fresh stream to silkd.
    pub async fn dial(&self) -> Result<MuxStream> {
        self.opener
            .open()
            .await
            .map_err(|e| Error::Guest(format!("guest channel: {e}")))
    }

    /// Ends the session (every open stream sees it end).
    pub fn close(&self) {
        self.driver.abort();
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

fn fresh_hello(hostname: &str) -> Hello {
    let mut rng = rand::thread_rng();
    let mut nonce = [0u8; 16];
    let mut entropy = [0u8; 32];
    rng.fill_bytes(&mut nonce);
    rng.fill_bytes(&mut entropy);
    let time_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    Hello {
        nonce,
        time_ns,
        entropy,
        hostname: hostname.to_string(),
    }
}
