//! The cluster's side of the API (`[cluster]` only): requests for a sandbox another node
//! owns, forwarded before authentication (only the owner knows the sandbox's token);
//! claims placed on a member and counted against the tenant cluster-wide; release
//! clearing the ownership record; and the routes `GET /v1/cluster` and
//! `POST /v1/node/drain`. A request that carries the peer token (and, with peer TLS,
//! arrived on the peer listener) was routed already and is served where it lands.

use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::{decode_json, empty, json, read_body, read_json, Body};
use crate::auth::{require_claimer, require_root, require_sandbox, Caller};
use crate::cluster::forward::{self, name_node};
use crate::cluster::{Cluster, Route as Owner};
use crate::error::{Error, Result};
use crate::node::Node;

fn routed_already(cluster: &Cluster, req: &Request<Incoming>) -> bool {
    cluster.is_peer(req)
}

/// A request for sandbox `id`: `Ok(req)` back when it is served here (claimed here, or
/// routed here by a peer), else the owner's answer (or 404, 410, 502, 503).
pub(super) async fn forward_for(
    node: &Node,
    id: &str,
    req: Request<Incoming>,
) -> Result<std::result::Result<Request<Incoming>, Response<Body>>> {
    let Some(cluster) = node.cluster.get() else {
        return Ok(Ok(req));
    };
    if node.claims.get(id).is_some() || routed_already(cluster, &req) {
        return Ok(Ok(req));
    }
    match cluster.route_for(id).await? {
        // Recorded here but not claimed here: released, or expired.
        Owner::Local => Err(Error::NotFound),
        Owner::Peer(owner) => {
            let release = req.uri().path().ends_with("/release");
            let mut resp = forward::forward(cluster, &owner.name, &owner.url, req).await?;
            if release && resp.status().is_success() {
                cluster.forget(id);
            }
            name_node(&mut resp, &owner.name);
            Ok(Err(resp))
        }
    }
}

/// `POST /v1/claim` in a cluster: placed on a member (this node when it has a warm guest),
/// the tenant's slot taken in etcd, the owner recorded before the answer.
pub(super) async fn claim(
    node: &Arc<Node>,
    cluster: &Cluster,
    caller: &Caller,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let tenant = require_claimer(caller)?;
    let routed = routed_already(cluster, &req);
    let (parts, body) = req.into_parts();
    let bytes = read_body(node, body, super::MAX_BODY).await?;
    let claim: api::ClaimRequest = decode_json(&bytes, true)?;
    // A snapshot lives on the node that took it (etcd does not track snapshots): a fork
    // is served here, where the caller found the snapshot, or answers 404.
    if !routed && claim.snapshot.is_none() {
        let (default_template, default_size) = node.config.default_key();
        let template = claim.template.clone().unwrap_or(default_template);
        let size = claim.size.clone().unwrap_or(default_size);
        // This node's own warm guests are read live: its published record can lag behind a
        // claim or a refill by the debounce, and a warm guest here is the fastest answer.
        let warm_here = !cluster.draining()
            && node
                .pools
                .info()
                .iter()
                .any(|p| p.template == template && p.size == size && p.warm > 0);
        if !warm_here {
            let target = cluster.place(&template, &size)?;
            if target.name != cluster.name() {
                let req = Request::from_parts(parts, Full::new(bytes));
                let mut resp = forward::forward(cluster, &target.name, &target.url, req).await?;
                name_node(&mut resp, &target.name);
                return Ok(resp);
            }
        }
    }
    if cluster.draining() {
        return Err(Error::Busy {
            reason: format!(
                "node {:?} is draining; claim at another node",
                cluster.name()
            ),
            retry_after: 1,
        });
    }
    let slot = match tenant {
        Some(t) => {
            let max = node
                .config
                .tenants
                .iter()
                .find(|x| x.name == t)
                .map_or(0, |x| x.max_claims);
            Some(cluster.reserve_slot(t, max).await?)
        }
        None => None,
    };
    let free_slot = async |slot: &Option<String>| {
        if let (Some(t), Some(s)) = (tenant, slot) {
            cluster.free_slot(t, s).await;
        }
    };
    let claimed = match node.claim(tenant, claim).await {
        Ok(c) => c,
        Err(e) => {
            free_slot(&slot).await;
            return Err(e);
        }
    };
    let id = claimed.response.id.clone();
    if let Err(e) = cluster
        .record_owner(&id, tenant.map(str::to_string), slot.clone())
        .await
    {
        // Unrecorded, no other node could route to it: refuse the claim whole.
        let _ = node.release(&id).await;
        free_slot(&slot).await;
        return Err(e);
    }
    let mut resp = json(StatusCode::OK, &claimed.response);
    let timing = format!("claim;dur={:.3}", claimed.elapsed.as_secs_f64() * 1000.0);
    if let Ok(v) = hyper::header::HeaderValue::from_str(&timing) {
        resp.headers_mut().insert("server-timing", v);
    }
    name_node(&mut resp, cluster.name());
    Ok(resp)
}

/// `POST /v1/sandboxes/{id}/release` on the owner: the ownership record and the tenant
/// slot go with the sandbox.
pub(super) async fn release(
    node: &Node,
    cluster: &Cluster,
    caller: &Caller,
    id: &str,
) -> Result<Response<Body>> {
    require_sandbox(caller, id)?;
    node.release(id).await?;
    cluster.released(id).await;
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    Ok(resp)
}

fn clustered(node: &Node) -> Result<&Cluster> {
    node.cluster.get().map(|c| &**c).ok_or_else(|| {
        Error::BadRequest("this node is not in a cluster (no [cluster] in its config)".into())
    })
}

/// `GET /v1/cluster` (root): the members as this node last read them.
pub(super) fn view(node: &Node, caller: &Caller) -> Result<Response<Body>> {
    require_root(caller)?;
    let cluster = clustered(node)?;
    Ok(json(
        StatusCode::OK,
        &api::cluster::ClusterView {
            node: cluster.name().to_string(),
            etcd_reachable: cluster.etcd_reachable(),
            nodes: cluster.members(),
            owners_known: cluster.owners_known(),
        },
    ))
}

/// `POST /v1/node/drain` (root): no new claims here; what is claimed keeps serving.
pub(super) async fn drain(
    node: &Node,
    caller: &Caller,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    require_root(caller)?;
    let cluster = clustered(node)?;
    let body: api::cluster::DrainRequest = read_json(node, req, true).await?;
    cluster.set_draining(body.drain.unwrap_or(true));
    Ok(json(
        StatusCode::OK,
        &api::cluster::DrainResponse {
            node: cluster.name().to_string(),
            draining: cluster.draining(),
            sandboxes: node.claims.active(),
        },
    ))
}
