//! `GET /v1/sandboxes/{id}/agent`: the `Upgrade: silkd` check (426), a relay slot for the
//! sandbox (429 at `[http] max_relays_per_sandbox`), the guest dialled before any 101 (502
//! if unreachable), then `101 Switching Protocols` and the relay.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, UPGRADE};
use hyper::{Request, Response, StatusCode};

use super::{awake_for, empty, Body};
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::relay;

/// The protocol name clients must ask for.
pub const PROTOCOL: &str = "silkd";

pub(super) async fn agent(
    node: &Node,
    caller: &Caller,
    id: &str,
    mut req: Request<Incoming>,
) -> Result<Response<Body>> {
    check_upgrade(&req, PROTOCOL)?;
    let sandbox = awake_for(node, caller, id).await?;
    let started = std::time::Instant::now();
    let slot = node.relays.take(&sandbox.id)?;
    node.metrics.relays.inc();
    let guest_stream = relay::dial(&sandbox).await?;
    node.metrics
        .relay_setup_seconds
        .observe(started.elapsed().as_secs_f64());
    relay::spawn(
        sandbox.id.clone(),
        slot,
        hyper::upgrade::on(&mut req),
        guest_stream,
        Bytes::new(),
    );
    Ok(switching(PROTOCOL))
}

/// `101 Switching Protocols` to `protocol`.
pub(super) fn switching(protocol: &'static str) -> Response<Body> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut()
        .insert(UPGRADE, HeaderValue::from_static(protocol));
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    resp
}

/// 426 unless the request asks to upgrade to `protocol`.
pub(super) fn check_upgrade(req: &Request<Incoming>, protocol: &'static str) -> Result<()> {
    let wants = req
        .headers()
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case(protocol));
    if wants {
        Ok(())
    } else {
        Err(Error::UpgradeRequired(protocol))
    }
}
