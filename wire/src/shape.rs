//! The shape check: a walk over a frame's MessagePack markers, before anything decodes it,
//! that refuses a frame nesting deeper than [`MAX_DEPTH`], holding more than
//! [`MAX_ELEMENTS`] values, or declaring a length past its own end.
//!
//! Why: the 8 MiB frame cap bounds bytes, not what they decode into. MessagePack spends one
//! byte on an empty string, which decodes into a 24-byte `String` (plus an allocation when
//! it is not empty), so an 8 MiB `Exec.env` of tiny pairs would cost hundreds of MiB of
//! heap. This walk allocates nothing (a fixed stack of [`MAX_DEPTH`] counters) and reads
//! each byte at most once; payload bytes (`str`, `bin`, `ext`) are skipped by length.

use crate::Error;

/// Deepest nesting of arrays and maps accepted: a top-level map is depth 1. The deepest
/// v1 message (`procs`: map → array → map → array) is depth 4.
pub const MAX_DEPTH: usize = 16;

/// Most MessagePack values accepted in one frame, every value counted once: map keys,
/// map values, array items and the containers themselves. 65,536 values decode into at
/// most a few MiB of heap on top of the frame's own bytes.
pub const MAX_ELEMENTS: usize = 65_536;

/// Checks that `body` is exactly one MessagePack value within the caps.
pub fn check(body: &[u8]) -> Result<(), Error> {
    // remaining[d]: values still expected at depth d (depth 0 holds the one top value).
    let mut remaining = [0u64; MAX_DEPTH + 1];
    remaining[0] = 1;
    let mut depth = 0;
    let mut pos = 0;
    let mut elements = 0;
    loop {
        while remaining[depth] == 0 {
            if depth == 0 {
                if pos != body.len() {
                    return Err(Error::Malformed(format!(
                        "{} trailing bytes after the message",
                        body.len() - pos
                    )));
                }
                return Ok(());
            }
            depth -= 1;
        }
        remaining[depth] -= 1;
        elements += 1;
        if elements > MAX_ELEMENTS {
            return Err(Error::TooManyElements { max: MAX_ELEMENTS });
        }
        let marker = *body.get(pos).ok_or_else(truncated)?;
        pos += 1;
        let item = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => Item::Skip(0),
            0x80..=0x8f => Item::Container(2 * u64::from(marker & 0x0f)),
            0x90..=0x9f => Item::Container(u64::from(marker & 0x0f)),
            0xa0..=0xbf => Item::Skip(u64::from(marker & 0x1f)),
            0xc4 | 0xd9 => Item::Skip(read_len(body, &mut pos, 1)?),
            0xc5 | 0xda => Item::Skip(read_len(body, &mut pos, 2)?),
            0xc6 | 0xdb => Item::Skip(read_len(body, &mut pos, 4)?),
            // ext: a length, then a type byte, then the payload.
            0xc7 => Item::Skip(read_len(body, &mut pos, 1)? + 1),
            0xc8 => Item::Skip(read_len(body, &mut pos, 2)? + 1),
            0xc9 => Item::Skip(read_len(body, &mut pos, 4)? + 1),
            0xcc | 0xd0 => Item::Skip(1),
            0xcd | 0xd1 => Item::Skip(2),
            0xca | 0xce | 0xd2 => Item::Skip(4),
            0xcb | 0xcf | 0xd3 => Item::Skip(8),
            0xd4 => Item::Skip(2),
            0xd5 => Item::Skip(3),
            0xd6 => Item::Skip(5),
            0xd7 => Item::Skip(9),
            0xd8 => Item::Skip(17),
            0xdc => Item::Container(read_len(body, &mut pos, 2)?),
            0xdd => Item::Container(read_len(body, &mut pos, 4)?),
            0xde => Item::Container(2 * read_len(body, &mut pos, 2)?),
            0xdf => Item::Container(2 * read_len(body, &mut pos, 4)?),
            0xc1 => return Err(Error::Malformed("marker 0xc1 is never used".into())),
        };
        let left = (body.len() - pos) as u64;
        match item {
            Item::Skip(n) if n > left => return Err(past_end(n, left)),
            Item::Skip(n) => pos += n as usize,
            // Every value takes at least one byte: a count the frame cannot hold is a lie,
            // refused before a decoder could size anything by it.
            Item::Container(n) if n > left => return Err(past_end(n, left)),
            Item::Container(n) => {
                if depth + 1 > MAX_DEPTH {
                    return Err(Error::TooDeep { max: MAX_DEPTH });
                }
                depth += 1;
                remaining[depth] = n;
            }
        }
    }
}

enum Item {
    /// A scalar or a payload of this many bytes after the marker (and its length).
    Skip(u64),
    /// An array or map holding this many values (a map's keys and values both count).
    Container(u64),
}

fn read_len(body: &[u8], pos: &mut usize, width: usize) -> Result<u64, Error> {
    let bytes = body.get(*pos..*pos + width).ok_or_else(truncated)?;
    *pos += width;
    Ok(bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
}

fn truncated() -> Error {
    Error::Malformed("the message ends in the middle of a value".into())
}

fn past_end(declared: u64, left: u64) -> Error {
    Error::Malformed(format!(
        "a value declares {declared} bytes or items but only {left} bytes are left in the frame"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scalar_marker_is_walked() {
        let cases: &[&[u8]] = &[
            &[0x00],
            &[0xff],
            &[0xc0],
            &[0xc2],
            &[0xc3],
            &[0xa3, b'a', b'b', b'c'],
            &[0xd9, 2, b'a', b'b'],
            &[0xda, 0, 1, b'a'],
            &[0xdb, 0, 0, 0, 1, b'a'],
            &[0xc4, 1, 9],
            &[0xc5, 0, 1, 9],
            &[0xc6, 0, 0, 0, 1, 9],
            &[0xc7, 1, 5, 9],
            &[0xc8, 0, 1, 5, 9],
            &[0xc9, 0, 0, 0, 1, 5, 9],
            &[0xcc, 1],
            &[0xcd, 1, 2],
            &[0xce, 1, 2, 3, 4],
            &[0xcf, 1, 2, 3, 4, 5, 6, 7, 8],
            &[0xd0, 1],
            &[0xd1, 1, 2],
            &[0xd2, 1, 2, 3, 4],
            &[0xd3, 1, 2, 3, 4, 5, 6, 7, 8],
            &[0xca, 1, 2, 3, 4],
            &[0xcb, 1, 2, 3, 4, 5, 6, 7, 8],
            &[0xd4, 1, 2],
            &[0xd5, 1, 2, 3],
            &[0xd6, 1, 2, 3, 4, 5],
            &[0xd7, 1, 2, 3, 4, 5, 6, 7, 8, 9],
            &[
                0xd8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
            ],
            &[0x92, 0x01, 0x91, 0x02],
            &[0xdc, 0, 1, 0x01],
            &[0xdd, 0, 0, 0, 1, 0x01],
            &[0x81, 0xa1, b'k', 0x01],
            &[0xde, 0, 1, 0x01, 0x02],
            &[0xdf, 0, 0, 0, 1, 0x01, 0x02],
        ];
        for case in cases {
            check(case).unwrap_or_else(|e| panic!("{case:02x?}: {e}"));
            // Cut anywhere short, the same bytes are truncated, never accepted.
            for cut in 0..case.len() {
                assert!(check(&case[..cut]).is_err(), "{case:02x?} cut at {cut}");
            }
            // One byte more is a trailing byte.
            let mut longer = case.to_vec();
            longer.push(0);
            assert!(check(&longer).is_err(), "{case:02x?} + 1 byte");
        }
        assert!(matches!(check(&[0xc1]), Err(Error::Malformed(_))));
    }

    #[test]
    fn depth_is_capped_exactly() {
        let nested = |n: usize| {
            let mut v = vec![0x91; n];
            v.push(0x00);
            v
        };
        check(&nested(MAX_DEPTH)).unwrap();
        assert!(matches!(
            check(&nested(MAX_DEPTH + 1)),
            Err(Error::TooDeep { max: MAX_DEPTH })
        ));
    }

    #[test]
    fn elements_are_capped_exactly() {
        // An array of n-1 nils is n values.
        let array = |n: usize| {
            let items = n - 1;
            let mut v = vec![0xdd];
            v.extend_from_slice(&(items as u32).to_be_bytes());
            v.resize(v.len() + items, 0xc0);
            v
        };
        check(&array(MAX_ELEMENTS)).unwrap();
        assert!(matches!(
            check(&array(MAX_ELEMENTS + 1)),
            Err(Error::TooManyElements { max: MAX_ELEMENTS })
        ));
    }

    #[test]
    fn declared_lengths_past_the_end_are_refused() {
        for lie in [
            vec![0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0],
            vec![0xdf, 0x80, 0, 0, 0, 0xc0, 0xc0],
            vec![0xdb, 0xff, 0xff, 0xff, 0xff, b'a'],
            vec![0xc6, 0, 0x80, 0, 0, 1, 2, 3],
            vec![0xc9, 0xff, 0xff, 0xff, 0xff, 1],
        ] {
            assert!(
                matches!(check(&lie), Err(Error::Malformed(_))),
                "{lie:02x?}"
            );
        }
    }
}
