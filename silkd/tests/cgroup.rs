//! Per-command cgroups (`--cgroup`): a kill, a hang-up or a kill after the leader exited
//! takes every process the command started, including ones that left its process group
//! with `setsid`; without `--cgroup` the same escapee survives (the control). Runs as root
//! with a fresh directory under the host's cgroup2 mount.

use std::time::Duration;

use testkit::cgroup2::Cgroup2Dir;
use testkit::procs::{assert_gone, marker, procs_with};
use testkit::silkd::{exec_req, Silkd};
use testkit::wait_until;
use wire::{Request, Response};

async fn with_cgroup(cg: &Cgroup2Dir) -> Silkd {
    let dir = cg.path().to_str().unwrap();
    Silkd::start_with(env!("CARGO_BIN_EXE_silkd"), &["--cgroup", dir]).await
}

/// `sh -c 'setsid sleep M & sleep M'`: two sleeps, one in a new session and group.
fn escaping(m: &str) -> Request {
    exec_req(&["sh", "-c", &format!("setsid sleep {m} & sleep {m}")])
}

async fn wait_count(m: &str, n: usize) {
    let what = format!("{n} processes with {m:?}");
    wait_until(Duration::from_secs(10), &what, async || {
        let found = procs_with(m);
        if found.len() >= n {
            Ok(())
        } else {
            Err(found)
        }
    })
    .await
}

/// Waits until silkd has removed every command's cgroup (it does once they are empty).
async fn wait_cgroups_removed(silkd: &Silkd, cg: &Cgroup2Dir) {
    wait_until(
        Duration::from_secs(5),
        "every exec cgroup removed",
        async || {
            // Ps runs silkd's collection of emptied cgroups.
            let _ = silkd.connect().await.rpc(Request::Ps).await;
            let left = cg.children();
            if left.is_empty() {
                Ok(())
            } else {
                Err(left)
            }
        },
    )
    .await
}

#[tokio::test]
async fn kill_takes_processes_that_called_setsid() {
    let cg = Cgroup2Dir::fresh("silkd-kill");
    let silkd = with_cgroup(&cg).await;
    let m = marker(1);
    let mut runner = silkd.connect().await;
    runner.send(escaping(&m)).await;
    let pid = runner.started().await;
    wait_count(&m, 2).await;
    // Both sleeps (and sh) are in the command's cgroup, the setsid one too.
    let escapees: Vec<u32> = procs_with(&m);
    assert!(
        escapees.iter().all(|p| cg.pids().contains(p)),
        "{escapees:?} vs {:?}",
        cg.pids()
    );
    let mut other = silkd.connect().await;
    assert_eq!(
        other.rpc(Request::Kill { pid, signal: None }).await,
        Response::Done
    );
    assert_eq!(runner.collect(pid).await.signal, Some(9));
    assert_gone(&m).await;
    wait_cgroups_removed(&silkd, &cg).await;
}

#[tokio::test]
async fn hang_up_takes_processes_that_called_setsid() {
    let cg = Cgroup2Dir::fresh("silkd-hangup");
    let silkd = with_cgroup(&cg).await;
    let m = marker(2);
    let mut runner = silkd.connect().await;
    runner.send(escaping(&m)).await;
    runner.started().await;
    wait_count(&m, 2).await;
    drop(runner);
    assert_gone(&m).await;
    wait_cgroups_removed(&silkd, &cg).await;
}

#[tokio::test]
async fn timeout_takes_processes_that_called_setsid() {
    let cg = Cgroup2Dir::fresh("silkd-timeout");
    let silkd = with_cgroup(&cg).await;
    let m = marker(3);
    let mut c = silkd.connect().await;
    let out = c
        .exec(Request::Exec {
            detach: false,
            pty: None,
            argv: ["sh", "-c", &format!("setsid sleep {m} & sleep {m}")]
                .map(String::from)
                .to_vec(),
            cwd: None,
            env: None,
            stdin: false,
            timeout_ms: Some(500),
            user: None,
        })
        .await;
    assert!(out.timed_out);
    assert_gone(&m).await;
}

#[tokio::test]
async fn kill_after_the_leader_exited_takes_what_it_left() {
    let cg = Cgroup2Dir::fresh("silkd-leftover");
    let silkd = with_cgroup(&cg).await;
    let m = marker(4);
    let mut c = silkd.connect().await;
    let out = c
        .run(&[
            "sh",
            "-c",
            &format!("setsid sleep {m} >/dev/null 2>&1 & exit 0"),
        ])
        .await;
    assert_eq!(out.code, Some(0));
    // A normal exit leaves background processes running, as without cgroups.
    wait_count(&m, 1).await;
    assert_eq!(cg.children().len(), 1, "the leftover keeps its cgroup");
    // The leader is reaped, so its pid is never signalled; the cgroup names no pid.
    assert_eq!(
        c.rpc(Request::Kill {
            pid: out.pid,
            signal: None
        })
        .await,
        Response::Done
    );
    assert_gone(&m).await;
    wait_cgroups_removed(&silkd, &cg).await;
}

#[tokio::test]
async fn shutdown_takes_processes_that_called_setsid() {
    let cg = Cgroup2Dir::fresh("silkd-sigterm");
    let mut silkd = with_cgroup(&cg).await;
    let m = marker(5);
    let mut runner = silkd.connect().await;
    runner.send(escaping(&m)).await;
    runner.started().await;
    wait_count(&m, 2).await;
    silkd.terminate(Duration::from_secs(10));
    assert_gone(&m).await;
}

/// The control: without `--cgroup` the kill reaches the process group only, and the
/// setsid sleep survives it. This is what the cgroup is for.
#[tokio::test]
async fn without_a_cgroup_setsid_escapes_the_kill() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let m = marker(6);
    let mut runner = silkd.connect().await;
    runner.send(escaping(&m)).await;
    let pid = runner.started().await;
    wait_count(&m, 2).await;
    // `setsid` leaves the group only once it has called setsid(2): a Kill before that
    // still reaches it (a race the test must not run under load).
    wait_until(
        Duration::from_secs(10),
        "the escapee out of the group",
        async || {
            let groups: Vec<_> = procs_with(&m)
                .into_iter()
                .filter_map(|p| testkit::procs::stat(p).map(|s| s.pgrp))
                .collect();
            if groups.iter().any(|g| *g != pid) {
                Ok(())
            } else {
                Err(groups)
            }
        },
    )
    .await;
    let mut other = silkd.connect().await;
    assert_eq!(
        other.rpc(Request::Kill { pid, signal: None }).await,
        Response::Done
    );
    assert_eq!(runner.collect(pid).await.signal, Some(9));
    // The group's sleep dies; the setsid one is in no group silkd knows.
    wait_until(
        Duration::from_secs(5),
        "only the escapee left",
        async || {
            let left = procs_with(&m);
            if left.len() == 1 {
                Ok(left)
            } else {
                Err(left)
            }
        },
    )
    .await;
    testkit::guard::sweep(&m);
    assert_gone(&m).await;
}

#[tokio::test]
async fn an_unusable_cgroup_dir_stops_silkd_with_a_reason() {
    let not_cgroup = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_silkd"))
        .args(["--listen", "unix:/nonexistent/silkd.sock", "--cgroup"])
        .arg(not_cgroup.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a cgroup2 directory"), "{stderr}");
}

/// The fallback for kernels without `cgroup.kill` (freeze, SIGKILL every listed pid until
/// none is left), run directly on a cgroup holding a setsid escapee.
#[tokio::test]
async fn the_fallback_kill_empties_a_cgroup_too() {
    let cg = Cgroup2Dir::fresh("silkd-fallback");
    let m = marker(7);
    // The shell moves itself in before it forks anything: nothing starts outside.
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec sh -c 'setsid sleep {m} & sleep {m}'",
        cg.path().display()
    );
    let mut child = std::process::Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .unwrap();
    wait_count(&m, 2).await;
    silkd::proc::cgroup::kill_listed(cg.path()).unwrap();
    assert!(cg.pids().is_empty(), "{:?}", cg.pids());
    let _ = child.wait();
    assert_gone(&m).await;
}
