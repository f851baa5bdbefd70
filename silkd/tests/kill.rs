//! Kill semantics: whole groups, from another connection, on disconnect, unknown and
//! exited pids.

use std::time::Duration;

use testkit::procs::{group_members, signalled, wait_group_gone, wait_group_size};
use testkit::silkd::{exec_req, Silkd};
use wire::{ErrorKind, Request, Response};

#[tokio::test]
async fn kill_from_a_second_connection_takes_the_whole_group() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut runner = silkd.connect().await;
    runner
        .send(exec_req(&["sh", "-c", "sleep 600 & sleep 600; wait"]))
        .await;
    let pid = runner.started().await;
    // Let sh start both sleeps.
    wait_group_size(pid, 3).await;
    let mut other = silkd.connect().await;
    assert_eq!(
        other.rpc(Request::Kill { pid, signal: None }).await,
        Response::Done
    );
    let out = runner.collect(pid).await;
    assert_eq!(out.signal, Some(9));
    assert!(!out.timed_out);
    wait_group_gone(pid, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn kill_with_a_chosen_signal() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut runner = silkd.connect().await;
    runner.send(exec_req(&["sleep", "600"])).await;
    let pid = runner.started().await;
    let mut other = silkd.connect().await;
    let answer = other
        .rpc(Request::Kill {
            pid,
            signal: Some(15),
        })
        .await;
    assert_eq!(answer, Response::Done);
    assert_eq!(runner.collect(pid).await.signal, Some(15));
    let bad = other
        .rpc(Request::Kill {
            pid,
            signal: Some(999),
        })
        .await;
    assert!(
        matches!(
            bad,
            Response::Error {
                kind: ErrorKind::BadRequest,
                ..
            }
        ),
        "{bad:?}"
    );
}

#[tokio::test]
async fn disconnect_kills_a_silent_child() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    c.send(exec_req(&["sh", "-c", "sleep 600 & sleep 600; wait"]))
        .await;
    let pid = c.started().await;
    wait_group_size(pid, 3).await;
    drop(c);
    wait_group_gone(pid, Duration::from_secs(3)).await;
}

#[tokio::test]
async fn disconnect_kills_a_writing_child() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    c.send(exec_req(&["yes"])).await;
    let pid = c.started().await;
    assert!(matches!(c.recv().await, Response::Stdout { .. }));
    drop(c);
    wait_group_gone(pid, Duration::from_secs(3)).await;
}

#[tokio::test]
async fn kill_of_an_unknown_pid_is_not_found() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    match c
        .rpc(Request::Kill {
            pid: 999_999,
            signal: None,
        })
        .await
    {
        Response::Error {
            kind: ErrorKind::NotFound,
            message,
        } => {
            assert!(message.contains("999999"), "{message}")
        }
        other => panic!("expected not_found, got {other:?}"),
    }
}

#[tokio::test]
async fn kill_of_an_exited_pid_is_done_and_signals_nobody() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    // The leader exits at once; the background sleep stays in the leader's group. A
    // kill of the exited pid must not touch it: silkd never signals a group whose
    // leader it has reaped (that pid may already belong to someone else).
    let out = c
        .run(&["sh", "-c", "sleep 600 >/dev/null 2>&1 & exit 0"])
        .await;
    assert_eq!(out.code, Some(0));
    let survivors = group_members(out.pid);
    assert_eq!(survivors.len(), 1, "the background sleep: {survivors:?}");
    assert_eq!(
        c.rpc(Request::Kill {
            pid: out.pid,
            signal: None
        })
        .await,
        Response::Done
    );
    // silkd answers a kill only after sending the signal, and a sent signal shows at once
    // (pending, exiting or dead): no waiting needed to see that none was sent.
    for &pid in &survivors {
        assert!(!signalled(pid), "{pid} was signalled");
    }
    assert_eq!(group_members(out.pid), survivors, "it was signalled");
    for pid in survivors {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
}
