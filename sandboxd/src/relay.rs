//! The agent relay's byte pipe: dial a fresh silkd stream for a sandbox, then copy bytes
//! both ways, unparsed, between it and an upgraded client connection; EOF on either side is
//! passed on as a half-close of the other. The HTTP side (the `Upgrade` check and the 101)
//! is the API layer's, in `api/agent.rs`.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::claims::Sandbox;
use crate::engine::GuestStream;
use crate::error::Result;

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

/// Copies both ways in the background once hyper hands over the client's connection.
pub fn spawn(id: String, upgrade: OnUpgrade, mut guest_stream: GuestStream) {
    tokio::spawn(async move {
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
