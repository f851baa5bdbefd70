//! Hostile frames: inside the 8 MiB cap but built to cost memory when decoded (deep
//! nesting, millions of tiny values, lengths that lie). Each gets a typed error from the
//! shape check, in both directions, before MessagePack decoding allocates anything. The
//! small ones are also kept as bytes in `wire/fixtures/hostile/` for other clients.

use std::path::PathBuf;

use bytes::BytesMut;
use tokio_util::codec::Decoder;
use wire::{Error, GuestCodec, HostCodec, Request, Response, MAX_DEPTH, MAX_ELEMENTS, MAX_FRAME};

fn framed(body: &[u8]) -> Vec<u8> {
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

fn str8(out: &mut Vec<u8>, s: &str) {
    out.push(0xa0 | s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// `{"type": "exec", "argv": ["true"], "env": [[k, v]; pairs]}` with one-byte keys and
/// values: three bytes per pair on the wire, three values per pair once decoded.
fn exec_with_env(pairs: u32) -> Vec<u8> {
    let mut b = vec![0x83];
    str8(&mut b, "type");
    str8(&mut b, "exec");
    str8(&mut b, "argv");
    b.push(0x91);
    str8(&mut b, "true");
    str8(&mut b, "env");
    b.push(0xdd);
    b.extend_from_slice(&pairs.to_be_bytes());
    for _ in 0..pairs {
        b.extend_from_slice(&[0x92, 0xa1, b'k', 0xa1, b'v']);
    }
    b
}

/// `{"type": "procs", "procs": [{"pid": 1, "argv": [""; n], "state": "running"}]}`.
fn procs_with_argv(n: u32) -> Vec<u8> {
    let mut b = vec![0x82];
    str8(&mut b, "type");
    str8(&mut b, "procs");
    str8(&mut b, "procs");
    b.push(0x91);
    b.push(0x83);
    str8(&mut b, "pid");
    b.push(0x01);
    str8(&mut b, "argv");
    b.push(0xdd);
    b.extend_from_slice(&n.to_be_bytes());
    b.resize(b.len() + n as usize, 0xa0);
    str8(&mut b, "state");
    str8(&mut b, "running");
    b
}

/// `{"type": "stdin", "data": [[[...]]]}` nested `depth` arrays deep.
fn nested(depth: usize) -> Vec<u8> {
    let mut b = vec![0x82];
    str8(&mut b, "type");
    str8(&mut b, "stdin");
    str8(&mut b, "data");
    b.resize(b.len() + depth, 0x91);
    b.push(0x00);
    b
}

fn guest_decode(frame: &[u8]) -> Result<Option<Request>, Error> {
    GuestCodec::new().decode(&mut BytesMut::from(frame))
}

fn host_decode(frame: &[u8]) -> Result<Option<Response>, Error> {
    HostCodec::new().decode(&mut BytesMut::from(frame))
}

#[test]
fn millions_of_tiny_env_pairs_are_refused_before_decoding() {
    // The largest such request that fits the byte cap: ~1.7 M pairs, ~5 M values.
    let pairs = ((MAX_FRAME - 64) / 5) as u32;
    let frame = framed(&exec_with_env(pairs));
    assert!(frame.len() <= MAX_FRAME + 4);
    let err = guest_decode(&frame).unwrap_err();
    assert!(
        matches!(err, Error::TooManyElements { max: MAX_ELEMENTS }),
        "{err}"
    );
    assert!(err.is_bad_input());
    // Just under the cap still decodes: the cap refuses floods, not ordinary requests.
    // 8 values outside env (the map, 3 keys, "exec", argv and its item, env's array);
    // each pair is 3 (its array and two strings).
    let fits = ((MAX_ELEMENTS - 8) / 3) as u32;
    match guest_decode(&framed(&exec_with_env(fits))).unwrap() {
        Some(Request::Exec { env: Some(env), .. }) => assert_eq!(env.len(), fits as usize),
        other => panic!("{other:?}"),
    }
    let err = guest_decode(&framed(&exec_with_env(fits + 1))).unwrap_err();
    assert!(matches!(err, Error::TooManyElements { .. }), "{err}");
}

#[test]
fn a_response_of_millions_of_empty_strings_is_refused_by_the_host() {
    let n = (MAX_FRAME - 64) as u32;
    let err = host_decode(&framed(&procs_with_argv(n))).unwrap_err();
    assert!(matches!(err, Error::TooManyElements { .. }), "{err}");
    // A modest one decodes.
    match host_decode(&framed(&procs_with_argv(100))).unwrap() {
        Some(Response::Procs { procs }) => assert_eq!(procs[0].argv.len(), 100),
        other => panic!("{other:?}"),
    }
}

#[test]
fn deep_nesting_is_refused_in_both_directions() {
    let err = guest_decode(&framed(&nested(100_000))).unwrap_err();
    assert!(matches!(err, Error::TooDeep { max: MAX_DEPTH }), "{err}");
    let err = host_decode(&framed(&nested(MAX_DEPTH))).unwrap_err();
    assert!(matches!(err, Error::TooDeep { .. }), "{err}");
    // Within the depth cap the frame reaches the decoder, which refuses it as the wrong
    // type: a different, still typed, error.
    let err = guest_decode(&framed(&nested(3))).unwrap_err();
    assert!(matches!(err, Error::Malformed(_)), "{err}");
}

#[test]
fn lengths_that_lie_are_refused() {
    // An array announcing 4 G items, a string announcing 4 GiB, inside a 10-byte frame.
    for body in [
        [&[0x81, 0xa4][..], b"type", &[0xdd, 0xff, 0xff, 0xff, 0xff]].concat(),
        [&[0x81, 0xa4][..], b"type", &[0xdb, 0xff, 0xff, 0xff, 0xff]].concat(),
    ] {
        let err = guest_decode(&framed(&body)).unwrap_err();
        assert!(matches!(err, Error::Malformed(_)), "{err}");
        let err = host_decode(&framed(&body)).unwrap_err();
        assert!(matches!(err, Error::Malformed(_)), "{err}");
    }
}

#[test]
fn a_lowered_cap_refuses_at_the_prefix() {
    let frame = wire::encode_frame(Response::Stdout {
        data: vec![0; 2048],
    })
    .unwrap();
    let mut codec = HostCodec::new().with_max(1024);
    let err = codec.decode(&mut BytesMut::from(&frame[..4])).unwrap_err();
    assert!(matches!(err, Error::TooLarge { max: 1024, .. }), "{err}");
    let mut codec = HostCodec::new().with_max(4096);
    assert!(codec
        .decode(&mut BytesMut::from(&frame[..]))
        .unwrap()
        .is_some());
    assert_eq!(codec.last_frame_len(), frame.len());
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/hostile")
        .join(format!("{name}.bin"))
}

/// Which error a hostile fixture must get.
type Expected = fn(&Error) -> bool;

/// The small hostile frames, kept as bytes: each must be refused with its error.
#[test]
fn hostile_fixtures_are_refused() {
    let cases: Vec<(&str, Vec<u8>, Expected)> = vec![
        ("deep", framed(&nested(MAX_DEPTH + 1)), |e| {
            matches!(e, Error::TooDeep { .. })
        }),
        (
            "array_count_lie",
            framed(&[&[0x81, 0xa4][..], b"type", &[0xdd, 0xff, 0xff, 0xff, 0xff]].concat()),
            |e| matches!(e, Error::Malformed(_)),
        ),
        (
            "str_length_lie",
            framed(&[&[0x81, 0xa4][..], b"type", &[0xdb, 0xff, 0xff, 0xff, 0xff]].concat()),
            |e| matches!(e, Error::Malformed(_)),
        ),
        (
            "trailing_value",
            framed(
                &[
                    wire::encode_frame(Request::Info).unwrap()[4..].to_vec(),
                    vec![0xc0],
                ]
                .concat(),
            ),
            |e| matches!(e, Error::Malformed(_)),
        ),
    ];
    for (name, frame, expected) in cases {
        let path = fixture(name);
        if std::env::var_os("WIRE_BLESS").is_some() {
            std::fs::write(&path, &frame).expect("write fixture");
        }
        let stored = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{} missing ({e}); run with WIRE_BLESS=1", path.display()));
        assert_eq!(stored, frame, "{name} drifted");
        let err = guest_decode(&stored).unwrap_err();
        assert!(expected(&err), "{name}: {err}");
        assert!(err.is_bad_input(), "{name}");
        let err = host_decode(&stored).unwrap_err();
        assert!(expected(&err), "{name} (host): {err}");
    }
}
