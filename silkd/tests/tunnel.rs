//! `Connect{port}` against a real silkd (run as a plain process, so its 127.0.0.1 is the
//! host's): bytes sent right behind the frame reach the server first, both directions
//! pass unchanged with half-close; refusals are typed (`not_found` for a closed port,
//! `bad_request` for port 0 or a `connect` after another request) and silkd serves on.

use futures::{SinkExt, StreamExt};
use testkit::silkd::Silkd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::codec::Framed;
use wire::{encode_frame, ErrorKind, HostCodec, Request, Response};

#[tokio::test]
async fn a_tunnel_carries_bytes_both_ways_and_refusals_are_typed() {
    testkit::bounded(async {
        let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();

        // The request frame and early bytes in one write: the server gets them in order.
        let mut raw = silkd.raw().await;
        let mut first = encode_frame(Request::Connect { port }).unwrap().to_vec();
        first.extend_from_slice(b"early ");
        raw.write_all(&first).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let mut framed = Framed::new(raw, HostCodec::new());
        assert_eq!(framed.next().await.unwrap().unwrap(), Response::Done);
        let parts = framed.into_parts();
        assert!(parts.read_buf.is_empty(), "nothing after done yet");
        let mut raw = parts.io;
        raw.write_all(b"bytes\xff\x00").await.unwrap();
        raw.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(
            got, b"early bytes\xff\x00",
            "the server reads EOF after the bytes"
        );
        server.write_all(b"answer").await.unwrap();
        drop(server);
        let mut back = Vec::new();
        raw.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"answer");

        // Nothing listening (the listener is gone), port 0, connect after another request.
        drop(listener);
        let mut c = silkd.connect().await;
        match c.rpc(Request::Connect { port }).await {
            Response::Error {
                kind: ErrorKind::NotFound,
                message,
            } => {
                assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}")
            }
            other => panic!("closed port: {other:?}"),
        }
        assert!(c.recv_or_close().await.is_none(), "a refused tunnel closes");
        let mut c = silkd.connect().await;
        let answer = c.rpc(Request::Connect { port: 0 }).await;
        assert!(
            matches!(
                answer,
                Response::Error {
                    kind: ErrorKind::BadRequest,
                    ..
                }
            ),
            "{answer:?}"
        );
        let mut c = silkd.connect().await;
        assert!(matches!(c.rpc(Request::Info).await, Response::Info { .. }));
        c.framed.send(Request::Connect { port: 1 }).await.unwrap();
        let answer = c.recv().await;
        assert!(
            matches!(
                answer,
                Response::Error {
                    kind: ErrorKind::BadRequest,
                    ..
                }
            ),
            "{answer:?}"
        );
        // silkd serves on.
        let mut c = silkd.connect().await;
        assert!(matches!(c.rpc(Request::Info).await, Response::Info { .. }));
    })
    .await;
}
