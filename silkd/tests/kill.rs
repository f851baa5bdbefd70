//! Kill semantics: whole groups, from another connection, on disconnect, unknown and
//! exited pids.

mod common;

use std::time::Duration;

use common::{exec_req, wait_group_gone, Silkd};
use wire::{ErrorKind, Request, Response};

#[tokio::test]
async fn kill_from_a_second_connection_takes_the_whole_group() {
    let silkd = Silkd::start();
    let mut runner = silkd.connect().await;
    runner
        .send(exec_req(&["sh", "-c", "sleep 600 & sleep 600; wait"]))
        .await;
    let pid = runner.started().await;
    // Let sh start both sleeps.
    common::wait_group_size(pid, 3).await;
    let mut other = silkd.connect().await;
    assert_eq!(
        other.rpc(Request::Kill { pid, signal: None }).await,
        Response::Done
    );
    let out = runner.collect(pid).await;
    assert_eq!(out.signal, Some(9));
    assert!(!out.timed_out);
    let left = wait_group_gone(pid, Duration::from_secs(5)).await;
    assert!(left.is_empty(), "left running: {left:?}");
}

#[tokio::test]
async fn kill_with_a_chosen_signal() {
    let silkd = Silkd::start();
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
    let silkd = Silkd::start();
    let mut c = silkd.connect().await;
    c.send(exec_req(&["sh", "-c", "sleep 600 & sleep 600; wait"]))
        .await;
    let pid = c.started().await;
    common::wait_group_size(pid, 3).await;
    drop(c);
    let left = wait_group_gone(pid, Duration::from_secs(3)).await;
    assert!(left.is_empty(), "left running after disconnect: {left:?}");
}

#[tokio::test]
async fn disconnect_kills_a_writing_child() {
    let silkd = Silkd::start();
    let mut c = silkd.connect().await;
    c.send(exec_req(&["yes"])).await;
    let pid = c.started().await;
    assert!(matches!(c.recv().await, Response::Stdout { .. }));
    drop(c);
    let left = wait_group_gone(pid, Duration::from_secs(3)).await;
    assert!(left.is_empty(), "left running after disconnect: {left:?}");
}

#[tokio::test]
async fn kill_of_an_unknown_pid_is_not_found() {
    let silkd = Silkd::start();
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
    let silkd = Silkd::start();
    let mut c = silkd.connect().await;
    // The leader exits at once; the background sleep stays in the leader's group. A
    // kill of the exited pid must not touch it: silkd never signals a group whose
    // leader it has reaped (that pid may already belong to someone else).
    let out = c
        .run(&["sh", "-c", "sleep 600 >/dev/null 2>&1 & exit 0"])
        .await;
    assert_eq!(out.code, Some(0));
    let survivors = common::group_members(out.pid);
    assert_eq!(survivors.len(), 1, "the background sleep: {survivors:?}");
    assert_eq!(
        c.rpc(Request::Kill {
            pid: out.pid,
            signal: None
        })
        .await,
        Response::Done
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        common::group_members(out.pid),
        survivors,
        "it was signalled"
    );
    for pid in survivors {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
}
