//! Framing: `u32` big-endian length, then that many bytes of MessagePack.
//!
//! The cap is checked on the length prefix, before any buffer grows, so a peer announcing
//! 4 GiB costs nothing; a whole body then passes the shape check ([`crate::shape`]) before
//! MessagePack decodes it, so what it decodes into is bounded too. "Need more bytes" is
//! `Ok(None)`, never an error.

use std::marker::PhantomData;

use bytes::{Buf, BufMut, BytesMut};
use serde::{de::DeserializeOwned, Serialize};
use tokio_util::codec::{Decoder, Encoder};

use crate::{shape, Error, Request, Response};

/// Largest frame body accepted or produced: 8 MiB.
pub const MAX_FRAME: usize = 8 * 1024 * 1024;

const PREFIX: usize = 4;

/// A codec that decodes `In` frames and encodes `Out` frames.
pub struct FrameCodec<In, Out> {
    max: usize,
    last_len: usize,
    _marker: PhantomData<fn(Out) -> In>,
}

/// The host side: sends requests, reads responses.
pub type HostCodec = FrameCodec<Response, Request>;
/// The guest side: reads requests, sends responses.
pub type GuestCodec = FrameCodec<Request, Response>;

impl<In, Out> FrameCodec<In, Out> {
    /// A new codec with the [`MAX_FRAME`] cap.
    pub fn new() -> Self {
        FrameCodec {
            max: MAX_FRAME,
            last_len: 0,
            _marker: PhantomData,
        }
    }

    /// Lowers the cap on decoded frames to `max` bytes (never above [`MAX_FRAME`]): a
    /// reader that knows its peer only sends small frames holds at most that much per
    /// frame. Encoding keeps the [`MAX_FRAME`] cap.
    pub fn with_max(mut self, max: usize) -> Self {
        self.max = max.min(MAX_FRAME);
        self
    }

    /// Bytes the last decoded frame took on the wire, its prefix included: what a reader
    /// counts when it charges a peer for frames rather than for their payload.
    pub fn last_frame_len(&self) -> usize {
        self.last_len
    }
}

impl<In, Out> Default for FrameCodec<In, Out> {
    fn default() -> Self {
        Self::new()
    }
}

impl<In: DeserializeOwned, Out> Decoder for FrameCodec<In, Out> {
    type Item = In;
    type Error = Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, Error> {
        let Some(len) = frame_len(src, self.max)? else {
            return Ok(None);
        };
        if src.len() < PREFIX + len {
            src.reserve(PREFIX + len - src.len());
            return Ok(None);
        }
        src.advance(PREFIX);
        let body = src.split_to(len);
        self.last_len = PREFIX + len;
        shape::check(&body)?;
        rmp_serde::from_slice(&body)
            .map(Some)
            .map_err(|e| Error::Malformed(e.to_string()))
    }
}

impl<In, Out: Serialize> Encoder<Out> for FrameCodec<In, Out> {
    type Error = Error;

    fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), Error> {
        let start = dst.len();
        dst.put_u32(0);
        let mut writer = dst.writer();
        rmp_serde::encode::write_named(&mut writer, &item)
            .map_err(|e| Error::Encode(e.to_string()))?;
        let dst = writer.into_inner();
        let len = dst.len() - start - PREFIX;
        if len > MAX_FRAME {
            dst.truncate(start);
            return Err(Error::TooLarge {
                len: len as u64,
                max: MAX_FRAME,
            });
        }
        dst[start..start + PREFIX].copy_from_slice(&(len as u32).to_be_bytes());
        Ok(())
    }
}

/// Reads the length prefix without consuming it; errors when it is over `max`.
fn frame_len(src: &BytesMut, max: usize) -> Result<Option<usize>, Error> {
    if src.len() < PREFIX {
        return Ok(None);
    }
    let len = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
    if len > max {
        return Err(Error::TooLarge {
            len: len as u64,
            max,
        });
    }
    Ok(Some(len))
}

/// Encodes one message as a whole frame (prefix included).
pub fn encode_frame<T: Serialize>(item: T) -> Result<Vec<u8>, Error> {
    let mut buf = BytesMut::new();
    FrameCodec::<(), T>::new().encode(item, &mut buf)?;
    Ok(buf.to_vec())
}

/// Decodes exactly one whole frame (prefix included); trailing bytes are an error.
pub fn decode_frame<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    let mut buf = BytesMut::from(bytes);
    match FrameCodec::<T, ()>::new().decode(&mut buf)? {
        Some(item) if buf.is_empty() => Ok(item),
        Some(_) => Err(Error::Malformed(format!(
            "{} trailing bytes after the frame",
            buf.len()
        ))),
        None => Err(Error::Malformed("truncated frame".into())),
    }
}

// Keep the concrete pairings honest: the guest decodes requests, the host responses.
const _: fn() = || {
    fn assert_codec<C: Decoder + Encoder<O>, O>() {}
    assert_codec::<GuestCodec, Response>();
    assert_codec::<HostCodec, Request>();
};
