//! The operator's node-wide routes, all root only: `GET /v1/info`, `PUT /v1/pools`,
//! `GET /metrics`.

use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};

use super::{full, json, read_json, Body};
use crate::auth::{require_root, Caller};
use crate::error::Result;
use crate::node::Node;

pub(super) fn info(node: &Node, caller: &Caller) -> Result<Response<Body>> {
    require_root(caller)?;
    Ok(json(StatusCode::OK, &node.info()))
}

pub(super) async fn put_pools(
    node: &Node,
    caller: &Caller,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    require_root(caller)?;
    let update: api::PoolsUpdate = read_json(node, req, false).await?;
    let pools = node.pools.update(update)?;
    Ok(json(StatusCode::OK, &api::PoolsUpdate { pools }))
}

pub(super) fn metrics(node: &Node, caller: &Caller) -> Result<Response<Body>> {
    require_root(caller)?;
    let mut resp = Response::new(full(node.metrics.encode()));
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Ok(resp)
}
