//! The agent relay: `GET /v1/sandboxes/{id}/agent` with `Upgrade: silkd` becomes a raw byte
//! pipe between the client and one fresh silkd stream. Bytes are copied unparsed; EOF on
//! either side is passed on as a half-close of the other.

use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, UPGRADE};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;

use crate::claims::Sandbox;
use crate::error::{Error, Result};

/// The protocol name clients must ask for.
pub const PROTOCOL: &str = "silkd";

/// 426 unless the request asks to upgrade to `silkd`.
pub fn check_upgrade(req: &Request<Incoming>) -> Result<()> {
    let wants = req
        .headers()
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case(PROTOCOL));
    if wants {
        Ok(())
    } else {
        Err(Error::UpgradeRequired)
    }
}

/// Dials the guest first (502 if it cannot be reached, before any 101), then answers 101
/// and relays in the background once hyper hands over the connection.
pub async fn start(
    sandbox: &Sandbox,
    mut req: Request<Incoming>,
) -> Result<hyper::Response<crate::api::Body>> {
    if let Some(e) = sandbox.failed_error() {
        return Err(e);
    }
    let mut guest_stream = match sandbox.guest.dial().await {
        Ok(s) => s,
        Err(e) => {
            sandbox.mark_failed(&e.to_string());
            return Err(sandbox.explain(e).await);
        }
    };
    let upgrade = hyper::upgrade::on(&mut req);
    let id = sandbox.id.clone();
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
    let mut resp = hyper::Response::new(crate::api::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut()
        .insert(UPGRADE, HeaderValue::from_static(PROTOCOL));
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    Ok(resp)
}
