//! The VM-channel session layer over an in-memory duplex: stale bytes are skipped in
//! both directions, the nonce must match, and yamux carries many framed RPC streams.

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::Framed;
use wire::session::{guest_handshake, host_handshake, mux_client, mux_server, Hello};
use wire::{GuestCodec, HostCodec, Request, Response};

fn hello(n: u8) -> Hello {
    Hello {
        nonce: [n; 16],
        time_ns: 1_700_000_000_123_456_789,
        entropy: [7; 32],
        hostname: "sbx-abc.local".into(),
    }
}

#[tokio::test]
async fn handshake_skips_stale_bytes_both_ways() {
    let (mut host, mut guest) = tokio::io::duplex(1 << 16);
    // Leftovers of an earlier session in both directions, including a stale READY with
    // another nonce and a half-written HELLO.
    host.write_all(b"\x00\x00\x10\x00stale request bytes\nSILKD-HEL")
        .await
        .unwrap();
    guest
        .write_all(b"old output...\nSILKD-READY v1 nonce=")
        .await
        .unwrap();
    guest.write_all(hex32(9).as_bytes()).await.unwrap();
    guest.write_all(b"\n more junk").await.unwrap();
    let sent = hello(1);
    let guest_side = tokio::spawn(async move { guest_handshake(guest).await.unwrap() });
    let _host = host_handshake(host, &sent).await.unwrap();
    let (got, _guest) = guest_side.await.unwrap();
    assert_eq!(got, sent);
}

fn hex32(n: u8) -> String {
    format!("{n:02x}").repeat(16)
}

#[tokio::test]
async fn handshake_rejects_bad_fields() {
    let (mut host, mut guest) = tokio::io::duplex(4096);
    host.write_all(b"\nSILKD-HELLO v1 nonce=zz time_ns=1 entropy=00 hostname=x\n")
        .await
        .unwrap();
    let err = guest_handshake(&mut guest).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    let mut bad_host = hello(2).to_bytes();
    let at = bad_host.len() - 1;
    bad_host.splice(at..at, b"/etc".iter().copied());
    host.write_all(&bad_host).await.unwrap();
    let err = guest_handshake(&mut guest).await.unwrap_err();
    assert!(err.to_string().contains("hostname"), "{err}");
}

// Paused time: the host's 50 ms resend timer fires exactly as often as the sleep below
// says, whatever the machine's load.
#[tokio::test(start_paused = true)]
async fn a_swallowed_hello_is_resent_and_duplicates_never_reach_the_mux() {
    let (host, mut guest) = tokio::io::duplex(1 << 16);
    let host_side = tokio::spawn(async move { host_handshake(host, &hello(4)).await });
    // A stale session inside the guest eats the first HELLO whole.
    let mut first = vec![0u8; hello(4).to_bytes().len()];
    guest.read_exact(&mut first).await.unwrap();
    assert_eq!(first, hello(4).to_bytes());
    // Let a resend or two pile up before the guest starts listening again.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let (got, mut guest) = guest_handshake(guest).await.unwrap();
    assert_eq!(got, hello(4));
    let mut host = host_side.await.unwrap().unwrap();
    // After GO, the guest sees exactly what the host sends next: no leftover HELLO.
    host.write_all(b"\x00yamux").await.unwrap();
    let mut next = [0u8; 6];
    guest.read_exact(&mut next).await.unwrap();
    assert_eq!(&next, b"\x00yamux");
}

#[tokio::test]
async fn handshake_eof_is_an_error_not_a_hang() {
    let (host, mut guest) = tokio::io::duplex(64);
    drop(host);
    let err = guest_handshake(&mut guest).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    let mut buf = [0u8; 1];
    assert_eq!(guest.read(&mut buf).await.unwrap(), 0);
}

#[tokio::test]
async fn mux_carries_concurrent_rpc_streams() {
    let (host, guest) = tokio::io::duplex(1 << 16);
    let server = tokio::spawn(async move {
        let (_hello, guest) = guest_handshake(guest).await.unwrap();
        mux_server(guest, |stream| {
            tokio::spawn(async move {
                // Echo server speaking frames: answers each Stdin with Stdout.
                let mut f = Framed::new(stream, GuestCodec::new());
                while let Some(Ok(req)) = f.next().await {
                    let Request::Stdin { data } = req else { break };
                    f.send(Response::Stdout { data }).await.unwrap();
                }
            });
        })
        .await
    });
    let host = host_handshake(host, &hello(3)).await.unwrap();
    let (opener, driver) = mux_client(host);
    let driver = tokio::spawn(driver);
    let mut tasks = Vec::new();
    for i in 0..20u8 {
        let opener = opener.clone();
        tasks.push(tokio::spawn(async move {
            let mut f = Framed::new(opener.open().await.unwrap(), HostCodec::new());
            let data = vec![i; 100_000];
            f.send(Request::Stdin { data: data.clone() }).await.unwrap();
            assert_eq!(f.next().await.unwrap().unwrap(), Response::Stdout { data });
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    drop(opener);
    driver.abort();
    let _ = driver.await;
    // The guest sees the session end once the host side is gone.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), server).await;
    assert!(ended.is_ok(), "guest mux did not notice the host leaving");
}

async fn ping(f: &mut Framed<wire::session::MuxStream, HostCodec>, n: u8) {
    let data = vec![n; 10];
    f.send(Request::Stdin { data: data.clone() }).await.unwrap();
    assert_eq!(f.next().await.unwrap().unwrap(), Response::Stdout { data });
}

#[tokio::test]
async fn exhausting_streams_fails_one_open_and_keeps_the_channel() {
    use wire::session::HOST_STREAMS;
    let (host, guest) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        let (_hello, guest) = guest_handshake(guest).await.unwrap();
        mux_server(guest, |stream| {
            tokio::spawn(async move {
                let mut f = Framed::new(stream, GuestCodec::new());
                while let Some(Ok(Request::Stdin { data })) = f.next().await {
                    f.send(Response::Stdout { data }).await.unwrap();
                }
            });
        })
        .await
    });
    let host = host_handshake(host, &hello(5)).await.unwrap();
    let (opener, driver) = mux_client(host);
    let driver = tokio::spawn(driver);
    // Every stream answered once, so the guest has seen (and acknowledged) each.
    let mut held = Vec::new();
    for i in 0..HOST_STREAMS {
        let mut f = Framed::new(opener.open().await.unwrap(), HostCodec::new());
        ping(&mut f, i as u8).await;
        held.push(f);
    }
    let err = opener.open().await.unwrap_err();
    assert!(err.to_string().contains("streams are open"), "{err}");
    // The channel is up: every open stream still answers, and the driver runs on.
    assert!(!opener.is_closed());
    for (i, f) in held.iter_mut().enumerate().step_by(51) {
        ping(f, i as u8).await;
    }
    // Closing one makes room for a new one.
    drop(held.pop());
    let mut fresh = Framed::new(opener.open().await.unwrap(), HostCodec::new());
    ping(&mut fresh, 7).await;
    assert!(!opener.is_closed());
    driver.abort();
}

/// A stream split across two tasks (silkd: requests read in one, output written in the
/// other) must keep flowing while the reading task keeps re-polling its half: both
/// halves share yamux's one command sender, whose wake-up must reach the writer.
#[tokio::test]
async fn a_split_stream_keeps_writing_while_its_reader_polls() {
    const TOTAL: usize = 2 << 20;
    // A slow channel (a TCG guest's serial port) under a host that reads at once: the
    // guest's yamux queue stays full while its send window stays open.
    let (host, host_end) = tokio::io::duplex(4096);
    let (guest_end, guest) = tokio::io::duplex(4096);
    let (mut from_host, mut to_host) = tokio::io::split(host_end);
    let (mut from_guest, mut to_guest) = tokio::io::split(guest_end);
    tokio::spawn(async move { tokio::io::copy(&mut from_host, &mut to_guest).await });
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        loop {
            let n = from_guest.read(&mut buf).await.unwrap();
            if n == 0 || to_host.write_all(&buf[..n]).await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_micros(100)).await;
        }
    });
    tokio::spawn(async move {
        let (_hello, guest) = guest_handshake(guest).await.unwrap();
        mux_server(guest, |stream| {
            let (mut rd, mut wr) = tokio::io::split(stream);
            tokio::spawn(async move {
                // The reader task wakes often (as silkd's exec loop does on an exit, a
                // pump, a timer) and polls its half each time.
                let mut buf = [0u8; 64];
                loop {
                    tokio::select! {
                        r = rd.read(&mut buf) => if r.map_or(true, |n| n == 0) { return },
                        () = tokio::task::yield_now() => {}
                    }
                }
            });
            tokio::spawn(async move {
                let chunk = vec![5u8; 64 * 1024];
                for _ in 0..TOTAL / chunk.len() {
                    wr.write_all(&chunk).await.unwrap();
                }
                wr.shutdown().await.unwrap();
            });
        })
        .await
    });
    let host = host_handshake(host, &hello(4)).await.unwrap();
    let (opener, driver) = mux_client(host);
    let driver = tokio::spawn(driver);
    let mut s = opener.open().await.unwrap();
    s.write_all(b"x").await.unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let read_all = async {
        loop {
            match s.read(&mut buf).await.unwrap() {
                0 => break,
                n => got += n,
            }
        }
    };
    let done = tokio::time::timeout(std::time::Duration::from_secs(20), read_all).await;
    assert!(
        done.is_ok(),
        "the stream stalled after {got} of {TOTAL} bytes"
    );
    assert_eq!(got, TOTAL);
    driver.abort();
}
