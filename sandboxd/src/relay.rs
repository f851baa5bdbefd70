//! The agent relay's byte pipe: dial a fresh silkd stream for a sandbox, then copy bytes
//! both ways, unparsed, between it and an upgraded client connection; EOF on either side is
//! passed on as a half-close of the other. The HTTP side (the `Upgrade` check and the 101)
//! is the API layer's, in `api/agent.rs`. Relays per sandbox are capped ([`Relays`]):
//! each holds a stream of the guest channel, and the channel's stream limit is the
//! guest's, not one client's to exhaust.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio_util::codec::Framed;
use wire::{ErrorKind, HostCodec, Request, Response};

use crate::claims::Sandbox;
use crate::engine::GuestStream;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Open relays per sandbox, against `[http] max_relays_per_sandbox`.
pub struct Relays {
    max: u32,
    open: Mutex<HashMap<String, u32>>,
    metrics: Arc<Metrics>,
}

/// One open relay's place; freed on drop.
pub struct RelaySlot {
    relays: Arc<Relays>,
    id: String,
}

impl Drop for RelaySlot {
    fn drop(&mut self) {
        let mut open = self.relays.open.lock().expect("relays lock");
        if let Some(n) = open.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.id);
            }
        }
        self.relays.metrics.relays_open.dec();
    }
}

impl Relays {
    /// At most `max` relays per sandbox.
    pub fn new(max: u32, metrics: Arc<Metrics>) -> Arc<Relays> {
        Arc::new(Relays {
            max,
            open: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    /// A slot for one more relay to sandbox `id`, or 429 at the cap.
    pub fn take(self: &Arc<Self>, id: &str) -> Result<RelaySlot> {
        let mut open = self.open.lock().expect("relays lock");
        let n = open.entry(id.to_string()).or_default();
        if *n >= self.max {
            return Err(Error::TooManyRelays { max: self.max });
        }
        *n += 1;
        drop(open);
        self.metrics.relays_open.inc();
        Ok(RelaySlot {
            relays: self.clone(),
            id: id.to_string(),
        })
    }
}

/// Dials the sandbox's guest; a sandbox that has failed, or a guest that cannot be
/// reached, is an error (the API answers it before any 101).
pub async fn dial(sandbox: &Sandbox) -> Result<GuestStream> {
    if let Some(e) = sandbox.failed_error() {
        return Err(e);
    }
    match sandbox.guest().dial().await {
        Ok(s) => Ok(s),
        Err(e) => Err(sandbox.explain(e).await),
    }
}

/// Bound on a port tunnel's answer: silkd dials 127.0.0.1, which answers at once; a guest
/// that stays silent must not hold the HTTP request open.
const CONNECT_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks silkd on a fresh stream to connect to `127.0.0.1:port` inside the sandbox. On
/// success, the stream (now the TCP connection's bytes) and whatever of them was already
/// read; nothing listening there is [`Error::PortUnreachable`].
pub async fn connect_port(sandbox: &Sandbox, port: u16) -> Result<(GuestStream, Bytes)> {
    let stream = dial(sandbox).await?;
    let mut conn = Framed::new(
        stream,
        HostCodec::new().with_max(crate::guest::GUEST_FRAME_MAX),
    );
    let answer = tokio::time::timeout(CONNECT_BOUND, async {
        conn.send(Request::Connect { port }).await?;
        conn.next().await.transpose().map_err(Error::from)
    })
    .await
    .map_err(|_| {
        Error::Guest(format!(
            "silkd did not answer connect within {CONNECT_BOUND:?}"
        ))
    })??;
    match answer {
        Some(Response::Done) => {
            let parts = conn.into_parts();
            Ok((parts.io, parts.read_buf.freeze()))
        }
        Some(Response::Error {
            kind: ErrorKind::NotFound | ErrorKind::PermissionDenied,
            message,
        }) => Err(Error::PortUnreachable(message)),
        Some(Response::Error {
            kind: ErrorKind::BadRequest,
            message,
        }) => Err(Error::BadRequest(message)),
        Some(other) => Err(Error::Guest(format!(
            "unexpected answer to connect: {other:?}"
        ))),
        None => Err(Error::Guest(
            "silkd closed the stream before answering connect".into(),
        )),
    }
}

/// Copies both ways in the background once hyper hands over the client's connection; the
/// slot is held until the relay ends. `early` is what the guest already sent (read past
/// a port tunnel's answer frame): the client gets it first.
pub fn spawn(
    id: String,
    slot: RelaySlot,
    upgrade: OnUpgrade,
    mut guest_stream: GuestStream,
    early: Bytes,
) {
    tokio::spawn(async move {
        let _slot = slot;
        match upgrade.await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                if !early.is_empty() {
                    if let Err(e) = client.write_all(&early).await {
                        tracing::debug!(%id, "relay ended: {e}");
                        return;
                    }
                }
                // 8 KiB buffers (copy_bidirectional's default) made a 1 GiB stdout
                // 131,072 read/write pairs each way; output flows guest → client in
                // silkd's 64 KiB frames, so take whole frames (and what follows) per read.
                let copied = tokio::io::copy_bidirectional_with_sizes(
                    &mut client,
                    &mut guest_stream,
                    UP_BUFFER,
                    DOWN_BUFFER,
                )
                .await;
                match copied {
                    Ok((up, down)) => tracing::debug!(%id, up, down, "relay closed"),
                    Err(e) => tracing::debug!(%id, "relay ended: {e}"),
                }
            }
            Err(e) => tracing::warn!(%id, "relay upgrade failed: {e}"),
        }
    });
}

/// Client → guest copy buffer: stdin and uploads, in the SDK's pieces.
const UP_BUFFER: usize = 64 * 1024;
/// Guest → client copy buffer: several of silkd's 64 KiB output frames per read.
const DOWN_BUFFER: usize = 256 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relays_are_capped_per_sandbox_and_freed_on_drop() {
        let metrics = Arc::new(Metrics::new());
        let relays = Relays::new(2, metrics.clone());
        let a = relays.take("sb-1").unwrap();
        let _b = relays.take("sb-1").unwrap();
        assert!(matches!(
            relays.take("sb-1"),
            Err(Error::TooManyRelays { max: 2 })
        ));
        let _other = relays.take("sb-2").unwrap();
        assert_eq!(metrics.relays_open.get(), 3);
        drop(a);
        let _c = relays.take("sb-1").unwrap();
        drop((_b, _c, _other));
        assert!(relays.open.lock().unwrap().is_empty());
        assert_eq!(metrics.relays_open.get(), 0);
    }
}
