//! Malformed input: answered with `bad_request` where possible, closes only that
//! connection, never crashes or hangs silkd.

use std::time::Duration;

use futures::StreamExt;
use testkit::procs::wait_group_gone;
use testkit::silkd::{exec_req, Silkd};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::FramedRead;
use wire::{ErrorKind, HostCodec, Request, Response};

/// Sends raw bytes and expects one `bad_request` answer, then EOF.
async fn expect_bad_request_then_close(silkd: &Silkd, bytes: &[u8]) -> String {
    let mut raw = silkd.raw().await;
    raw.write_all(bytes).await.unwrap();
    let (rd, _wr) = raw.into_split();
    let mut frames = FramedRead::new(rd, HostCodec::new());
    let first = tokio::time::timeout(Duration::from_secs(10), frames.next())
        .await
        .expect("silkd hung")
        .expect("an answer before closing")
        .expect("a decodable answer");
    let message = match first {
        Response::Error {
            kind: ErrorKind::BadRequest,
            message,
        } => message,
        other => panic!("expected bad_request, got {other:?}"),
    };
    let next = tokio::time::timeout(Duration::from_secs(10), frames.next())
        .await
        .expect("silkd did not close");
    assert!(next.is_none(), "connection should close, got {next:?}");
    message
}

async fn still_serves(silkd: &mut Silkd) {
    assert!(silkd.is_running(), "silkd died");
    let mut c = silkd.connect().await;
    assert!(matches!(c.rpc(Request::Info).await, Response::Info { .. }));
}

#[tokio::test]
async fn garbage_bytes() {
    let mut silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let msg = expect_bad_request_then_close(&silkd, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(msg.contains("exceeds"), "{msg}");
    let msg = expect_bad_request_then_close(&silkd, &[0, 0, 0, 4, 0xc1, 0xc1, 0xc1, 0xc1]).await;
    assert!(msg.contains("malformed"), "{msg}");
    still_serves(&mut silkd).await;
}

#[tokio::test]
async fn four_gib_length_prefix() {
    let mut silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let rss_before = silkd.rss_kib();
    let msg = expect_bad_request_then_close(&silkd, &[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).await;
    assert!(msg.contains("4294967295"), "{msg}");
    assert!(
        silkd.rss_kib() < rss_before + 4096,
        "silkd allocated for the prefix"
    );
    still_serves(&mut silkd).await;
}

#[tokio::test]
async fn valid_messagepack_that_is_not_a_message() {
    let mut silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    // {"type": "format_disk"}
    let mut body = vec![0x81, 0xa4];
    body.extend_from_slice(b"type");
    body.push(0xab);
    body.extend_from_slice(b"format_disk");
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    expect_bad_request_then_close(&silkd, &frame).await;
    // A response sent as a request.
    expect_bad_request_then_close(&silkd, &wire::encode_frame(Response::Done).unwrap()).await;
    // An exec with a field of the wrong type.
    let mut body = vec![0x82, 0xa4];
    body.extend_from_slice(b"type");
    body.push(0xa4);
    body.extend_from_slice(b"exec");
    body.push(0xa4);
    body.extend_from_slice(b"argv");
    body.push(0x2a);
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    expect_bad_request_then_close(&silkd, &frame).await;
    still_serves(&mut silkd).await;
}

#[tokio::test]
async fn request_in_the_middle_of_an_exec_kills_it_and_closes() {
    let mut silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    c.send(exec_req(&["sleep", "600"])).await;
    let pid = c.started().await;
    c.send(Request::Info).await;
    match c.recv().await {
        Response::Error {
            kind: ErrorKind::BadRequest,
            message,
        } => {
            assert!(message.contains("info"), "{message}")
        }
        other => panic!("expected bad_request, got {other:?}"),
    }
    assert!(c.recv_or_close().await.is_none(), "connection should close");
    wait_group_gone(pid, Duration::from_secs(3)).await;
    still_serves(&mut silkd).await;
}

#[tokio::test]
async fn stdin_outside_an_exec() {
    let mut silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let frame = wire::encode_frame(Request::Stdin { data: vec![1] }).unwrap();
    expect_bad_request_then_close(&silkd, &frame).await;
    // Stdin frames to an exec that did not ask for stdin.
    let mut c = silkd.connect().await;
    c.send(exec_req(&["sleep", "600"])).await;
    let pid = c.started().await;
    c.send(Request::Stdin { data: vec![1] }).await;
    assert!(matches!(
        c.recv().await,
        Response::Error {
            kind: ErrorKind::BadRequest,
            ..
        }
    ));
    wait_group_gone(pid, Duration::from_secs(3)).await;
    still_serves(&mut silkd).await;
}

#[tokio::test]
async fn truncated_frame_then_hangup() {
    let mut silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut raw = silkd.raw().await;
    raw.write_all(&[0, 0, 1, 0, 0x81]).await.unwrap();
    raw.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "silkd hung on a truncated frame");
    still_serves(&mut silkd).await;
}
