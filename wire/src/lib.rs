//! `wire`: the v1 frame protocol spoken between sandboxd (host) and silkd (guest).
//!
//! # Layout
//! - [`msg`]: the request and response messages as serde types.
//! - [`files`]: the file verbs' request and answer bodies (read, write, list, tar, watch).
//! - [`codec`]: `u32` big-endian length + MessagePack, capped at [`MAX_FRAME`], as a
//!   tokio-util `Decoder`/`Encoder` usable on any `AsyncRead + AsyncWrite`.
//! - [`shape`]: the allocation-free walk every frame passes before it is decoded, capping
//!   nesting ([`MAX_DEPTH`]) and values ([`MAX_ELEMENTS`]).
//! - [`session`]: the VM channel's handshake and stream multiplexing.
//!
//! This crate does no I/O of its own: callers wrap their streams in a `Framed`.
#![deny(missing_docs)]

pub mod codec;
pub mod files;
pub mod msg;
pub mod session;
pub mod shape;

pub use codec::{decode_frame, encode_frame, FrameCodec, GuestCodec, HostCodec, MAX_FRAME};
pub use msg::{
    ErrorKind, ProcInfo, ProcState, Pty, Request, Response, PROTO_VERSION, PTY_MAX_DIM,
    PTY_MAX_TERM,
};
pub use shape::{MAX_DEPTH, MAX_ELEMENTS};

/// Everything that can go wrong reading or writing a frame.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The length prefix announced more than [`MAX_FRAME`] bytes; nothing was allocated.
    #[error("frame of {len} bytes exceeds the {max} byte cap")]
    TooLarge {
        /// Announced (or encoded) length.
        len: u64,
        /// The cap.
        max: usize,
    },
    /// The frame nests arrays and maps deeper than [`MAX_DEPTH`]; nothing was decoded.
    #[error("frame nests deeper than {max} levels")]
    TooDeep {
        /// The cap.
        max: usize,
    },
    /// The frame holds more than [`MAX_ELEMENTS`] MessagePack values; nothing was decoded.
    #[error("frame holds more than {max} values")]
    TooManyElements {
        /// The cap.
        max: usize,
    },
    /// The frame was complete but its bytes are not a message of the expected type.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A message could not be encoded.
    #[error("cannot encode message: {0}")]
    Encode(String),
    /// The underlying stream failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// True when the peer sent bytes we could not accept (as opposed to an I/O failure).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::TooLarge { .. }
                | Error::TooDeep { .. }
                | Error::TooManyElements { .. }
                | Error::Malformed(_)
        )
    }
}
