//! The v1 messages. Requests flow host → guest, responses guest → host.
//!
//! Encoding: each message is a MessagePack map with a `type` field naming the variant
//! (snake_case) and the variant's fields by name; byte payloads are MessagePack `bin`.

use serde::{Deserialize, Serialize};

use crate::files;

/// Protocol version carried in [`Response::Info`].
pub const PROTO_VERSION: u32 = 1;

/// A request from the host (or an SDK speaking through the relay) to silkd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Start a command. Answered by `Started`, output frames, then `Exit` (or `Error`).
    Exec {
        /// Program and arguments; `argv[0]` is looked up in `PATH` when it has no `/`.
        argv: Vec<String>,
        /// Working directory; silkd's `--workdir` (the template's), else its own, when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        /// Extra environment on top of the base (`PATH`, `HOME`, `USER`, `LOGNAME`,
        /// `LANG`, `TERM`) and the template's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        env: Option<Vec<(String, String)>>,
        /// Who runs it: a user name or a numeric uid from the guest's `/etc/passwd`;
        /// silkd's `--user` (the template's user) when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        /// When true the child's stdin is fed by `Stdin` frames; else `/dev/null`.
        #[serde(default)]
        stdin: bool,
        /// Kill the command's process group after this many milliseconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// Run under a pseudo-terminal: stdin, stdout and stderr are its slave side, all
        /// output comes as `Stdout`, `Stdin` frames are accepted whatever `stdin` says,
        /// and `Resize` may be sent while it runs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pty: Option<Pty>,
        /// Keep running when this connection closes: output goes to a bounded ring in
        /// silkd as well as to this connection, and later connections `Attach` by pid.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        detach: bool,
    },
    /// Follow a command started with `detach: true`: answered like an `Exec` (`Started`,
    /// the output its ring still holds, then live output, then `Exit`); `Stdin`,
    /// `StdinClose` and `Resize` may be sent meanwhile. Closing the connection leaves
    /// the command running.
    Attach {
        /// The pid from `Started` or `Procs`.
        pid: u32,
    },
    /// Change the window size of the running exec's pseudo-terminal (only valid during
    /// an `Exec` with `pty`). Answered by nothing; the kernel sends SIGWINCH to the
    /// terminal's foreground process group.
    Resize {
        /// Rows, 1..=[`PTY_MAX_DIM`].
        rows: u32,
        /// Columns, 1..=[`PTY_MAX_DIM`].
        cols: u32,
    },
    /// Bytes for the running exec's stdin (only valid during an `Exec` with `stdin: true`).
    Stdin {
        /// The bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Close the running exec's stdin (EOF).
    StdinClose,
    /// Signal a command's whole process group. Answered by `Done` or `Error{not_found}`.
    Kill {
        /// The pid from `Started`.
        pid: u32,
        /// Signal number; SIGKILL when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
    /// List live and recently exited commands. Answered by `Procs`.
    Ps,
    /// Ask who is there. Answered by `Info`.
    Info,
    /// Read a file (`files.rs`).
    FileRead(files::FileRead),
    /// Write a file from the `Data` frames that follow.
    FileWrite(files::FileWrite),
    /// Bytes for a running `FileWrite` or `TarIn`.
    Data {
        /// The bytes, at most [`files::DATA_CHUNK`] per frame from our own senders.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// The end of a `FileWrite`'s or `TarIn`'s bytes: commit them.
    DataEnd,
    /// One path's metadata (links not followed). Answered by `Stat`.
    Stat(files::PathArg),
    /// A directory's entries.
    List(files::List),
    /// Create a directory.
    Mkdir(files::Mkdir),
    /// Remove a path.
    Remove(files::Remove),
    /// Rename a path.
    Rename(files::Rename),
    /// A directory as a tar archive, in `Data` frames, then `Done`.
    TarOut(files::PathArg),
    /// Unpack a tar archive into a directory.
    TarIn(files::TarIn),
    /// Watch a directory for changes.
    Watch(files::Watch),
    /// Connect to `127.0.0.1:port` inside the sandbox. Only valid as a stream's first
    /// frame; answered by `Done` (after which the stream carries the TCP connection's raw
    /// bytes both ways, EOF passed on as a half-close) or `Error` (`not_found` when nothing
    /// listens there, `bad_request` for port 0), which ends the stream.
    Connect {
        /// The TCP port.
        port: u16,
    },
}

/// Largest `rows` or `cols` a pseudo-terminal accepts (the kernel stores them as u16;
/// no real screen comes near this).
pub const PTY_MAX_DIM: u32 = 4096;
/// Longest `term` accepted.
pub const PTY_MAX_TERM: usize = 64;

/// The pseudo-terminal an `Exec` asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pty {
    /// Rows, 1..=[`PTY_MAX_DIM`].
    pub rows: u32,
    /// Columns, 1..=[`PTY_MAX_DIM`].
    pub cols: u32,
    /// `TERM` for the command (letters, digits, `.`, `_`, `+`, `-`; at most
    /// [`PTY_MAX_TERM`] bytes); `xterm-256color` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<String>,
}

impl Pty {
    /// `TERM` when the request names none.
    pub const DEFAULT_TERM: &'static str = "xterm-256color";

    /// Checks a window size; the message says what is wrong.
    pub fn check_size(rows: u32, cols: u32) -> Result<(), String> {
        for (name, v) in [("rows", rows), ("cols", cols)] {
            if v == 0 || v > PTY_MAX_DIM {
                return Err(format!("pty {name} is {v}; it must be 1..={PTY_MAX_DIM}"));
            }
        }
        Ok(())
    }

    /// Checks the size and `term` (a terminfo name: programs look it up as a path, so
    /// `/` and `..` are refused along with anything else unusual).
    pub fn check(&self) -> Result<(), String> {
        Self::check_size(self.rows, self.cols)?;
        if let Some(t) = &self.term {
            let ok = !t.is_empty()
                && t.len() <= PTY_MAX_TERM
                && !t.starts_with('.')
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
            if !ok {
                let cut: String = t.chars().take(PTY_MAX_TERM).collect();
                return Err(format!(
                    "pty term {cut:?} must be 1..={PTY_MAX_TERM} bytes of letters, digits, '.', '_', '+', '-'"
                ));
            }
        }
        Ok(())
    }

    /// The `TERM` the command gets.
    pub fn term(&self) -> &str {
        self.term.as_deref().unwrap_or(Self::DEFAULT_TERM)
    }
}

/// A response from silkd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// The command started with this pid (also its process group id).
    Started {
        /// Pid of the child, leader of its own process group.
        pid: u32,
    },
    /// A chunk of the child's stdout.
    Stdout {
        /// The bytes, exactly as written.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// A chunk of the child's stderr.
    Stderr {
        /// The bytes, exactly as written.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// The command ended. Terminal for `Exec`.
    Exit {
        /// Exit code when it exited normally.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        /// Signal number when a signal ended it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// True when silkd killed it because `timeout_ms` expired.
        timed_out: bool,
    },
    /// The request succeeded and has no other answer (`Kill`).
    Done,
    /// Answer to `Ps`.
    Procs {
        /// Live and recently exited commands.
        procs: Vec<ProcInfo>,
    },
    /// Answer to `Info`.
    Info {
        /// silkd's version.
        version: String,
        /// Protocol version ([`PROTO_VERSION`]).
        proto: u32,
        /// Milliseconds since silkd started.
        uptime_ms: u64,
        /// Number of live commands.
        procs: u32,
    },
    /// A file's metadata: the answer to `Stat`, the first answer to `FileRead` and
    /// `Watch`, the final one to `FileWrite`.
    Stat(files::FileEntry),
    /// Some of a directory's entries (a `List` answer sends as many as needed, then `Done`).
    Entries {
        /// At most [`files::ENTRIES_PER_FRAME`] rows.
        entries: Vec<files::FileEntry>,
    },
    /// Bytes of a file (`FileRead`) or archive (`TarOut`).
    Data {
        /// The bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// A change seen by a `Watch`.
    Event(files::FsEvent),
    /// The request failed. Terminal for every verb.
    Error {
        /// What class of failure.
        kind: ErrorKind,
        /// Human-readable detail (paths, errno).
        message: String,
    },
}

impl Response {
    /// Shorthand for an `Error` response.
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        Response::Error {
            kind,
            message: message.into(),
        }
    }
}

/// Classes of failure, stable across versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The caller's fault: malformed frame, empty argv, missing command or cwd, a bad
    /// path or archive entry.
    BadRequest,
    /// Unknown pid, or a path that does not exist.
    NotFound,
    /// The user the request runs as may not do this (EACCES, EPERM, EROFS).
    PermissionDenied,
    /// The sandbox's disk is full (ENOSPC, EDQUOT, EFBIG).
    NoSpace,
    /// Spawn hit EAGAIN, ENOMEM or EMFILE; retry later.
    ResourceExhausted,
    /// A verb this silkd does not implement.
    Unimplemented,
    /// Anything else; the message carries errno and context.
    Internal,
}

impl ErrorKind {
    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::NotFound => "not_found",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::Unimplemented => "unimplemented",
            ErrorKind::Internal => "internal",
        }
    }
}

/// One row of `Procs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcInfo {
    /// Pid (= process group id).
    pub pid: u32,
    /// The argv it was started with.
    pub argv: Vec<String>,
    /// Running or exited.
    pub state: ProcState,
    /// Exit code, once exited normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// Signal, once ended by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// When it started, in milliseconds since the Unix epoch (guest clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// Started with `detach: true`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub detached: bool,
    /// Of a detached command: output bytes its ring dropped (oldest first) to stay
    /// within its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
}

/// Whether a command still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcState {
    /// Still running.
    Running,
    /// Exited (kept for a while so a late `Kill` answers `Done`).
    Exited,
}
