//! The HTTP surface: the route table, dispatch, strict JSON bodies (an object, 1 MiB cap,
//! `[http] body_timeout_seconds`, unknown fields rejected), and the one place an [`Error`]
//! becomes a status and a message (host detail for root, an incident id for the others). Handlers, one file
//! per resource: `sandboxes.rs` (claim, list, get, release, renew), `exec.rs` (buffered
//! exec and its streamed body), `agent.rs` (the `Upgrade: silkd` relay), `ports.rs` (the
//! `Upgrade: tcp` port tunnel), `operator.rs` (root-only node routes), `files.rs` (files,
//! fs and archive, streamed both ways; their query strings in `query.rs`). They turn requests into calls on [`Node`], the exec and
//! relay modules; nothing below this layer knows about HTTP statuses.

mod agent;
mod cluster;
mod exec;
pub(crate) mod files;
mod operator;
mod ports;
pub(crate) mod query;
mod sandboxes;
mod snapshots;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::auth::{require_sandbox, Caller};
use crate::claims::Sandbox;
use crate::error::Error;
use crate::node::Node;

/// Every response body.
pub type Body = BoxBody<Bytes, Infallible>;

/// Request bodies larger than this answer 413.
pub const MAX_BODY: usize = 1024 * 1024;

/// Every route of the v1 API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /healthz`
    Healthz,
    /// `GET /metrics`
    Metrics,
    /// `GET /v1/info`
    Info,
    /// `PUT /v1/pools`
    Pools,
    /// `POST /v1/claim`
    Claim,
    /// `GET /v1/sandboxes`
    List,
    /// `GET /v1/sandboxes/{id}`
    Get,
    /// `POST /v1/sandboxes/{id}/release`
    Release,
    /// `POST /v1/sandboxes/{id}/renew`
    Renew,
    /// `POST /v1/sandboxes/{id}/exec`
    Exec,
    /// `GET /v1/sandboxes/{id}/agent`
    Agent,
    /// `PUT /v1/sandboxes/{id}/files`
    FilePut,
    /// `GET /v1/sandboxes/{id}/files`
    FileGet,
    /// `GET /v1/sandboxes/{id}/fs`
    FsGet,
    /// `DELETE /v1/sandboxes/{id}/fs`
    FsDelete,
    /// `POST /v1/sandboxes/{id}/fs/mkdir`
    FsMkdir,
    /// `POST /v1/sandboxes/{id}/fs/rename`
    FsRename,
    /// `GET /v1/sandboxes/{id}/fs/watch`
    FsWatch,
    /// `GET /v1/sandboxes/{id}/archive`
    ArchiveGet,
    /// `PUT /v1/sandboxes/{id}/archive`
    ArchivePut,
    /// `GET /v1/sandboxes/{id}/ports/{port}`
    Port,
    /// `POST /v1/sandboxes/{id}/snapshot`
    Snapshot,
    /// `POST /v1/sandboxes/{id}/hibernate`
    Hibernate,
    /// `POST /v1/sandboxes/{id}/wake`
    Wake,
    /// `GET /v1/snapshots`
    SnapshotList,
    /// `DELETE /v1/snapshots/{id}`
    SnapshotDelete,
    /// `GET /v1/cluster`
    ClusterView,
    /// `POST /v1/node/drain`
    Drain,
}

impl Route {
    /// The whole table; routing and the docs test both read it.
    pub const ALL: [Route; 28] = [
        Route::Healthz,
        Route::Metrics,
        Route::Info,
        Route::Pools,
        Route::Claim,
        Route::List,
        Route::Get,
        Route::Release,
        Route::Renew,
        Route::Exec,
        Route::Agent,
        Route::FilePut,
        Route::FileGet,
        Route::FsGet,
        Route::FsDelete,
        Route::FsMkdir,
        Route::FsRename,
        Route::FsWatch,
        Route::ArchiveGet,
        Route::ArchivePut,
        Route::Port,
        Route::Snapshot,
        Route::Hibernate,
        Route::Wake,
        Route::SnapshotList,
        Route::SnapshotDelete,
        Route::ClusterView,
        Route::Drain,
    ];

    /// Method and path pattern (`{id}` matches one segment).
    pub fn spec(self) -> (Method, &'static str) {
        match self {
            Route::Healthz => (Method::GET, "/healthz"),
            Route::Metrics => (Method::GET, "/metrics"),
            Route::Info => (Method::GET, "/v1/info"),
            Route::Pools => (Method::PUT, "/v1/pools"),
            Route::Claim => (Method::POST, "/v1/claim"),
            Route::List => (Method::GET, "/v1/sandboxes"),
            Route::Get => (Method::GET, "/v1/sandboxes/{id}"),
            Route::Release => (Method::POST, "/v1/sandboxes/{id}/release"),
            Route::Renew => (Method::POST, "/v1/sandboxes/{id}/renew"),
            Route::Exec => (Method::POST, "/v1/sandboxes/{id}/exec"),
            Route::Agent => (Method::GET, "/v1/sandboxes/{id}/agent"),
            Route::FilePut => (Method::PUT, "/v1/sandboxes/{id}/files"),
            Route::FileGet => (Method::GET, "/v1/sandboxes/{id}/files"),
            Route::FsGet => (Method::GET, "/v1/sandboxes/{id}/fs"),
            Route::FsDelete => (Method::DELETE, "/v1/sandboxes/{id}/fs"),
            Route::FsMkdir => (Method::POST, "/v1/sandboxes/{id}/fs/mkdir"),
            Route::FsRename => (Method::POST, "/v1/sandboxes/{id}/fs/rename"),
            Route::FsWatch => (Method::GET, "/v1/sandboxes/{id}/fs/watch"),
            Route::ArchiveGet => (Method::GET, "/v1/sandboxes/{id}/archive"),
            Route::ArchivePut => (Method::PUT, "/v1/sandboxes/{id}/archive"),
            Route::Port => (Method::GET, "/v1/sandboxes/{id}/ports/{port}"),
            Route::Snapshot => (Method::POST, "/v1/sandboxes/{id}/snapshot"),
            Route::Hibernate => (Method::POST, "/v1/sandboxes/{id}/hibernate"),
            Route::Wake => (Method::POST, "/v1/sandboxes/{id}/wake"),
            Route::SnapshotList => (Method::GET, "/v1/snapshots"),
            Route::SnapshotDelete => (Method::DELETE, "/v1/snapshots/{id}"),
            Route::ClusterView => (Method::GET, "/v1/cluster"),
            Route::Drain => (Method::POST, "/v1/node/drain"),
        }
    }

    /// Every status the route can answer with (405 and the unknown-path 404 aside, which
    /// any path can get). `docs/api.md` lists each one under the route's heading; a test
    /// checks it.
    pub fn statuses(self) -> &'static [u16] {
        // 401/403: any authenticated route; 408 and 413: any route that reads a body.
        match self {
            Route::Healthz => &[200],
            Route::Metrics | Route::Info | Route::List => &[200, 401, 403],
            Route::Pools => &[200, 400, 401, 403, 408, 413, 500],
            // 404 and 409: an unknown or foreign snapshot, one of another image.
            Route::Claim => &[200, 400, 401, 403, 404, 408, 409, 413, 429, 500, 502, 503],
            Route::Get => &[200, 401, 403, 404],
            Route::Release => &[204, 401, 403, 404],
            Route::Renew => &[200, 400, 401, 403, 404, 408, 413],
            Route::Exec => &[200, 400, 401, 403, 404, 408, 413, 500, 502, 503, 504],
            Route::Agent => &[101, 401, 403, 404, 426, 429, 502, 503],
            Route::Port => &[101, 400, 401, 403, 404, 426, 429, 502, 503],
            Route::Snapshot => &[
                200, 400, 401, 403, 404, 408, 409, 413, 429, 500, 502, 503, 507,
            ],
            Route::Hibernate => &[204, 401, 403, 404, 409, 500, 502, 507],
            Route::Wake => &[204, 401, 403, 404, 500, 502, 503],
            Route::SnapshotList => &[200, 401, 403, 500],
            Route::SnapshotDelete => &[204, 401, 403, 404, 500],
            // The file routes: 403 also for silkd `permission_denied`, 404 for a missing
            // path, 507 for silkd `no_space`; uploads time out per piece (408).
            Route::FilePut => &[200, 400, 401, 403, 404, 408, 502, 503, 507],
            Route::FileGet => &[200, 206, 400, 401, 403, 404, 416, 502, 503],
            Route::FsGet | Route::ArchiveGet | Route::FsWatch => {
                &[200, 400, 401, 403, 404, 502, 503]
            }
            Route::FsDelete => &[204, 400, 401, 403, 404, 502, 503],
            Route::FsMkdir | Route::FsRename => &[204, 400, 401, 403, 404, 408, 413, 502, 503, 507],
            Route::ArchivePut => &[204, 400, 401, 403, 404, 408, 502, 503, 507],
            Route::ClusterView => &[200, 400, 401, 403],
            Route::Drain => &[200, 400, 401, 403, 408, 413],
        }
    }

    /// Finds the route for a request: 404 for an unknown path, 405 for a known path with
    /// another method. Returns the `{id}` segment when the pattern has one.
    pub fn find(method: &Method, path: &str) -> Result<(Route, Option<String>), Error> {
        let mut path_matched = false;
        for route in Route::ALL {
            let (m, pattern) = route.spec();
            if let Some(id) = match_pattern(pattern, path) {
                if m == method {
                    return Ok((route, id));
                }
                path_matched = true;
            }
        }
        Err(if path_matched {
            Error::MethodNotAllowed
        } else {
            Error::NotFound
        })
    }
}

/// `Some(id)` when `path` matches (`Some(None)` without an `{id}`).
fn match_pattern(pattern: &str, path: &str) -> Option<Option<String>> {
    let mut id = None;
    let mut want = pattern.split('/');
    let mut got = path.split('/');
    loop {
        match (want.next(), got.next()) {
            (None, None) => return Some(id),
            (Some("{id}"), Some(seg)) if !seg.is_empty() => id = Some(seg.to_string()),
            // Parsed (and refused with 400) by the route's handler.
            (Some("{port}"), Some(seg)) if !seg.is_empty() => {}
            (Some(w), Some(g)) if w == g => {}
            _ => return None,
        }
    }
}

/// nginx's "client closed request": counted in metrics and logs, never sent (nobody is
/// left to read it).
const CLIENT_GONE: StatusCode = match StatusCode::from_u16(499) {
    Ok(s) => s,
    Err(_) => panic!("499 is a valid status"),
};

/// The one mapping from an error to an HTTP status.
pub fn status_of(error: &Error) -> StatusCode {
    match error {
        Error::BadRequest(_) | Error::UnknownName { .. } => StatusCode::BAD_REQUEST,
        Error::Unauthorized => StatusCode::UNAUTHORIZED,
        Error::Forbidden => StatusCode::FORBIDDEN,
        Error::NotFound | Error::PathNotFound(_) => StatusCode::NOT_FOUND,
        Error::Lost { .. } => StatusCode::GONE,
        Error::PermissionDenied(_) => StatusCode::FORBIDDEN,
        Error::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
        Error::RangeNotSatisfiable { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
        Error::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        Error::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        Error::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
        Error::BodyTooLarge { .. } | Error::OutputTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        Error::UpgradeRequired(_) => StatusCode::UPGRADE_REQUIRED,
        Error::TooManyClaims(_) | Error::TooManyRelays { .. } | Error::Quota(_) => {
            StatusCode::TOO_MANY_REQUESTS
        }
        Error::Conflict(_) => StatusCode::CONFLICT,
        Error::Busy { .. } | Error::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        Error::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        Error::Guest(_)
        | Error::Wire(_)
        | Error::SandboxFailed { .. }
        | Error::PortUnreachable(_)
        | Error::Peer(_) => StatusCode::BAD_GATEWAY,
        Error::ClientGone(_) => CLIENT_GONE,
        Error::Config(_) | Error::Engine(_) | Error::Store { .. } | Error::Io { .. } => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

/// What a caller other than root is told instead of an error that may carry host detail
/// (paths, a guest's host-side log or console tail, OS errors): a fixed sentence and the
/// incident id the log line carries. `None` when the error's own message is safe to show.
/// Root, and the log, always get the whole message.
pub(crate) fn tenant_message(error: &Error, incident: &str) -> Option<String> {
    let what = match error {
        Error::Config(_) | Error::Engine(_) | Error::Store { .. } | Error::Io { .. } => {
            "internal error".to_string()
        }
        Error::SandboxFailed { id, .. } => format!("sandbox {id} has failed: its guest stopped"),
        Error::Guest(_) | Error::Wire(_) => "the sandbox's guest could not be reached".to_string(),
        Error::Peer(_) => "the node that owns it could not be reached".to_string(),
        _ => return None,
    };
    Some(format!(
        "{what} (incident {incident}; the operator's log has the detail)"
    ))
}

/// `{"error": ...}` with the status from [`status_of`] (and `Retry-After` when busy); for
/// a caller other than root, host detail is replaced by [`tenant_message`]. Server errors
/// are logged with their incident id.
fn error_response(error: &Error, caller: Option<&Caller>) -> Response<Body> {
    let status = status_of(error);
    let incident = if status.is_server_error() {
        let mut raw = [0u8; 6];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut raw);
        hex::encode(raw)
    } else {
        String::new()
    };
    let message = match caller {
        Some(Caller::Root) => None,
        _ => tenant_message(error, &incident),
    };
    if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
        tracing::warn!(%incident, status = status.as_u16(), ?caller, "{error}");
    }
    let mut resp = json(
        status,
        &api::ErrorBody {
            error: message.unwrap_or_else(|| error.to_string()),
        },
    );
    match error {
        Error::Busy { retry_after, .. } => {
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(*retry_after));
        }
        Error::ShuttingDown => {
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("5"));
        }
        _ => {}
    }
    resp
}

/// A JSON response.
fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let bytes = serde_json::to_vec(value).expect("API types always serialize");
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// An empty body.
fn empty() -> Body {
    full(Bytes::new())
}

/// Reads a whole request body (at most [`MAX_BODY`], within `[http]
/// body_timeout_seconds`) and decodes it strictly: a JSON object, nothing else (serde's
/// derives would take an array as a struct's fields in order). An empty body decodes as
/// `{}` when `empty_ok`.
pub(crate) async fn read_json<T: DeserializeOwned>(
    node: &Node,
    req: Request<Incoming>,
    empty_ok: bool,
) -> Result<T, Error> {
    decode_json(&read_body(node, req.into_body(), MAX_BODY).await?, empty_ok)
}

/// Decodes a whole request body strictly (see [`read_json`]).
fn decode_json<T: DeserializeOwned>(bytes: &[u8], empty_ok: bool) -> Result<T, Error> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) && empty_ok {
        b"{}"
    } else {
        bytes
    };
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(Error::BadRequest(
            "the body must be a JSON object (`{...}`)".into(),
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| Error::BadRequest(format!("invalid JSON body: {e}")))
}

/// Reads a whole request body: at most `cap` bytes (413 beyond), within `[http]
/// body_timeout_seconds` (408).
pub(crate) async fn read_body(node: &Node, body: Incoming, cap: usize) -> Result<Bytes, Error> {
    let seconds = node.config.http.body_timeout_seconds;
    let collected = tokio::time::timeout(
        std::time::Duration::from_secs(seconds),
        Limited::new(body, cap).collect(),
    )
    .await
    .map_err(|_| {
        node.metrics.http_body_timeouts.inc();
        Error::BodyTimeout { seconds }
    })?;
    Ok(collected
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                Error::BodyTooLarge { limit: cap }
            } else {
                Error::BadRequest(format!("reading body: {e}"))
            }
        })?
        .to_bytes())
}

/// Resolves a per-sandbox route's target for `caller`: 403 for a caller kind that may not
/// call it, 404 for an unknown id or another sandbox's token.
fn sandbox_for(node: &Node, caller: &Caller, id: &str) -> Result<Arc<Sandbox>, Error> {
    require_sandbox(caller, id)?;
    node.sandbox(id)
}

/// [`sandbox_for`], woken first when it is hibernated (a bounded wait): exec, relay,
/// file and port calls reach a running guest.
async fn awake_for(node: &Node, caller: &Caller, id: &str) -> Result<Arc<Sandbox>, Error> {
    let sandbox = sandbox_for(node, caller, id)?;
    node.wake(&sandbox).await?;
    Ok(sandbox)
}

/// Serves one request; never fails (errors become JSON answers).
pub async fn handle(node: Arc<Node>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let mut caller = None;
    let cluster = node.cluster.get().cloned();
    let mut resp = match dispatch(node, req, &mut caller).await {
        Ok(resp) => resp,
        Err(e) => {
            let _span = tracing::warn_span!("request", %method, %path).entered();
            error_response(&e, caller.as_ref())
        }
    };
    if let Some(cluster) = cluster {
        // Answers from here name this node; forwarded ones already name their owner.
        if !resp
            .headers()
            .contains_key(crate::cluster::forward::NODE_HEADER)
        {
            crate::cluster::forward::name_node(&mut resp, cluster.name());
        }
    }
    tracing::debug!(%method, %path, status = resp.status().as_u16());
    Ok(resp)
}

/// Routes one request; `caller` is set once the bearer is known, so that the error
/// answer can tell root from everyone else.
async fn dispatch(
    node: Arc<Node>,
    req: Request<Incoming>,
    caller_out: &mut Option<Caller>,
) -> Result<Response<Body>, Error> {
    let (route, id) = Route::find(req.method(), req.uri().path())?;
    if route == Route::Healthz {
        return Ok(json(StatusCode::OK, &serde_json::json!({"status": "ok"})));
    }
    // Cluster: a sandbox another node owns is that node's to answer, token check included.
    // A snapshot's id names no sandbox: snapshots stay on the node that took them.
    let req = match &id {
        Some(id) if route != Route::SnapshotDelete => {
            match cluster::forward_for(&node, id, req).await? {
                Ok(req) => req,
                Err(owner_answer) => return Ok(owner_answer),
            }
        }
        _ => req,
    };
    let caller = node.auth.identify(req.headers(), &node.claims)?;
    *caller_out = Some(caller.clone());
    let id = id.unwrap_or_default();
    match route {
        Route::Healthz => unreachable!("answered before authentication"),
        Route::Metrics => operator::metrics(&node, &caller),
        Route::Info => operator::info(&node, &caller),
        Route::Pools => operator::put_pools(&node, &caller, req).await,
        Route::Claim => match node.cluster.get() {
            Some(c) => cluster::claim(&node, c, &caller, req).await,
            None => sandboxes::claim(&node, &caller, req).await,
        },
        Route::List => sandboxes::list(&node, &caller),
        Route::Get => sandboxes::get(&node, &caller, &id),
        Route::Release => match node.cluster.get() {
            Some(c) => cluster::release(&node, c, &caller, &id).await,
            None => sandboxes::release(&node, &caller, &id).await,
        },
        Route::Renew => sandboxes::renew(&node, &caller, &id, req).await,
        Route::Exec => exec::exec(&node, &caller, &id, req).await,
        Route::Agent => agent::agent(&node, &caller, &id, req).await,
        Route::FilePut => files::put_file(&node, &caller, &id, req).await,
        Route::FileGet => files::get_file(&node, &caller, &id, req).await,
        Route::FsGet => files::get_fs(&node, &caller, &id, req).await,
        Route::FsDelete => files::delete_fs(&node, &caller, &id, req).await,
        Route::FsMkdir => files::mkdir(&node, &caller, &id, req).await,
        Route::FsRename => files::rename(&node, &caller, &id, req).await,
        Route::FsWatch => files::watch(&node, &caller, &id, req).await,
        Route::ArchiveGet => files::get_archive(&node, &caller, &id, req).await,
        Route::ArchivePut => files::put_archive(&node, &caller, &id, req).await,
        Route::Port => ports::port(&node, &caller, &id, req).await,
        Route::Snapshot => snapshots::snapshot(&node, &caller, &id, req).await,
        Route::Hibernate => snapshots::hibernate(&node, &caller, &id).await,
        Route::Wake => snapshots::wake(&node, &caller, &id).await,
        Route::SnapshotList => snapshots::list(&node, &caller),
        Route::SnapshotDelete => snapshots::delete(&node, &caller, &id),
        Route::ClusterView => cluster::view(&node, &caller),
        Route::Drain => cluster::drain(&node, &caller, req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing() {
        let (r, id) = Route::find(&Method::POST, "/v1/sandboxes/sb-1/exec").unwrap();
        assert_eq!((r, id.as_deref()), (Route::Exec, Some("sb-1")));
        assert_eq!(
            Route::find(&Method::GET, "/v1/sandboxes").unwrap().0,
            Route::List
        );
        assert!(matches!(
            Route::find(&Method::DELETE, "/v1/claim"),
            Err(Error::MethodNotAllowed)
        ));
        assert!(matches!(
            Route::find(&Method::GET, "/v1/sandboxes//exec"),
            Err(Error::NotFound)
        ));
        assert!(matches!(
            Route::find(&Method::GET, "/v2/info"),
            Err(Error::NotFound)
        ));
    }

    #[test]
    fn every_route_and_status_is_documented() {
        let doc = include_str!("../../../docs/api.md");
        for route in Route::ALL {
            let (method, pattern) = route.spec();
            let heading = format!("### `{method} {pattern}`");
            let start = doc
                .find(&heading)
                .unwrap_or_else(|| panic!("docs/api.md lacks {heading}"));
            let rest = &doc[start + heading.len()..];
            let end = ["\n### ", "\n## "]
                .iter()
                .filter_map(|h| rest.find(h))
                .min()
                .unwrap_or(rest.len());
            let section = &rest[..end];
            for status in route.statuses() {
                assert!(
                    section.contains(&status.to_string()),
                    "docs/api.md: {heading} does not mention status {status}"
                );
            }
        }
    }

    #[test]
    fn statuses() {
        assert_eq!(status_of(&Error::Timeout { seconds: 1.0 }), 504);
        assert_eq!(status_of(&Error::OutputTooLarge { limit: 1 }), 413);
        let busy = Error::Busy {
            reason: "x".into(),
            retry_after: 2,
        };
        let resp = error_response(&busy, None);
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()[RETRY_AFTER], "2");
        assert_eq!(status_of(&Error::BodyTimeout { seconds: 1 }), 408);
        assert_eq!(status_of(&Error::TooManyRelays { max: 1 }), 429);
    }

    async fn body_text(resp: Response<Body>) -> String {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice::<api::ErrorBody>(&bytes)
            .unwrap()
            .error
    }

    #[tokio::test]
    async fn only_root_sees_host_detail() {
        let host_detail = [
            Error::Engine("bwrap exited; log: [/var/lib/sandboxd/sandboxes/x/log]".into()),
            Error::Io {
                context: "spill file in /var/lib/sandboxd/spill".into(),
                source: std::io::Error::from_raw_os_error(28),
            },
            Error::Config("reading /etc/sandboxd.toml".into()),
            Error::SandboxFailed {
                id: "sb-1".into(),
                why: "QEMU exited; console: /var/lib/sandboxd/qemu/run/x".into(),
            },
            Error::Guest("connecting /var/lib/sandboxd/sandboxes/x/sock: refused".into()),
        ];
        for e in &host_detail {
            for caller in [
                None,
                Some(Caller::Tenant("a".into())),
                Some(Caller::Sandbox("sb-1".into())),
            ] {
                let shown = body_text(error_response(e, caller.as_ref())).await;
                assert!(!shown.contains('/'), "{caller:?} saw {shown:?} for {e}");
                assert!(shown.contains("incident "), "{shown}");
            }
            let root = body_text(error_response(e, Some(&Caller::Root))).await;
            assert_eq!(root, e.to_string());
        }
        let failed = body_text(error_response(&host_detail[3], None)).await;
        assert!(failed.starts_with("sandbox sb-1 has failed"), "{failed}");
        // Errors about the caller's own request keep their message.
        let bad = Error::BadRequest("env key must not contain '='".into());
        let shown = body_text(error_response(&bad, Some(&Caller::Tenant("a".into())))).await;
        assert_eq!(shown, bad.to_string());
    }
}
