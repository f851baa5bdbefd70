//! Detached commands through a real silkd over real Unix sockets: surviving the client,
//! `Procs` rows, attaching from a second connection (retained output, then live), stdin
//! through an attach, kill, the ring dropping its oldest bytes and counting them, and
//! what is refused.

use std::time::Duration;

use testkit::procs::wait_group_gone;
use testkit::silkd::Silkd;
use testkit::wait::wait_until;
use wire::{ErrorKind, ProcInfo, ProcState, Request, Response};

const COUNTER: &str = "i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done";

fn detached(argv: &[&str], stdin: bool) -> Request {
    Request::Exec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        env: None,
        stdin,
        timeout_ms: None,
        user: None,
        pty: None,
        detach: true,
    }
}

async fn row(c: &mut testkit::silkd::Client, pid: u32) -> ProcInfo {
    match c.rpc(Request::Ps).await {
        Response::Procs { procs } => procs.into_iter().find(|p| p.pid == pid).expect("listed"),
        other => panic!("{other:?}"),
    }
}

/// Reads output frames until the text seen contains `needle`.
async fn read_until(c: &mut testkit::silkd::Client, needle: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(needle) {
        match c.recv().await {
            Response::Stdout { data } => seen.push_str(&String::from_utf8_lossy(&data)),
            other => panic!("waiting for {needle:?} after {seen:?}: {other:?}"),
        }
    }
    seen
}

#[tokio::test]
async fn a_detached_counter_survives_is_listed_attached_and_killed() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut first = silkd.connect().await;
    first.send(detached(&["sh", "-c", COUNTER], false)).await;
    let pid = first.started().await;
    read_until(&mut first, "\n3\n").await;
    drop(first);

    // The client left; the command runs on, and is listed with its start and state.
    let mut c = silkd.connect().await;
    let info = row(&mut c, pid).await;
    assert_eq!(info.state, ProcState::Running);
    assert!(info.detached);
    assert_eq!(info.argv, ["sh", "-c", COUNTER]);
    assert_eq!(info.dropped, Some(0));
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(info.started_ms.unwrap() <= now_ms, "{info:?}");
    let seen = read_until_numbers_beyond(&mut silkd.connect().await, pid, 10).await;
    // Retained output starts at the first line: 0, 1, 2, ... with no gap, then live.
    let numbers: Vec<u64> = seen.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(numbers[..5], [0, 1, 2, 3, 4]);
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");

    // Kill from one connection; an attached one sees the exit.
    let mut attached = silkd.connect().await;
    attached.send(Request::Attach { pid }).await;
    assert_eq!(attached.started().await, pid);
    assert_eq!(
        c.rpc(Request::Kill { pid, signal: None }).await,
        Response::Done
    );
    let out = attached.collect(pid).await;
    assert_eq!(out.signal, Some(9));
    wait_group_gone(pid, Duration::from_secs(10)).await;
    let info = row(&mut c, pid).await;
    assert_eq!((info.state, info.signal), (ProcState::Exited, Some(9)));
    // An exited detached command can still be attached: its output, then its exit.
    c.send(Request::Attach { pid }).await;
    let again = c.started().await;
    let out = c.collect(again).await;
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("0\n1\n2\n"));
    assert_eq!(out.signal, Some(9));
}

/// Attaches and reads until a number past `beyond` arrived (live output); returns it all.
async fn read_until_numbers_beyond(
    c: &mut testkit::silkd::Client,
    pid: u32,
    beyond: u64,
) -> String {
    c.send(Request::Attach { pid }).await;
    assert_eq!(c.started().await, pid);
    let mut seen = String::new();
    loop {
        match c.recv().await {
            Response::Stdout { data } => seen.push_str(&String::from_utf8_lossy(&data)),
            other => panic!("{other:?}"),
        }
        let complete = &seen[..seen.rfind('\n').map_or(0, |i| i + 1)];
        if complete
            .lines()
            .last()
            .and_then(|l| l.parse::<u64>().ok())
            .is_some_and(|n| n > beyond)
        {
            return complete.to_string();
        }
    }
}

#[tokio::test]
async fn the_ring_drops_the_oldest_and_counts_stdin_passes_through_an_attach() {
    let silkd = Silkd::start_with(env!("CARGO_BIN_EXE_silkd"), &["--detach-ring", "1000"]).await;
    let mut c = silkd.connect().await;
    // 5000 bytes into a 1000-byte ring, then wait on stdin.
    c.send(detached(
        &[
            "sh",
            "-c",
            "head -c 5000 /dev/zero | tr '\\0' a; echo; echo end; cat",
        ],
        true,
    ))
    .await;
    let pid = c.started().await;
    drop(c);
    let mut c = silkd.connect().await;
    // 5000 a's + "\nend\n" = 5005 bytes; the ring keeps the last 1000 and counts the
    // rest (waited for: the output may still be arriving).
    wait_until(Duration::from_secs(10), "4005 bytes dropped", async || {
        let info = row(&mut c, pid).await;
        if info.dropped == Some(4005) {
            Ok(())
        } else {
            Err(info)
        }
    })
    .await;
    let mut a = silkd.connect().await;
    a.send(Request::Attach { pid }).await;
    a.started().await;
    let seen = read_until(&mut a, "end\n").await;
    assert_eq!(seen.len(), 1000);
    assert!(seen.ends_with("aaa\nend\n"));
    // Stdin from the attached client reaches `cat`, whose output comes back live.
    a.send(Request::Stdin {
        data: b"typed\n".to_vec(),
    })
    .await;
    read_until(&mut a, "typed\n").await;
    a.send(Request::StdinClose).await;
    let out = a.collect(pid).await;
    assert_eq!(out.code, Some(0));
}

#[tokio::test]
async fn attach_refusals() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let kind = |r: Response| match r {
        Response::Error { kind, .. } => kind,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        kind(c.rpc(Request::Attach { pid: 999_999 }).await),
        ErrorKind::NotFound
    );
    // A plain command cannot be attached (its output belongs to its one client).
    let out = c.run(&["true"]).await;
    assert_eq!(
        kind(c.rpc(Request::Attach { pid: out.pid }).await),
        ErrorKind::BadRequest
    );
    // A timeout makes no sense for a command that outlives its caller.
    let mut req = detached(&["sleep", "600"], false);
    if let Request::Exec { timeout_ms, .. } = &mut req {
        *timeout_ms = Some(1000);
    }
    assert_eq!(kind(c.rpc(req).await), ErrorKind::BadRequest);
    // Another verb during an attach is a protocol fault; the command runs on.
    c.send(detached(&["sleep", "600"], false)).await;
    let pid = c.started().await;
    c.send(Request::Ps).await;
    assert_eq!(kind(c.recv().await), ErrorKind::BadRequest);
    assert!(c.recv_or_close().await.is_none());
    let mut c = silkd.connect().await;
    assert_eq!(row(&mut c, pid).await.state, ProcState::Running);
    assert_eq!(
        c.rpc(Request::Kill { pid, signal: None }).await,
        Response::Done
    );
    wait_group_gone(pid, Duration::from_secs(10)).await;
}
