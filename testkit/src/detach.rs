//! Detached commands seen through the SDK, shared by the process-engine and VM tests: the
//! issue's counter outliving its client and re-attached, and a ring of a configured size
//! keeping only the newest output.

use std::time::Duration;

use sandbox_sdk::{Command, Event, ExitStatus, ProcState, Process, Sandbox};

use crate::sdk::assert_nothing_runs;
use crate::wait::wait_until;

/// Prints 0, 1, 2... ten times a second, forever.
pub const COUNTER: &str = "i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done";

/// Numbers read from `p` until one past `beyond` arrived (complete lines only).
pub async fn numbers_until(p: &mut Process, beyond: u64) -> Vec<u64> {
    let mut text = String::new();
    loop {
        match p.next_event().await.unwrap() {
            Some(Event::Stdout(b)) => text.push_str(&String::from_utf8_lossy(&b)),
            other => panic!("after {text:?}: {other:?}"),
        }
        let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        let numbers: Vec<u64> = complete.lines().map(|l| l.parse().unwrap()).collect();
        if numbers.last().is_some_and(|n| *n > beyond) {
            return numbers;
        }
    }
}

/// The counter, detached: its first client reads a few lines and leaves; it still runs,
/// `processes()` lists it (argv, start time, detached); a second client attaches and sees
/// the retained output from 0 then live lines without a gap; killing it ends it and
/// nothing is left running. Returns nothing: it asserts.
pub async fn counter_survives_is_listed_attached_and_killed(sandbox: &Sandbox) {
    let cmd = Command::new("sh").args(["-c", COUNTER]).detach(true);
    let mut first = sandbox.spawn(&cmd).await.unwrap();
    let pid = first.pid();
    numbers_until(&mut first, 2).await;
    drop(first);

    let row = sandbox
        .processes()
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.pid == pid)
        .expect("listed");
    assert_eq!(row.state, ProcState::Running, "survived its client");
    assert!(row.detached && row.started_ms.is_some(), "{row:?}");
    assert_eq!(row.argv, ["sh", "-c", COUNTER]);

    let mut second = sandbox.attach(pid).await.unwrap();
    let seen = numbers_until(&mut second, 20).await;
    assert_eq!(seen[..3], [0, 1, 2], "retained output first");
    assert!(
        seen.windows(2).all(|w| w[1] == w[0] + 1),
        "then live: {seen:?}"
    );
    second.kill().await.unwrap();
    assert_eq!(second.wait().await.unwrap(), ExitStatus::Signal(9));
    assert_nothing_runs(sandbox).await;
}

/// What `seq 1 3000; echo end` prints: 13,897 bytes.
fn seq_output() -> String {
    let mut s: String = (1..=3000).map(|i| format!("{i}\n")).collect();
    s.push_str("end\n");
    s
}

/// In a sandbox whose template sets `detach_ring_bytes = ring` (under 13,897): a detached
/// command prints more than the ring, then stays quiet; `processes()` reports exactly the
/// bytes dropped, and an attach receives exactly the newest `ring` bytes, in order. The
/// command is killed afterwards.
pub async fn ring_keeps_the_newest_bytes(sandbox: &Sandbox, ring: usize, within: Duration) {
    let full = seq_output();
    assert!(
        ring < full.len(),
        "a ring of {ring} holds all of the output"
    );
    let cmd = Command::new("sh")
        .args(["-c", "seq 1 3000; echo end; exec sleep 600"])
        .detach(true);
    let pid = sandbox.spawn(&cmd).await.unwrap().pid();
    let dropped = (full.len() - ring) as u64;
    wait_until(within, "the ring to drop all but its size", async || {
        let ps = sandbox.processes().await.unwrap();
        let row = ps.into_iter().find(|p| p.pid == pid).expect("listed");
        (row.dropped == Some(dropped)).then_some(()).ok_or(row)
    })
    .await;
    let mut attached = sandbox.attach(pid).await.unwrap();
    let mut seen = String::new();
    while !seen.ends_with("end\n") {
        match attached.next_event().await.unwrap() {
            Some(Event::Stdout(b)) => seen.push_str(&String::from_utf8_lossy(&b)),
            other => panic!("after {} bytes: {other:?}", seen.len()),
        }
    }
    assert_eq!(seen.len(), ring, "exactly the ring's size is retained");
    assert!(
        seen == full[full.len() - ring..],
        "not the newest bytes: {seen:?}"
    );
    attached.kill().await.unwrap();
    assert_eq!(attached.wait().await.unwrap(), ExitStatus::Signal(9));
}
