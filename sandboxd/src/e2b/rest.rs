//! E2B's REST API for sandbox lifecycle, onto the node: create = claim (timeout = TTL,
//! metadata and env vars recorded with the claim), kill = release, timeout = renew,
//! connect = renew and hand back the access token, list and get from the claims.
//! `X-API-KEY` is a native token: root sees every sandbox, a tenant its own.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::record::{self, E2bRecord};
use super::{json, lifecycle, rest_caller, status_only, E2b, ENVD_VERSION};
use crate::api::query::{decode, Query};
use crate::api::Body;
use crate::auth::{require_claimer, Caller};
use crate::claims::{now_ms, Sandbox};
use crate::error::{Error, Result};

/// What the node answers as `clientID` (E2B's cluster node id; one node here).
const CLIENT_ID: &str = "sandboxd";

/// `POST /v2/sandboxes` (and `/sandboxes`). Unknown fields are ignored (the SDK adds
/// some in every release); the ones that ask for what this node lacks are refused.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    env_vars: BTreeMap<String, String>,
    auto_pause: Option<bool>,
    #[serde(alias = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<Value>,
    mcp: Option<Value>,
    volume_mounts: Option<Value>,
}

#[derive(Deserialize, Default)]
struct Timeout {
    timeout: Option<u64>,
}

/// Routes one REST request; `caller` is set once `X-API-KEY` is known.
pub(super) async fn dispatch(
    e2b: &E2b,
    req: Request<Incoming>,
    caller_out: &mut Option<Caller>,
) -> Result<Response<Body>> {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let segs = match segs.as_slice() {
        ["v2", rest @ ..] => rest.to_vec(),
        s => s.to_vec(),
    };
    if segs.first() != Some(&"sandboxes") {
        return Err(Error::NotFound);
    }
    let caller = rest_caller(e2b, req.headers())?;
    *caller_out = Some(caller.clone());
    let tenant = require_claimer(&caller)?.map(String::from);
    let method = req.method().clone();
    match (&method, &segs[1..]) {
        (&Method::POST, []) => create(e2b, tenant.as_deref(), req).await,
        (&Method::GET, []) => list(e2b, tenant.as_deref(), req.uri().query()),
        (&Method::GET, [id]) => {
            let sandbox = owned(e2b, tenant.as_deref(), id)?;
            Ok(json(StatusCode::OK, &detail(e2b, &sandbox, true)?))
        }
        (&Method::DELETE, [id]) => {
            owned(e2b, tenant.as_deref(), id)?;
            e2b.node.release(id).await?;
            Ok(status_only(StatusCode::NO_CONTENT))
        }
        (&Method::POST, [id, "timeout"]) => {
            let sandbox = owned(e2b, tenant.as_deref(), id)?;
            let body: Timeout = read_json(e2b, req).await?;
            let seconds = body
                .timeout
                .ok_or_else(|| Error::BadRequest("timeout is required".into()))?;
            e2b.node.renew(&sandbox, seconds)?;
            Ok(status_only(StatusCode::NO_CONTENT))
        }
        (&Method::POST, [id, "connect"]) => {
            let sandbox = owned(e2b, tenant.as_deref(), id)?;
            let body: Timeout = read_json(e2b, req).await?;
            let sandbox = lifecycle::running(e2b, &sandbox.id).await?;
            // Connecting extends the lifetime, never shortens it.
            if let Some(t) = body.timeout {
                let wanted = now_ms() / 1000 + t;
                if wanted > sandbox.deadline() {
                    e2b.node.renew(&sandbox, t)?;
                }
            }
            let rec = record::get(&e2b.node.store, id)?.unwrap_or_default();
            Ok(json(StatusCode::OK, &created(e2b, &sandbox, &rec)))
        }
        (&Method::POST, [id, "pause"]) => {
            let sandbox = owned(e2b, tenant.as_deref(), id)?;
            lifecycle::pause(e2b, &sandbox).await?;
            Ok(status_only(StatusCode::NO_CONTENT))
        }
        (&Method::POST, [id, what])
            if ["resume", "refreshes", "fork", "snapshots"].contains(what) =>
        {
            owned(e2b, tenant.as_deref(), id)?;
            Err(Error::Unsupported(format!("POST /sandboxes/{{id}}/{what}")))
        }
        (&Method::GET, [id, what]) if ["logs", "metrics"].contains(what) => {
            owned(e2b, tenant.as_deref(), id)?;
            Err(Error::Unsupported(format!("GET /sandboxes/{{id}}/{what}")))
        }
        (&Method::PUT, [id, "network"]) => {
            owned(e2b, tenant.as_deref(), id)?;
            Err(Error::Unsupported(
                "network settings: sandboxes on this node have no network".into(),
            ))
        }
        _ => Err(Error::NotFound),
    }
}

/// The sandbox `id` when the caller may act on it: root any, a tenant its own; another
/// tenant's looks exactly like an unknown id (404).
fn owned(e2b: &E2b, tenant: Option<&str>, id: &str) -> Result<Arc<Sandbox>> {
    let sandbox = e2b.node.sandbox(id)?;
    match tenant {
        Some(t) if sandbox.tenant.as_deref() != Some(t) => Err(Error::NotFound),
        _ => Ok(sandbox),
    }
}

async fn create(e2b: &E2b, tenant: Option<&str>, req: Request<Incoming>) -> Result<Response<Body>> {
    let body: NewSandbox = read_json(e2b, req).await?;
    let refuse = |what: &str| Err(Error::Unsupported(what.to_string()));
    if body.auto_pause == Some(true) {
        return refuse("autoPause: pause lands with hibernate");
    }
    if body.allow_internet_access == Some(true) || body.network.is_some() {
        return refuse(
            "internet access and network settings: sandboxes on this node have no network",
        );
    }
    if body.mcp.is_some() {
        return refuse("MCP gateways");
    }
    if body.volume_mounts.is_some() {
        return refuse("volume mounts");
    }
    for (k, v) in body.metadata.iter().chain(&body.env_vars) {
        if k.len() + v.len() > 64 * 1024 {
            return Err(Error::BadRequest(format!(
                "metadata or env var {k:?} is too long"
            )));
        }
    }
    let template = e2b.config.template(&body.template_id).to_string();
    let claimed = e2b
        .node
        .claim(
            tenant,
            api::ClaimRequest {
                template: Some(template),
                size: None,
                ttl_seconds: body.timeout,
                snapshot: None,
            },
        )
        .await?;
    let id = claimed.response.id;
    let rec = E2bRecord {
        template_id: body.template_id,
        metadata: body.metadata,
        env_vars: body.env_vars,
        started_ms: now_ms(),
    };
    if let Err(e) = record::put(&e2b.node.store, &id, &rec) {
        // Unrecorded, its metadata would be lost at a restart: refuse it whole.
        let _ = e2b.node.release(&id).await;
        return Err(e);
    }
    let sandbox = e2b.node.sandbox(&id)?;
    Ok(json(StatusCode::CREATED, &created(e2b, &sandbox, &rec)))
}

/// The create (and connect) answer.
fn created(e2b: &E2b, sandbox: &Sandbox, rec: &E2bRecord) -> Value {
    json!({
        "templateID": template_id(sandbox, rec),
        "sandboxID": sandbox.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": record::access_token(&e2b.secret, &sandbox.id),
        "domain": null,
    })
}

fn template_id(sandbox: &Sandbox, rec: &E2bRecord) -> String {
    if rec.template_id.is_empty() {
        sandbox.template.clone()
    } else {
        rec.template_id.clone()
    }
}

/// A row of the list, or `GET /sandboxes/{id}` (which also carries the access token).
fn detail(e2b: &E2b, sandbox: &Sandbox, with_token: bool) -> Result<Value> {
    let rec = record::get(&e2b.node.store, &sandbox.id)?.unwrap_or_default();
    Ok(row(e2b, sandbox, &rec, with_token))
}

fn row(e2b: &E2b, sandbox: &Sandbox, rec: &E2bRecord, with_token: bool) -> Value {
    let size = e2b.node.config.sizes.get(&sandbox.size);
    let mut v = json!({
        "templateID": template_id(sandbox, rec),
        "sandboxID": sandbox.id,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339(rec.started_ms / 1000),
        "endAt": rfc3339(sandbox.deadline()),
        "envdVersion": ENVD_VERSION,
        "cpuCount": size.map_or(1, |s| s.cpus),
        "memoryMB": size.map_or(0, |s| s.memory_mib),
        "diskSizeMB": size.map_or(0, |s| s.disk_mib),
        "state": lifecycle::state(sandbox),
        "metadata": rec.metadata,
    });
    if with_token {
        v["envdAccessToken"] = record::access_token(&e2b.secret, &sandbox.id).into();
    }
    v
}

/// `GET /v2/sandboxes?metadata=k%3Dv&state=running,paused&limit=N&nextToken=ID`: the
/// caller's sandboxes in id order, `x-next-token` when more follow.
fn list(e2b: &E2b, tenant: Option<&str>, query: Option<&str>) -> Result<Response<Body>> {
    let known = [
        "metadata",
        "state",
        "limit",
        "nextToken",
        "order",
        "startedAfter",
        "template",
    ];
    let q = Query::parse(query, &known)?;
    let mut wanted = Vec::new();
    for pair in q
        .get("metadata")
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        wanted.push((decode(k)?, decode(v)?));
    }
    let states: Vec<&str> = q
        .get("state")
        .map_or(vec!["running", "paused"], |s| s.split(',').collect());
    let limit = match q.get("limit") {
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=10_000).contains(n))
            .ok_or_else(|| Error::BadRequest(format!("limit {l:?} must be 1..=10000")))?,
        None => 1000,
    };
    let records = record::all(&e2b.node.store)?;
    let mut sandboxes = e2b.node.claims.list(tenant);
    sandboxes.sort_by(|a, b| a.id.cmp(&b.id));
    let after = q.get("nextToken").unwrap_or("");
    let mut rows = Vec::new();
    let mut more = false;
    for s in sandboxes.iter().filter(|s| s.id.as_str() > after) {
        let rec = records.get(&s.id).cloned().unwrap_or_default();
        let matches = wanted.iter().all(|(k, v)| rec.metadata.get(k) == Some(v))
            && states.contains(&lifecycle::state(s));
        if !matches {
            continue;
        }
        if rows.len() == limit {
            more = true;
            break;
        }
        rows.push(row(e2b, s, &rec, false));
    }
    let mut resp = json(StatusCode::OK, &Value::Array(rows.clone()));
    if more {
        let last = rows
            .last()
            .and_then(|r| r["sandboxID"].as_str())
            .unwrap_or_default();
        if let Ok(v) = HeaderValue::from_str(last) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

/// A JSON object body (the native API's rules: at most 1 MiB, timed, an object); an
/// empty body is `{}`. Unknown fields are ignored by the types read here.
async fn read_json<T: serde::de::DeserializeOwned>(e2b: &E2b, req: Request<Incoming>) -> Result<T> {
    crate::api::read_json(&e2b.node, req, true).await
}

/// Unix seconds as RFC 3339 UTC (`1970-01-01T00:00:00Z`), by Howard Hinnant's
/// days-to-civil algorithm: one small function rather than a date crate.
pub(super) fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_083_199), "2026-11-30T23:59:59Z");
    }
}
