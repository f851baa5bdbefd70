//! Codec behaviour on real byte streams: partial reads, the cap, malformed frames.

use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use tokio_util::codec::{Decoder, Framed};
use wire::{GuestCodec, HostCodec, Request, Response, MAX_FRAME};

#[test]
fn partial_frames_need_more_bytes() {
    let frame = wire::encode_frame(Request::Info).unwrap();
    let mut codec = GuestCodec::new();
    let mut buf = BytesMut::new();
    for (i, b) in frame.iter().enumerate() {
        assert!(codec.decode(&mut buf).unwrap().is_none(), "byte {i}");
        buf.extend_from_slice(&[*b]);
    }
    assert_eq!(codec.decode(&mut buf).unwrap(), Some(Request::Info));
}

#[test]
fn four_gib_prefix_fails_before_allocating() {
    let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
    let err = GuestCodec::new().decode(&mut buf).unwrap_err();
    assert!(
        matches!(
            err,
            wire::Error::TooLarge {
                len: 0xffff_ffff,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_bad_input());
    assert!(buf.capacity() < 1024, "the decoder grew the buffer");
}

#[test]
fn cap_is_exact() {
    let over = (MAX_FRAME as u32 + 1).to_be_bytes();
    let mut buf = BytesMut::from(&over[..]);
    assert!(GuestCodec::new().decode(&mut buf).is_err());
    let at = (MAX_FRAME as u32).to_be_bytes();
    let mut buf = BytesMut::from(&at[..]);
    assert!(GuestCodec::new().decode(&mut buf).unwrap().is_none());
}

#[test]
fn oversized_message_is_not_encoded() {
    let err = wire::encode_frame(Response::Stdout {
        data: vec![0; MAX_FRAME + 1],
    })
    .unwrap_err();
    assert!(matches!(err, wire::Error::TooLarge { .. }));
}

#[test]
fn valid_messagepack_that_is_not_a_message_is_malformed() {
    // The map {"type": "launch_missiles"}.
    let body = rmp_like_map("type", "launch_missiles");
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    let err = wire::decode_frame::<Request>(&frame).unwrap_err();
    assert!(matches!(err, wire::Error::Malformed(_)), "{err}");
    // A bare integer.
    let err = wire::decode_frame::<Request>(&[0, 0, 0, 1, 0x2a]).unwrap_err();
    assert!(matches!(err, wire::Error::Malformed(_)), "{err}");
    // Garbage.
    let err = wire::decode_frame::<Request>(&[0, 0, 0, 3, 0xc1, 0xc1, 0xc1]).unwrap_err();
    assert!(matches!(err, wire::Error::Malformed(_)), "{err}");
}

#[test]
fn a_response_is_not_a_request() {
    let frame = wire::encode_frame(Response::Done).unwrap();
    assert!(wire::decode_frame::<Request>(&frame).is_err());
}

fn rmp_like_map(k: &str, v: &str) -> Vec<u8> {
    let mut out = vec![0x81, 0xa0 | k.len() as u8];
    out.extend_from_slice(k.as_bytes());
    out.push(0xa0 | v.len() as u8);
    out.extend_from_slice(v.as_bytes());
    out
}

#[tokio::test]
async fn framed_over_a_duplex_stream() {
    let (a, b) = tokio::io::duplex(64);
    let mut host = Framed::new(a, HostCodec::new());
    let mut guest = Framed::new(b, GuestCodec::new());
    let data = (0..=255u8).cycle().take(100_000).collect::<Vec<_>>();
    let send = async {
        host.send(Request::Stdin { data: data.clone() })
            .await
            .unwrap();
        host.send(Request::StdinClose).await.unwrap();
        host
    };
    let recv = async {
        let a = guest.next().await.unwrap().unwrap();
        let b = guest.next().await.unwrap().unwrap();
        (a, b)
    };
    let (_host, (a, b)) = tokio::join!(send, recv);
    assert_eq!(a, Request::Stdin { data: data.clone() });
    assert_eq!(b, Request::StdinClose);
}
