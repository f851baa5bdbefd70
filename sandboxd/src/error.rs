//! The crate's one error enum. Each variant names an outcome a caller can act on; the
//! single mapping to an HTTP status lives in `api::status_of`, nowhere else.

use std::io;

/// Everything sandboxd can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file is unreadable or invalid.
    #[error("config: {0}")]
    Config(String),
    /// No bearer token, or one nobody issued.
    #[error("missing or unknown token")]
    Unauthorized,
    /// A valid token that may not call this route.
    #[error("this token may not call this route")]
    Forbidden,
    /// Unknown route, unknown sandbox, or a sandbox token that is not this sandbox's.
    #[error("not found")]
    NotFound,
    /// A feature this node does not have (yet); the message says which and why.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// The route exists but not with this method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The caller's request is malformed or names something unknown.
    #[error("{0}")]
    BadRequest(String),
    /// A template or size name the config does not define.
    #[error("unknown {kind} {name:?}")]
    UnknownName {
        /// `template` or `size`.
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// The request body did not arrive whole within `[http] body_timeout_seconds`.
    #[error("the request body was not complete within {seconds} s")]
    BodyTimeout {
        /// The timeout.
        seconds: u64,
    },
    /// The request body is over the 1 MiB cap.
    #[error("request body over {limit} bytes")]
    BodyTooLarge {
        /// The cap.
        limit: usize,
    },
    /// A buffered exec produced more output than allowed; the command was killed.
    #[error("output exceeded max_output_bytes ({limit} bytes); the command was killed")]
    OutputTooLarge {
        /// The cap.
        limit: u64,
    },
    /// The relay or a port tunnel was asked for without its `Upgrade` protocol.
    #[error("this route needs `Upgrade: {0}`")]
    UpgradeRequired(&'static str),
    /// Node or tenant `max_claims` reached.
    #[error("{0}")]
    TooManyClaims(String),
    /// `[http] max_relays_per_sandbox` relays are open to this sandbox already.
    #[error(
        "{max} relays are open to this sandbox ([http] max_relays_per_sandbox); close one first"
    )]
    TooManyRelays {
        /// The cap.
        max: u32,
    },
    /// Temporarily out of capacity; retry after the given number of seconds.
    #[error("{reason}")]
    Busy {
        /// What is exhausted.
        reason: String,
        /// Seconds for `Retry-After`.
        retry_after: u32,
    },
    /// A buffered exec ran past its `timeout_seconds`; the command was killed.
    #[error("command timed out after {seconds} s; it was killed")]
    Timeout {
        /// The timeout that expired.
        seconds: f64,
    },
    /// The guest could not be reached, or answered something it should not have.
    #[error("guest: {0}")]
    Guest(String),
    /// The sandbox's guest died on its own; `why` is the engine's account (exit status,
    /// console or log tail: host detail that only root and the log see).
    #[error("sandbox {id} has failed: {why}")]
    SandboxFailed {
        /// The sandbox.
        id: String,
        /// What its engine recorded.
        why: String,
    },
    /// Cluster: the sandbox's owner left the cluster (its lease expired) with it.
    #[error("sandbox {id} was lost with its node {node:?} (the node left the cluster)")]
    Lost {
        /// The sandbox.
        id: String,
        /// Its owner.
        node: String,
    },
    /// Cluster: the node a request was forwarded to could not be reached.
    #[error("cluster peer: {0}")]
    Peer(String),
    /// The HTTP client hung up or stopped reading; nobody is left to answer. Not a guest
    /// failure: logs and metrics count it apart (status 499, never sent).
    #[error("client gone: {0}")]
    ClientGone(&'static str),
    /// A frame could not be read or written on the guest channel.
    #[error("guest channel: {0}")]
    Wire(#[from] wire::Error),
    /// The engine failed to create, boot or destroy a guest.
    #[error("engine: {0}")]
    Engine(String),
    /// The state database (`data_dir/state.db`) could not be opened, read or written.
    #[error("state database {path}: {message}")]
    Store {
        /// The database file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// A host I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A file route's path does not exist in the sandbox (silkd `not_found`).
    #[error("{0}")]
    PathNotFound(String),
    /// The sandbox's user may not do this to that path (silkd `permission_denied`).
    #[error("{0}")]
    PermissionDenied(String),
    /// The sandbox's disk is full (silkd `no_space`); nothing was written.
    #[error("{0}")]
    NoSpace(String),
    /// A port tunnel's dial inside the sandbox failed (nothing listens there): the
    /// guest's own account, safe to show the caller.
    #[error("{0}")]
    PortUnreachable(String),
    /// A `Range` that starts past the end of the file.
    #[error("range not satisfiable: the file has {size} bytes")]
    RangeNotSatisfiable {
        /// The file's size.
        size: u64,
    },
    /// The engine or the sandbox's state does not allow the operation (409).
    #[error("{0}")]
    Conflict(String),
    /// A per-tenant quota is used up (429): the message names the limit and its key.
    #[error("{0}")]
    Quota(String),
    /// The daemon is shutting down.
    #[error("shutting down")]
    ShuttingDown,
}

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with what we were doing.
    pub fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}
