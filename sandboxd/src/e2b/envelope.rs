//! The Connect protocol's envelope: `flags: u8`, `length: u32` big-endian, then `length`
//! bytes of JSON. Pure parsing and encoding, no I/O: "need more bytes" is `Ok(None)`,
//! never an error, and every malformed input is a typed [`Error`].

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{Error, Result};

/// Flag bit: the payload is compressed (we never negotiate compression, so it is refused).
pub const COMPRESSED: u8 = 0x01;
/// Flag bit: the last message of a server stream, carrying `{}` or `{"error": ...}`.
pub const END_STREAM: u8 = 0x02;
/// Largest request message accepted: a stream request holds one small JSON object
/// (a command line and its environment), far below this.
pub const MAX_REQUEST_MESSAGE: usize = 1024 * 1024;

/// One decoded envelope.
#[derive(Debug, PartialEq, Eq)]
pub struct Envelope {
    /// Its flags byte.
    pub flags: u8,
    /// Its message.
    pub data: Bytes,
}

/// Takes one envelope off the front of `buf`, or `None` until it is all there. A length
/// over `max` or a compressed or unknown flag is an error at once (before the bytes
/// arrive), so a hostile length cannot make us buffer it.
pub fn decode(buf: &mut BytesMut, max: usize) -> Result<Option<Envelope>> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let flags = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if flags & COMPRESSED != 0 {
        return Err(Error::BadRequest(
            "compressed Connect messages are not supported (send Connect-Content-Encoding: identity)".into(),
        ));
    }
    if flags & !END_STREAM != 0 {
        return Err(Error::BadRequest(format!(
            "unknown Connect envelope flags {flags:#04x}"
        )));
    }
    if len > max {
        return Err(Error::BodyTooLarge { limit: max });
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    buf.advance(5);
    let data = buf.split_to(len).freeze();
    Ok(Some(Envelope { flags, data }))
}

/// Encodes one envelope.
pub fn encode(flags: u8, data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + data.len());
    out.put_u8(flags);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_partial_input() {
        let bytes = encode(0, br#"{"a":1}"#);
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 7]);
        let mut buf = BytesMut::new();
        for (i, b) in bytes.iter().enumerate() {
            assert_eq!(decode(&mut buf, 64).unwrap(), None, "after {i} bytes");
            buf.put_u8(*b);
        }
        let env = decode(&mut buf, 64).unwrap().unwrap();
        assert_eq!((env.flags, &env.data[..]), (0, &br#"{"a":1}"#[..]));
        assert!(buf.is_empty());
        let end = encode(END_STREAM, b"{}");
        assert_eq!(&end[..], &[2, 0, 0, 0, 2, b'{', b'}']);
    }

    #[test]
    fn hostile_envelopes_are_refused_before_their_bytes() {
        // A 4 GiB length with nothing behind it: refused at once, nothing buffered.
        let mut buf = BytesMut::from(&[0u8, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            decode(&mut buf, MAX_REQUEST_MESSAGE),
            Err(Error::BodyTooLarge { .. })
        ));
        let mut buf = BytesMut::from(&[COMPRESSED, 0, 0, 0, 0][..]);
        assert!(matches!(decode(&mut buf, 64), Err(Error::BadRequest(_))));
        let mut buf = BytesMut::from(&[0x80u8, 0, 0, 0, 0][..]);
        assert!(matches!(decode(&mut buf, 64), Err(Error::BadRequest(_))));
    }
}
