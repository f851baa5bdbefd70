//! Claim and per-sandbox routes: claim, list, get, release, renew.
//! Authorization order: authenticate (401), check the caller kind (403), then look the id
//! up, where a foreign sandbox token looks exactly like an unknown id (404).

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Request, Response, StatusCode};

use super::{empty, json, read_json, sandbox_for, Body};
use crate::auth::{require_claimer, require_root, require_sandbox, Caller};
use crate::error::Result;
use crate::node::Node;

pub(super) async fn claim(
    node: &Node,
    caller: &Caller,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let tenant = require_claimer(caller)?;
    let body: api::ClaimRequest = read_json(node, req, true).await?;
    let claimed = node.claim(tenant, body).await?;
    let mut resp = json(StatusCode::OK, &claimed.response);
    // Server time of the claim, for clients and benchmarks measuring it.
    let timing = format!("claim;dur={:.3}", claimed.elapsed.as_secs_f64() * 1000.0);
    if let Ok(v) = HeaderValue::from_str(&timing) {
        resp.headers_mut().insert("server-timing", v);
    }
    Ok(resp)
}

pub(super) fn list(node: &Node, caller: &Caller) -> Result<Response<Body>> {
    let tenant = require_claimer(caller)?;
    let sandboxes = node
        .claims
        .list(tenant)
        .iter()
        .map(|s| {
            let mut row = s.summary();
            // The engine's account of a failure carries host detail (log and console
            // tails); a tenant learns that it failed, root can read why.
            if tenant.is_some() && row.error.is_some() {
                row.error = Some(
                    "its guest stopped on its own; the operator can see why \
                     (GET /v1/sandboxes/{id} as root)"
                        .into(),
                );
            }
            row
        })
        .collect();
    Ok(json(StatusCode::OK, &api::SandboxList { sandboxes }))
}

pub(super) fn get(node: &Node, caller: &Caller, id: &str) -> Result<Response<Body>> {
    require_root(caller)?;
    Ok(json(StatusCode::OK, &node.sandbox(id)?.summary()))
}

pub(super) async fn release(node: &Node, caller: &Caller, id: &str) -> Result<Response<Body>> {
    require_sandbox(caller, id)?;
    node.release(id).await?;
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    Ok(resp)
}

pub(super) async fn renew(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = sandbox_for(node, caller, id)?;
    let body: api::RenewRequest = read_json(node, req, false).await?;
    let deadline = node.renew(&sandbox, body.ttl_seconds)?;
    Ok(json(StatusCode::OK, &api::RenewResponse { deadline }))
}
