//! The SDK's one error type. HTTP statuses become variants in [`Error::from_response`] and
//! silkd's error kinds in [`Error::from_guest`]; nothing else maps outcomes to errors.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{HeaderMap, RETRY_AFTER};
use hyper::StatusCode;

/// `Result` with the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a call can fail with. Match on the variant; the strings are for humans.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// 401: the token is missing or unknown to the node.
    #[error("unauthorized: missing or unknown token")]
    Unauthorized,
    /// 403: the token is valid but may not call this route (a tenant on a root-only route),
    /// or the sandbox's user may not touch that path (silkd `permission_denied`).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// 404: no such sandbox (or not yours: a wrong sandbox token answers like an unknown id),
    /// or silkd does not know the pid.
    #[error("not found")]
    NotFound,
    /// 429: the node or the tenant already holds its `max_claims` sandboxes.
    #[error("limit reached: {0}")]
    LimitReached(String),
    /// 503: the node has too many buffered execs in flight, or the guest could not spawn
    /// (out of processes, memory or files). Retryable; `retry_after` is the server's hint.
    #[error("busy{}", .retry_after.map(|d| format!(", retry after {}s", d.as_secs())).unwrap_or_default())]
    Busy {
        /// The `Retry-After` the server sent, when it sent one.
        retry_after: Option<Duration>,
    },
    /// 507 (or silkd `no_space`): the sandbox's disk is full; nothing was written.
    #[error("no space: {0}")]
    NoSpace(String),
    /// 413: the command wrote more than the node's per-exec output cap; it was killed.
    #[error("output too large: the command wrote more than the node's output cap")]
    OutputTooLarge,
    /// 504 or a spawned command's own timeout: the command ran out of time and was killed.
    #[error("timed out: the command was killed")]
    Timeout,
    /// 400 (or silkd `bad_request`): the request was wrong, e.g. unknown template, empty
    /// argv, a command or cwd that does not exist.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// 502 (or silkd `internal` / `unimplemented`): the guest failed or is unreachable.
    #[error("guest failure: {0}")]
    Guest(String),
    /// The server answered a status outside the API contract.
    #[error("unexpected HTTP {status}: {message}")]
    Unexpected {
        /// The HTTP status code.
        status: u16,
        /// The server's `error` message, or the body's start.
        message: String,
    },
    /// The server or the guest sent something that does not parse as the protocol says.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// Connecting, sending or receiving failed (daemon down, connection reset).
    #[error("transport: {0}")]
    Transport(TransportError),
    /// A local file or directory of a transfer could not be read or written (the files
    /// API: `upload_dir`, `download_dir`, `read_to`, `write_from`).
    #[error("local: {0}")]
    Local(String),
    /// The URL given to [`Client::new`](crate::Client::new) is not one the SDK can dial.
    #[error("invalid url {0}")]
    InvalidUrl(String),
}

/// The cause of an [`Error::Transport`]: displays its whole source chain on one line.
#[derive(Debug, Clone)]
pub struct TransportError(Arc<dyn StdError + Send + Sync + 'static>);

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl TransportError {
    /// Wraps an already boxed cause (what http-body-util's `Limited` gives).
    pub(crate) fn from_boxed(e: Box<dyn StdError + Send + Sync + 'static>) -> Self {
        TransportError(Arc::from(e))
    }
}

impl StdError for TransportError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.0)
    }
}

impl Error {
    /// Wraps an I/O, hyper or codec failure.
    pub(crate) fn transport(e: impl StdError + Send + Sync + 'static) -> Error {
        Error::Transport(TransportError(Arc::new(e)))
    }

    /// The one place an HTTP status (other than the expected success) becomes an error.
    pub(crate) fn from_response(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Error {
        let message = error_message(body);
        match status {
            StatusCode::BAD_REQUEST => Error::BadRequest(message),
            StatusCode::UNAUTHORIZED => Error::Unauthorized,
            StatusCode::FORBIDDEN => Error::Forbidden(message),
            StatusCode::NOT_FOUND => Error::NotFound,
            StatusCode::PAYLOAD_TOO_LARGE => Error::OutputTooLarge,
            StatusCode::TOO_MANY_REQUESTS => Error::LimitReached(message),
            StatusCode::BAD_GATEWAY => Error::Guest(message),
            StatusCode::SERVICE_UNAVAILABLE => Error::Busy {
                retry_after: retry_after(headers),
            },
            StatusCode::GATEWAY_TIMEOUT => Error::Timeout,
            StatusCode::INSUFFICIENT_STORAGE => Error::NoSpace(message),
            _ => Error::Unexpected {
                status: status.as_u16(),
                message,
            },
        }
    }

    /// The one place a silkd `Error{kind, message}` frame becomes an error.
    pub(crate) fn from_guest(kind: wire::ErrorKind, message: String) -> Error {
        match kind {
            wire::ErrorKind::BadRequest => Error::BadRequest(message),
            wire::ErrorKind::NotFound => Error::NotFound,
            wire::ErrorKind::PermissionDenied => Error::Forbidden(message),
            wire::ErrorKind::NoSpace => Error::NoSpace(message),
            wire::ErrorKind::ResourceExhausted => Error::Busy { retry_after: None },
            wire::ErrorKind::Unimplemented | wire::ErrorKind::Internal => {
                Error::Guest(format!("{}: {message}", kind.as_str()))
            }
        }
    }
}

/// The `error` field of an `{"error": "..."}` body, or the body's start when it is not one.
fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<api::ErrorBody>(body) {
        Ok(b) => b.error,
        Err(_) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
            text.trim().to_string()
        }
    }
}

/// `Retry-After` in its delay-seconds form (the only form sandboxd sends).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, body: &str) -> Error {
        Error::from_response(
            StatusCode::from_u16(code).unwrap(),
            &HeaderMap::new(),
            body.as_bytes(),
        )
    }

    #[test]
    fn statuses_map_to_variants() {
        assert!(matches!(status(400, r#"{"error":"unknown template x"}"#),
            Error::BadRequest(m) if m == "unknown template x"));
        assert!(matches!(status(401, "{}"), Error::Unauthorized));
        assert!(
            matches!(status(403, r#"{"error":"root only"}"#), Error::Forbidden(m) if m == "root only")
        );
        assert!(matches!(status(404, ""), Error::NotFound));
        assert!(matches!(status(413, ""), Error::OutputTooLarge));
        assert!(
            matches!(status(429, r#"{"error":"max_claims 2"}"#), Error::LimitReached(m) if m == "max_claims 2")
        );
        assert!(
            matches!(status(502, r#"{"error":"guest gone"}"#), Error::Guest(m) if m == "guest gone")
        );
        assert!(matches!(status(503, ""), Error::Busy { retry_after: None }));
        assert!(matches!(status(504, ""), Error::Timeout));
        assert!(matches!(status(507, r#"{"error":"full"}"#), Error::NoSpace(m) if m == "full"));
        assert!(
            matches!(status(500, "boom"), Error::Unexpected { status: 500, message } if message == "boom")
        );
    }

    #[test]
    fn busy_carries_retry_after() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "3".parse().unwrap());
        let e = Error::from_response(StatusCode::SERVICE_UNAVAILABLE, &headers, b"");
        assert!(matches!(e, Error::Busy { retry_after: Some(d) } if d == Duration::from_secs(3)));
        assert_eq!(e.to_string(), "busy, retry after 3s");
    }

    #[test]
    fn guest_kinds_map_to_variants() {
        use wire::ErrorKind::*;
        assert!(
            matches!(Error::from_guest(BadRequest, "no such file: /x".into()),
            Error::BadRequest(m) if m == "no such file: /x")
        );
        assert!(matches!(
            Error::from_guest(NotFound, String::new()),
            Error::NotFound
        ));
        assert!(matches!(
            Error::from_guest(ResourceExhausted, String::new()),
            Error::Busy { retry_after: None }
        ));
        assert!(matches!(Error::from_guest(Internal, "fork: EIO".into()),
            Error::Guest(m) if m == "internal: fork: EIO"));
    }

    #[test]
    fn transport_displays_its_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error")]
        struct Outer(#[source] std::io::Error);
        let e = Error::transport(Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        )));
        assert_eq!(e.to_string(), "transport: client error: connection refused");
    }
}
