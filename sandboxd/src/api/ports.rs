//! `GET /v1/sandboxes/{id}/ports/{port}`: the `Upgrade: tcp` check (426), the port parsed
//! (400 for 0 or anything that is not 1..=65535), a relay slot (429, the same cap as the
//! agent relay: each tunnel holds a guest stream too), the port dialled inside the sandbox
//! before any 101 (502 when nothing listens), then `101 Switching Protocols` and the bytes.

use hyper::body::Incoming;
use hyper::{Request, Response};

use super::agent::{check_upgrade, switching};
use super::{awake_for, Body};
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::relay;

/// The protocol name clients must ask for.
pub const PROTOCOL: &str = "tcp";

pub(super) async fn port(
    node: &Node,
    caller: &Caller,
    id: &str,
    mut req: Request<Incoming>,
) -> Result<Response<Body>> {
    let port = parse_port(req.uri().path())?;
    check_upgrade(&req, PROTOCOL)?;
    let sandbox = awake_for(node, caller, id).await?;
    let slot = node.relays.take(&sandbox.id)?;
    node.metrics.relays.inc();
    let (guest_stream, early) = relay::connect_port(&sandbox, port).await?;
    relay::spawn(
        sandbox.id.clone(),
        slot,
        hyper::upgrade::on(&mut req),
        guest_stream,
        early,
    );
    Ok(switching(PROTOCOL))
}

/// The path's last segment as a TCP port.
fn parse_port(path: &str) -> Result<u16> {
    let seg = path.rsplit('/').next().unwrap_or_default();
    match seg.parse::<u16>() {
        Ok(p) if p != 0 && seg.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(Error::BadRequest(format!(
            "port {seg:?} is not a TCP port (1..=65535)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports() {
        assert_eq!(
            super::parse_port("/v1/sandboxes/x/ports/8000").unwrap(),
            8000
        );
        for bad in ["0", "65536", "-1", "80a", "+80"] {
            let path = format!("/v1/sandboxes/x/ports/{bad}");
            assert!(super::parse_port(&path).is_err(), "{bad}");
        }
    }
}
