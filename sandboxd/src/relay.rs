//! The agent relay's byte pipe: dial a fresh silkd stream for a sandbox, then copy bytes
//! both ways, unparsed, between it and an upgraded client connection; EOF on either side is
//! passed on as a half-close of the other. The HTTP side (the `Upgrade` check and the 101)
//! is the API layer's, in `api/agent.rs`. Relays per sandbox are capped ([`Relays`]):
//! each holds a stream of the guest channel, and the channel's stream limit is the
//! guest's, not one client's to exhaust.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

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
    match sandbox.guest.dial().await {
        Ok(s) => Ok(s),
        Err(e) => Err(sandbox.explain(e).await),
    }
}

/// Copies both ways in the background once hyper hands over the client's connection; the
/// slot is held until the relay ends.
pub fn spawn(id: String, slot: RelaySlot, upgrade: OnUpgrade, mut guest_stream: GuestStream) {
    tokio::spawn(async move {
        let _slot = slot;
        match upgrade.await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                match tokio::io::copy_bidirectional(&mut client, &mut guest_stream).await {
                    Ok((up, down)) => tracing::debug!(%id, up, down, "relay closed"),
                    Err(e) => tracing::debug!(%id, "relay ended: {e}"),
                }
            }
            Err(e) => tracing::warn!(%id, "relay upgrade failed: {e}"),
        }
    });
}

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
