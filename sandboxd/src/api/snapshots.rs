//! Snapshot routes: take one (`POST /v1/sandboxes/{id}/snapshot`, the sandbox's token or
//! root), list and delete them (a tenant sees its own, root all; another's id is 404),
//! hibernate and wake a sandbox. Forks are claims (`sandboxes.rs`).

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::{empty, json, read_json, sandbox_for, Body};
use crate::auth::{require_claimer, Caller};
use crate::error::Result;
use crate::node::Node;

pub(super) async fn snapshot(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = sandbox_for(node, caller, id)?;
    let body: api::snapshots::SnapshotRequest = read_json(node, req, true).await?;
    Ok(json(StatusCode::OK, &node.snapshot(&sandbox, body).await?))
}

pub(super) fn list(node: &Node, caller: &Caller) -> Result<Response<Body>> {
    let tenant = require_claimer(caller)?;
    let snapshots = node.list_snapshots(tenant)?;
    Ok(json(
        StatusCode::OK,
        &api::snapshots::SnapshotList { snapshots },
    ))
}

pub(super) fn delete(node: &Node, caller: &Caller, id: &str) -> Result<Response<Body>> {
    let tenant = require_claimer(caller)?;
    node.delete_snapshot(tenant, id)?;
    Ok(no_content())
}

pub(super) async fn hibernate(node: &Node, caller: &Caller, id: &str) -> Result<Response<Body>> {
    let sandbox = sandbox_for(node, caller, id)?;
    node.hibernate(&sandbox).await?;
    Ok(no_content())
}

pub(super) async fn wake(node: &Node, caller: &Caller, id: &str) -> Result<Response<Body>> {
    let sandbox = sandbox_for(node, caller, id)?;
    node.wake(&sandbox).await?;
    Ok(no_content())
}

fn no_content() -> Response<Body> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    resp
}
