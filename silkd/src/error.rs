//! The crate's one error type, and how a spawn failure maps to a wire error kind.

use wire::ErrorKind;

/// Longest `Error.message` silkd sends, in bytes.
pub const MAX_MESSAGE: usize = 4096;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything silkd can fail at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller asked for something impossible (bad argv, missing cwd...).
    #[error("{0}")]
    BadRequest(String),
    /// No such pid (an `Attach` to a command silkd never started or forgot).
    #[error("{0}")]
    NotFound(String),
    /// The process table is full of running commands (`--max-procs`): retryable.
    #[error("{0}")]
    Full(String),
    /// The system ran out of something (EAGAIN, ENOMEM, EMFILE): retryable.
    #[error("{context}: {source}")]
    Exhausted {
        /// What we were doing.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An OS call failed for another reason.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file verb's OS call failed; the errno decides the kind (`files/`).
    #[error("{context}: {source}")]
    Fs {
        /// What we were doing, with the path.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file write or archive unpack ended without its `data_end`: nothing was committed.
    #[error("{0}")]
    Interrupted(String),
    /// A frame could not be read or written.
    #[error(transparent)]
    Wire(#[from] wire::Error),
    /// A listen address we cannot parse.
    #[error("bad listen address {0:?}: expected unix:/path, vsock:PORT or serial:NAME")]
    ListenAddr(String),
}

impl Error {
    /// A file verb's failure on `path`.
    pub fn fs(what: &str, path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Fs {
            context: format!("{what} {}", path.display()),
            source,
        }
    }

    /// An I/O failure with context; EAGAIN/ENOMEM/EMFILE/ENFILE become [`Error::Exhausted`].
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        let context = context.into();
        match source.raw_os_error() {
            Some(libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE) => {
                Error::Exhausted { context, source }
            }
            _ => Error::Io { context, source },
        }
    }

    /// The wire error kind this failure is reported as.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::BadRequest(_) | Error::ListenAddr(_) => ErrorKind::BadRequest,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::Exhausted { .. } | Error::Full(_) => ErrorKind::ResourceExhausted,
            Error::Wire(e) if e.is_bad_input() => ErrorKind::BadRequest,
            Error::Fs { source, .. } => fs_kind(source),
            Error::Io { .. } | Error::Wire(_) | Error::Interrupted(_) => ErrorKind::Internal,
        }
    }

    /// The `Error` response for this failure; the message carries errno where there is one
    /// and is cut to [`MAX_MESSAGE`] bytes (it may quote a path or an argument).
    pub fn to_response(&self) -> wire::Response {
        let mut message = match self {
            Error::Exhausted { source, .. }
            | Error::Io { source, .. }
            | Error::Fs { source, .. } => match source.raw_os_error() {
                Some(errno) => format!("{self} (errno {errno})"),
                None => self.to_string(),
            },
            _ => self.to_string(),
        };
        if message.len() > MAX_MESSAGE {
            let mut end = MAX_MESSAGE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
        wire::Response::error(self.kind(), message)
    }
}

/// The kind a file verb's errno is reported as: what the caller can act on (a missing
/// path, a refusal, a full disk) is told apart from silkd's own failures.
fn fs_kind(e: &std::io::Error) -> ErrorKind {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => ErrorKind::NotFound,
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => ErrorKind::PermissionDenied,
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => ErrorKind::NoSpace,
        Some(
            libc::EISDIR
            | libc::EINVAL
            | libc::ENAMETOOLONG
            | libc::EEXIST
            | libc::ENOTEMPTY
            | libc::ELOOP
            | libc::EXDEV
            | libc::EBUSY,
        ) => ErrorKind::BadRequest,
        Some(libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE) => {
            ErrorKind::ResourceExhausted
        }
        _ => ErrorKind::Internal,
    }
}
