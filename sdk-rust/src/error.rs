//! The SDK's one error type. HTTP statuses become variants in [`Error::from_response`] and
//! silkd's error kinds in [`Error::from_guest`]; nothing else maps outcomes to errors
//! (except [`Output::check`], defined here beside the error it makes, on request).

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{HeaderMap, RETRY_AFTER};
use hyper::StatusCode;

use crate::outcome::Output;

/// `Result` with the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a call can fail with. Match on the variant; the strings are for humans.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// 401: the token is missing or unknown to the node.
    #[error("unauthorized: missing or unknown token for {route}")]
    Unauthorized {
        /// The route that refused it (`/v1/claim`, `/v1/sandboxes/sb-1/exec`).
        route: String,
    },
    /// 403: the token is valid but may not call this route (a tenant on a root-only route),
    /// or the sandbox's user may not touch that path (silkd `permission_denied`).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// 404: no such sandbox (released, expired, or not yours: a wrong sandbox token answers
    /// like an unknown id), no such path, or silkd does not know the pid.
    #[error("{what}")]
    NotFound {
        /// What is missing, for humans: `sandbox sb-1 not found (released or expired)`,
        /// `not found: ` and the guest's words (a path, a pid).
        what: String,
    },
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
    #[error("output too large: the command wrote more than the node's output cap and was killed")]
    OutputTooLarge {
        /// Its first bytes (the cap's worth, stdout and stderr together) and `SIGKILL`,
        /// when the node sent them (a buffered exec does).
        partial: Option<Box<Output>>,
    },
    /// 504 or a spawned command's own timeout: the command ran out of time and was killed.
    #[error("timed out: the command was killed")]
    Timeout {
        /// What it wrote until then, when known: a buffered exec's 504 carries it, and
        /// [`Sandbox::exec_lines`](crate::Sandbox::exec_lines) keeps what it saw.
        partial: Option<Box<Output>>,
    },
    /// [`Output::check`] on a command that did not exit with code 0.
    #[error("command failed with {}{}", .0.exit, stderr_tail(&.0.stderr))]
    Failed(Box<Output>),
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

    /// The output a command cut short had written: a [`Timeout`](Error::Timeout) or
    /// [`OutputTooLarge`](Error::OutputTooLarge) that carries it, or a
    /// [`Failed`](Error::Failed) command's.
    pub fn partial_output(&self) -> Option<&Output> {
        match self {
            Error::Timeout { partial } | Error::OutputTooLarge { partial } => partial.as_deref(),
            Error::Failed(output) => Some(output),
            _ => None,
        }
    }

    /// The one place an HTTP status (other than the expected success) becomes an error;
    /// `path` is the request's, named by the errors that would otherwise say nothing.
    pub(crate) fn from_response(
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        path: &str,
    ) -> Error {
        let message = error_message(body);
        match status {
            StatusCode::BAD_REQUEST => Error::BadRequest(message),
            StatusCode::UNAUTHORIZED => Error::Unauthorized {
                route: path.to_string(),
            },
            StatusCode::FORBIDDEN => Error::Forbidden(message),
            StatusCode::NOT_FOUND => Error::NotFound {
                what: not_found(&message, path),
            },
            StatusCode::PAYLOAD_TOO_LARGE => Error::OutputTooLarge {
                partial: partial(body),
            },
            StatusCode::TOO_MANY_REQUESTS => Error::LimitReached(message),
            StatusCode::BAD_GATEWAY => Error::Guest(message),
            StatusCode::SERVICE_UNAVAILABLE => Error::Busy {
                retry_after: retry_after(headers),
            },
            StatusCode::GATEWAY_TIMEOUT => Error::Timeout {
                partial: partial(body),
            },
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
            wire::ErrorKind::NotFound => Error::NotFound {
                what: format!("not found: {message}"),
            },
            wire::ErrorKind::PermissionDenied => Error::Forbidden(message),
            wire::ErrorKind::NoSpace => Error::NoSpace(message),
            wire::ErrorKind::ResourceExhausted => Error::Busy { retry_after: None },
            wire::ErrorKind::Unimplemented | wire::ErrorKind::Internal => {
                Error::Guest(format!("{}: {message}", kind.as_str()))
            }
        }
    }
}

impl Output {
    /// `Ok(self)` when the command exited with code 0, else [`Error::Failed`] carrying
    /// this output (its stderr's last line shows in the message). Exec itself never does
    /// this: a non-zero exit is an answer, not an error, until a caller says so.
    ///
    /// ```no_run
    /// # async fn run(sandbox: sandbox_sdk::Sandbox) -> Result<(), sandbox_sdk::Error> {
    /// use sandbox_sdk::Command;
    /// let out = sandbox.exec(&Command::shell("make test")).await?.check()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn check(self) -> Result<Output> {
        if self.success() {
            Ok(self)
        } else {
            Err(Error::Failed(Box::new(self)))
        }
    }
}

/// `: <the last non-empty line of stderr>` (at most 200 bytes of it), or nothing.
fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) else {
        return String::new();
    };
    let mut end = last.len().min(200);
    while !last.is_char_boundary(end) {
        end -= 1;
    }
    format!(": {}", &last[..end])
}

/// What a 404 says is missing: the server's own words when it has some (a file route's
/// path), else the sandbox its path names, else the path.
fn not_found(message: &str, path: &str) -> String {
    if !message.is_empty() && message != "not found" {
        return format!("not found: {message}");
    }
    match path.strip_prefix("/v1/sandboxes/") {
        Some(rest) if !rest.is_empty() => {
            let id = rest.split('/').next().unwrap_or(rest);
            format!("sandbox {id} not found (released or expired)")
        }
        _ => format!("{path} not found"),
    }
}

/// The output a 504 or 413 exec answer carries (`timed_out` / `truncated`); `None` for
/// other bodies (an oversized request's 413, a proxy's 504).
fn partial(body: &[u8]) -> Option<Box<Output>> {
    let answer: api::ExecResponse = serde_json::from_slice(body).ok()?;
    if !(answer.timed_out || answer.truncated) {
        return None;
    }
    Output::from_answer(answer).ok().map(Box::new)
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
            "/v1/sandboxes/sb-7/exec",
        )
    }

    #[test]
    fn statuses_map_to_variants() {
        assert!(matches!(status(400, r#"{"error":"unknown template x"}"#),
            Error::BadRequest(m) if m == "unknown template x"));
        assert!(
            matches!(status(401, "{}"), Error::Unauthorized { route } if route == "/v1/sandboxes/sb-7/exec")
        );
        assert!(
            matches!(status(403, r#"{"error":"root only"}"#), Error::Forbidden(m) if m == "root only")
        );
        assert_eq!(
            status(404, r#"{"error":"not found"}"#).to_string(),
            "sandbox sb-7 not found (released or expired)"
        );
        assert!(
            matches!(status(404, r#"{"error":"no such file: /x"}"#), Error::NotFound { what } if what == "not found: no such file: /x")
        );
        assert!(matches!(
            status(413, ""),
            Error::OutputTooLarge { partial: None }
        ));
        assert!(
            matches!(status(429, r#"{"error":"max_claims 2"}"#), Error::LimitReached(m) if m == "max_claims 2")
        );
        assert!(
            matches!(status(502, r#"{"error":"guest gone"}"#), Error::Guest(m) if m == "guest gone")
        );
        assert!(matches!(status(503, ""), Error::Busy { retry_after: None }));
        assert!(matches!(status(504, ""), Error::Timeout { partial: None }));
        assert!(matches!(status(507, r#"{"error":"full"}"#), Error::NoSpace(m) if m == "full"));
        assert!(
            matches!(status(500, "boom"), Error::Unexpected { status: 500, message } if message == "boom")
        );
    }

    #[test]
    fn busy_carries_retry_after() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "3".parse().unwrap());
        let e = Error::from_response(StatusCode::SERVICE_UNAVAILABLE, &headers, b"", "/");
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
            Error::from_guest(NotFound, "no command with pid 5".into()),
            Error::NotFound { what } if what == "not found: no command with pid 5"
        ));
        assert!(matches!(
            Error::from_guest(ResourceExhausted, String::new()),
            Error::Busy { retry_after: None }
        ));
        assert!(matches!(Error::from_guest(Internal, "fork: EIO".into()),
            Error::Guest(m) if m == "internal: fork: EIO"));
    }

    #[test]
    fn cut_answers_carry_their_output() {
        let e = status(
            504,
            r#"{"error":"timed out","timed_out":true,"exit_code":null,"signal":9,"stdout":"tick\n","stderr_b64":"/w=="}"#,
        );
        let out = e.partial_output().expect("partial output");
        assert_eq!(out.stdout, b"tick\n");
        assert_eq!(out.stderr, [0xff]);
        assert_eq!(out.exit, crate::outcome::ExitStatus::Signal(9));
        let e = status(
            413,
            r#"{"error":"cap","truncated":true,"exit_code":null,"stdout":"ab"}"#,
        );
        assert!(matches!(&e, Error::OutputTooLarge { partial: Some(p) } if p.stdout == b"ab"));
        // A hostile or broken body that claims a cut but does not decode carries none,
        // and the status still maps.
        assert!(matches!(
            status(
                504,
                r#"{"timed_out":true,"exit_code":null,"stdout_b64":"!!"}"#
            ),
            Error::Timeout { partial: None }
        ));
        assert!(matches!(
            status(
                504,
                r#"{"timed_out":true,"stdout":"a","stdout_b64":"YQ=="}"#
            ),
            Error::Timeout { partial: None }
        ));
        // A 413 for an oversized request carries no output.
        assert!(status(413, r#"{"error":"body over 1 MiB"}"#)
            .partial_output()
            .is_none());
    }

    #[test]
    fn check_turns_a_failure_into_an_error() {
        use crate::outcome::ExitStatus;
        let ok = Output {
            exit: ExitStatus::Code(0),
            stdout: b"fine".to_vec(),
            stderr: Vec::new(),
        };
        assert_eq!(ok.clone().check().unwrap(), ok);
        let failed = Output {
            exit: ExitStatus::Code(2),
            stdout: Vec::new(),
            stderr: b"compiling\nerror: no rule to make target\n\n".to_vec(),
        };
        let e = failed.clone().check().unwrap_err();
        assert_eq!(
            e.to_string(),
            "command failed with exit code 2: error: no rule to make target"
        );
        assert_eq!(e.partial_output(), Some(&failed));
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
