//! The E2B-compatible surface (DESIGN §14): one optional listener (`[e2b] listen`)
//! speaking what the official E2B SDKs speak, translated onto what the node already does.
//! No logic of its own that the native API lacks; `docs/e2b.md` lists what works.
//!
//! # Layout
//! - this file: the listener, the split between REST and agent ("envd") requests, auth,
//!   and the one place an [`Error`] becomes an E2B answer (REST `{"code","message"}`,
//!   Connect `{"code": "not_found", ...}`).
//! - `rest.rs`: sandbox lifecycle (`/sandboxes`, `/v2/sandboxes`), onto claims and TTLs.
//! - `lifecycle.rs`: pause and resume, the one place that calls hibernate and wake.
//! - `record.rs`: what is kept with a claim (metadata, env vars) and the access tokens.
//! - `envelope.rs`: the Connect envelope codec (pure).
//! - `connect.rs`: Connect unary and server-stream plumbing over hyper.
//! - `process.rs`: `process.Process` onto silkd exec/attach/kill/ps.
//! - `filesystem.rs`: `filesystem.Filesystem` onto silkd's file verbs and watch.
//! - `files.rs`: the agent's plain `/files` upload and download, `/health`.
//!
//! Why a listener of its own and not routes on the native one: the SDK's REST paths
//! (`/sandboxes`) and the agent's (`/files`) would shadow or confuse native routes, and
//! an operator may want the E2B surface on another address or not at all.

mod connect;
mod envelope;
mod files;
mod filesystem;
mod lifecycle;
mod process;
pub mod record;
mod rest;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{full, status_of, tenant_message, Body};
use crate::auth::Caller;
use crate::claims::Sandbox;
use crate::config::E2bConfig;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::serve::{Connections, Handler};

/// The agent version advertised as `envdVersion`: the SDK gates features on it, and
/// 0.5.7 is the highest whose features are all implemented here (server-side default
/// user, stdin switch, close_stdin, octet-stream uploads); 0.6.2's file metadata
/// headers are not.
pub const ENVD_VERSION: &str = "0.5.7";
/// The port the SDK names in `E2b-Sandbox-Port` (the agent's, in E2B's cloud).
const ENVD_PORT: &str = "49983";

/// The E2B surface's shared state.
pub struct E2b {
    node: Arc<Node>,
    config: E2bConfig,
    secret: [u8; 32],
    watchers: filesystem::Watchers,
    /// Commands started under a terminal, by sandbox and pid: `Connect` to one sends its
    /// output as `pty` data, as E2B's agent does. In memory only (after a restart such a
    /// command's output comes as `stdout`).
    ptys: std::sync::Mutex<std::collections::HashSet<(String, u32)>>,
}

/// The running listener; [`Listening::stop`] ends it.
pub struct Listening {
    stop: CancellationToken,
    task: JoinHandle<()>,
    /// Where it listens.
    pub addr: std::net::SocketAddr,
}

impl Listening {
    /// Stops accepting and closes open connections.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Binds `[e2b] listen` and serves it until [`Listening::stop`].
pub async fn start(node: Arc<Node>, config: &E2bConfig) -> Result<Listening> {
    let addr = config.listen_addr()?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("binding [e2b] listen {addr}")))?;
    let addr = listener
        .local_addr()
        .map_err(Error::io("[e2b] listener address"))?;
    let e2b = Arc::new(E2b {
        secret: record::secret(&node.store)?,
        config: config.clone(),
        watchers: filesystem::Watchers::default(),
        ptys: Default::default(),
        node,
    });
    let stop = CancellationToken::new();
    let task = tokio::spawn(accept_loop(e2b, listener, stop.clone()));
    tracing::info!(%addr, "e2b surface serving");
    Ok(Listening { stop, task, addr })
}

async fn accept_loop(e2b: Arc<E2b>, listener: TcpListener, stop: CancellationToken) {
    // The native listener's limits (cap, head, idle and write timeouts), with slots of
    // its own so that neither surface can starve the other.
    let slots = Connections::new(&e2b.node.config.http, e2b.node.metrics.clone());
    let handler: Handler = Arc::new(move |req| Box::pin(handle(e2b.clone(), req)));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (io, _) = tokio::select! {
            () = stop.cancelled() => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("e2b accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = io.set_nodelay(true);
        conns.spawn(slots.serve_with(handler.clone(), Box::new(io)));
        while conns.try_join_next().is_some() {}
    }
    conns.shutdown().await;
}

/// Which side of E2B a request is for.
fn is_agent_path(path: &str) -> bool {
    path.starts_with("/process.Process/")
        || path.starts_with("/filesystem.Filesystem/")
        || path == "/files"
        || path == "/health"
}

async fn handle(e2b: Arc<E2b>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let resp = if is_agent_path(&path) {
        agent(&e2b, req).await
    } else {
        let mut caller = None;
        match rest::dispatch(&e2b, req, &mut caller).await {
            Ok(r) => r,
            Err(e) => rest_error(&e, caller.as_ref()),
        }
    };
    tracing::debug!(%method, %path, status = resp.status().as_u16(), "e2b");
    resp
}

async fn agent(e2b: &E2b, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path == "/health" && !req.headers().contains_key("e2b-sandbox-id") {
        return status_only(StatusCode::NO_CONTENT); // the listener's own liveness
    }
    if path == "/health" {
        // As E2B's proxy answers for a sandbox that is gone: 502 (`is_running` → False).
        return match agent_sandbox(e2b, req.headers()) {
            Ok(s) if !s.is_hibernated() => status_only(StatusCode::NO_CONTENT),
            // A paused sandbox is not running, and a health probe must not wake it.
            Ok(_) | Err(Error::NotFound) => json(
                StatusCode::BAD_GATEWAY,
                &serde_json::json!({"code": 502, "message": "the sandbox is not running"}),
            ),
            Err(e) => rest_error(&e, None),
        };
    }
    let woken = match agent_sandbox(e2b, req.headers()) {
        Ok(s) => e2b.node.wake(&s).await.map(|()| s),
        Err(e) => Err(e),
    };
    let sandbox = match woken {
        Ok(s) => s,
        Err(e) if path == "/files" => return rest_error(&e, None),
        Err(e) => return connect::error_response(&e, connect::is_stream(req.headers())),
    };
    if path == "/files" {
        return match files::files(e2b, &sandbox, req).await {
            Ok(r) => r,
            Err(e) => rest_error(&e, None),
        };
    }
    let (service, method) = path[1..].split_once('/').unwrap_or(("", ""));
    match service {
        "process.Process" => process::call(e2b, sandbox, method, req).await,
        _ => filesystem::call(e2b, sandbox, method, req).await,
    }
}

/// The sandbox an agent request is for: `E2b-Sandbox-Id` names it, and `X-Access-Token`
/// must be its access token (or its native sandbox token). 401 without a valid token,
/// 404 for an unknown id; both before anything else is read.
fn agent_sandbox(e2b: &E2b, headers: &HeaderMap) -> Result<Arc<Sandbox>> {
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let id = header("e2b-sandbox-id")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Error::BadRequest("the E2b-Sandbox-Id header is missing".into()))?;
    if let Some(port) = header("e2b-sandbox-port") {
        if port != ENVD_PORT {
            return Err(Error::Unsupported(format!(
                "port {port}: only the agent's port ({ENVD_PORT}) is served here"
            )));
        }
    }
    let token = header("x-access-token").ok_or(Error::Unauthorized)?;
    let own = record::token_matches(&e2b.secret, id, token)
        || e2b.node.claims.id_for_token(token).as_deref() == Some(id);
    if !own {
        return Err(Error::Unauthorized);
    }
    e2b.node.sandbox(id)
}

/// Who an agent call runs as: the SDK's `user=` arrives as `Authorization: Basic
/// base64("<user>:")`; without it, the template's user (the agent version we advertise
/// lets the server decide).
type User = Option<String>;

fn basic_user(headers: &HeaderMap) -> Result<User> {
    use base64::Engine as _;
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = || Error::BadRequest("Authorization must be Basic base64(\"<user>:\")".into());
    let text = value.to_str().map_err(|_| bad())?;
    let (scheme, b64) = text.split_once(' ').ok_or_else(bad)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(bad());
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| bad())?;
    let pair = String::from_utf8(raw).map_err(|_| bad())?;
    let user = pair.split_once(':').map_or(pair.as_str(), |(u, _)| u);
    match user {
        "" => Ok(None),
        u if u.len() <= 64 => Ok(Some(u.to_string())),
        _ => Err(bad()),
    }
}

/// Who `X-API-KEY` is (the native tokens: root or a tenant's).
fn rest_caller(e2b: &E2b, headers: &HeaderMap) -> Result<Caller> {
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .ok_or(Error::Unauthorized)?;
    let mut as_bearer = HeaderMap::new();
    let value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| Error::Unauthorized)?;
    as_bearer.insert(AUTHORIZATION, value);
    e2b.node.auth.identify(&as_bearer, &e2b.node.claims)
}

/// `{"code": <status>, "message"}`, the body every E2B REST error has (the SDK's
/// generated client fails to decode anything else), with `Retry-After` when busy.
fn rest_error(error: &Error, caller: Option<&Caller>) -> Response<Body> {
    let status = status_of(error);
    let incident = format!("e2b-{:08x}", rand::random::<u32>());
    let message = match caller {
        Some(Caller::Root) => None,
        _ => tenant_message(error, &incident),
    }
    .unwrap_or_else(|| error.to_string());
    let expected = [StatusCode::SERVICE_UNAVAILABLE, StatusCode::NOT_IMPLEMENTED];
    if status.is_server_error() && !expected.contains(&status) {
        tracing::warn!(%incident, status = status.as_u16(), "e2b: {error}");
    }
    let mut resp = json(
        status,
        &serde_json::json!({"code": status.as_u16(), "message": message}),
    );
    let retry = match error {
        Error::Busy { retry_after, .. } => Some(*retry_after),
        Error::ShuttingDown => Some(5),
        _ => None,
    };
    if let Some(s) = retry {
        resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
    }
    resp
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from(value.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn status_only(status: StatusCode) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = status;
    resp
}
