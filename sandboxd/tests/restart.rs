//! The real `sandboxd` binary restarted on the same `data_dir` (process engine): after a
//! `kill -9`, during 50 execs, or a SIGTERM with `on_stop = "keep"`, the next start
//! re-adopts every recorded sandbox whose guest is alive (same id, same token, its files
//! and processes, exec and relay), drops the one whose guest died and the expired one,
//! destroys guests no record owns, and never signals a process that is not provably its
//! own. Hostile: a corrupt database is a clear start error.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use testkit::leftovers::Census;
use testkit::procs::{self, marker, procs_with, wait_running};
use testkit::restart;
use testkit::setup::uid_range;
use testkit::{wait_until, ChildGuard, DaemonProcess, Setup, ROOT};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxd");
/// The sandbox's file and every command line running in it.
const LIST: &str = "cat /tmp/kept; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done";

struct Node {
    tmp: tempfile::TempDir,
    config: String,
}

impl Node {
    fn new(on_stop: &'static str) -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let setup = Setup {
            on_stop,
            max_claims: 12,
            tenant_a_max_claims: 4,
            max_in_flight: 64,
            exec_extra: "max_in_flight_per_sandbox = 16".into(),
            ..Setup::default()
        };
        let config = setup.toml(&tmp.path().join("data"), "127.0.0.1:0");
        Node { tmp, config }
    }

    fn data(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    async fn start(&self) -> DaemonProcess {
        DaemonProcess::start(BIN, self.tmp.path(), &self.config).await
    }
}

/// Writes a file and starts a detached `sleep` in the sandbox; returns the sleep's marker.
async fn leave_traces(d: &DaemonProcess, id: &str, token: &str, n: u32) -> String {
    let m = marker(n);
    let script =
        format!("echo kept-{id} > /tmp/kept && (setsid sleep {m} </dev/null >/dev/null 2>&1 &)");
    let r = d
        .exec(id, token, json!({"argv": ["sh", "-c", script]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_running(&m).await;
    m
}

/// The sandbox answers with its own id and token: exec sees its file and its process,
/// and the relay answers `Info`.
async fn still_there(d: &DaemonProcess, id: &str, token: &str, m: &str) {
    let r = d.exec(id, token, json!({"argv": ["sh", "-c", LIST]})).await;
    assert_eq!(r.status, 200, "{id}: {}", r.text());
    let stdout = r.json()["stdout"].as_str().unwrap().to_string();
    assert!(stdout.contains(&format!("kept-{id}")), "{id}: {stdout}");
    assert!(stdout.contains(m), "{id}: no `sleep {m}` in {stdout}");
    assert!(
        restart::relay_info(d.addr(), id, token).await,
        "{id}: relay"
    );
}

fn all_dead(pids: &[u32]) -> Result<(), Vec<u32>> {
    testkit::wait::empty(pids.iter().copied().filter(|&p| procs::alive(p)).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_then_restart_readopts_drops_reaps_and_sweeps() {
    let node = Node::new("keep");
    let data = node.data();
    let mut first = node.start().await;
    first
        .wait_pool(Duration::from_secs(10), "1 warm", |p| p["warm"] == 1)
        .await;
    let census = Census::new(&data, uid_range(&data));
    let before = census.count();

    let mut kept = Vec::new();
    for n in 0..3 {
        let (id, token) = first.claim().await;
        let m = leave_traces(&first, &id, &token, 40 + n).await;
        kept.push((id, token, m));
    }
    let (died, died_token) = first.claim().await;
    let (expired, _) = first.claim().await;
    let (orphan, _) = first.claim().await;
    assert_eq!(restart::recorded_ids(&data).len(), 6);
    let died_pids = restart::guest_pids(&data, &died);
    let expired_pids = restart::guest_pids(&data, &expired);
    let orphan_pids = restart::guest_pids(&data, &orphan);

    assert!(!first.process().kill().success());
    // While sandboxd is down: one guest dies, one claim's deadline passes, one record is
    // lost; every guest is still running (none died with the daemon).
    for p in died_pids.iter().chain(&expired_pids).chain(&orphan_pids) {
        assert!(procs::alive(*p), "pid {p} died with sandboxd");
    }
    for p in &died_pids {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*p as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    }
    restart::expire(&data, &expired);
    restart::forget(&data, &orphan);

    let second = node.start().await;
    for (id, token, m) in &kept {
        still_there(&second, id, token, m).await;
    }
    // Gone, expired and unowned guests are destroyed, their claims dropped and logged.
    wait_until(Duration::from_secs(5), "dropped guests dead", async || {
        all_dead(&[died_pids.clone(), expired_pids.clone(), orphan_pids.clone()].concat())
    })
    .await;
    for id in [&died, &expired, &orphan] {
        let r = second
            .call("GET", &format!("/v1/sandboxes/{id}"), Some(ROOT), None)
            .await;
        assert_eq!(r.status, 404, "{id}: {}", r.text());
    }
    let r = second
        .exec(&died, &died_token, json!({"argv": ["true"]}))
        .await;
    assert_eq!(
        r.status,
        401,
        "a dropped claim's token is unknown: {}",
        r.text()
    );
    let log = second.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("dropping claim: its sandbox is gone") && l.contains(&died)),
        "{log}"
    );
    assert!(
        log.contains("claim expired while sandboxd was down"),
        "{log}"
    );
    let mut ids: Vec<String> = kept.iter().map(|k| k.0.clone()).collect();
    ids.sort();
    assert_eq!(restart::recorded_ids(&data), ids);

    // Released, the re-adopted sandboxes take everything with them: the node is back to
    // its one warm guest.
    for (id, _, m) in &kept {
        let path = format!("/v1/sandboxes/{id}/release");
        let r = second.call("POST", &path, Some(ROOT), None).await;
        assert_eq!(r.status, 204, "{}", r.text());
        testkit::procs::assert_gone(m).await;
    }
    second
        .wait_pool(Duration::from_secs(10), "1 warm", |p| p["warm"] == 1)
        .await;
    census.wait_back_to(&before).await;
    assert!(restart::recorded_ids(&data).is_empty());
    drop(second);
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_50_execs_loses_no_answer_and_no_sandbox() {
    let node = Node::new("keep");
    let mut first = node.start().await;
    let mut boxes = Vec::new();
    for _ in 0..5 {
        boxes.push(first.claim().await);
    }
    let api = testkit::Api::clone(&first);
    let mut execs = tokio::task::JoinSet::new();
    for i in 0..50u32 {
        let (id, token) = boxes[i as usize % boxes.len()].clone();
        let api = api.clone();
        // Spread over ~2 s so the kill lands with some answered and some in flight.
        let script = format!("sleep 0.{:03}; echo exec-marker-{i}", i * 40);
        execs.spawn(async move {
            let r = api
                .exec(&id, &token, json!({"argv": ["sh", "-c", script]}))
                .await;
            (
                i,
                r.status.as_u16(),
                r.json()["stdout"].as_str().map(str::to_string),
            )
        });
    }
    // Kill once a few have answered; the rest are cut off.
    let mut answered = Vec::new();
    while answered.len() < 10 {
        match execs.join_next().await.unwrap() {
            Ok(a) => answered.push(a),
            Err(e) => panic!("an exec failed before the kill: {e}"),
        }
    }
    assert!(!first.process().kill().success());
    while let Some(r) = execs.join_next().await {
        // A request cut off by the kill panics inside its task (connection closed).
        if let Ok(a) = r {
            answered.push(a);
        }
    }
    for (i, status, stdout) in &answered {
        if *status == 200 {
            assert_eq!(
                stdout.as_deref(),
                Some(format!("exec-marker-{i}\n").as_str())
            );
        }
    }
    assert!(answered.iter().filter(|a| a.1 == 200).count() >= 10);
    let second = node.start().await;
    for (id, token) in &boxes {
        let r = second.exec(id, token, json!({"argv": ["echo", id]})).await;
        assert_eq!(r.status, 200, "{id} not back: {}", r.text());
        assert_eq!(r.json()["stdout"], format!("{id}\n"));
    }
    drop(second);
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_claims_for_the_next_start_and_destroy_leaves_nothing() {
    let node = Node::new("keep");
    let data = node.data();
    let mut first = node.start().await;
    let mut kept = Vec::new();
    for n in 0..2 {
        let (id, token) = first.claim().await;
        let m = leave_traces(&first, &id, &token, 50 + n).await;
        kept.push((id, token, m));
    }
    let status = first.process().terminate(Duration::from_secs(15));
    assert!(status.success(), "{status}");
    for (_, _, m) in &kept {
        assert!(!procs_with(m).is_empty(), "{m} died with a keep stop");
    }
    // Restarted with on_stop = "destroy": it re-adopts, then its stop destroys all.
    let destroying = Node {
        config: node
            .config
            .replace("on_stop = \"keep\"", "on_stop = \"destroy\""),
        tmp: node.tmp,
    };
    let mut second = destroying.start().await;
    for (id, token, m) in &kept {
        still_there(&second, id, token, m).await;
    }
    let status = second.process().terminate(Duration::from_secs(15));
    assert!(status.success(), "{status}");
    for (_, _, m) in &kept {
        testkit::procs::assert_gone(m).await;
    }
    assert_eq!(procs_with(&data.display().to_string()), Vec::<u32>::new());
    let left: Vec<_> = std::fs::read_dir(data.join("sandboxes")).unwrap().collect();
    assert!(left.is_empty(), "sandbox dirs left: {left:?}");
    assert!(restart::recorded_ids(&data).is_empty());
    drop(second);
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_naming_a_process_not_ours_never_signals_it() {
    let node = Node::new("keep");
    let data = node.data();
    let mut first = node.start().await;
    let (id, token) = first.claim().await;
    let real = restart::guest_pids(&data, &id);
    assert!(!first.process().kill().success());
    // An unrelated process with the record's pid and its true start time: the hardest
    // reuse case (pid + start time match, yet it is not in the sandbox's cgroup).
    let mut bystander = ChildGuard::spawn(
        "bystander",
        Command::new("sleep").arg("1000").stdin(Stdio::null()),
    );
    restart::point_at(&data, &id, bystander.pid());
    let second = node.start().await;
    let r = second.exec(&id, &token, json!({"argv": ["true"]})).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(
        bystander.try_exit().is_none(),
        "the bystander was signalled"
    );
    assert!(!procs::signalled(bystander.pid()));
    // The real guest, now owned by no record, is destroyed.
    wait_until(
        Duration::from_secs(5),
        "the unowned guest dead",
        async || all_dead(&real),
    )
    .await;
    assert!(
        second.log_text().contains("is not in its cgroup"),
        "{}",
        second.log_text()
    );
    drop(second);
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_database_is_a_clear_start_error() {
    let node = Node::new("keep");
    let mut first = node.start().await;
    first.claim().await;
    assert!(first.process().terminate(Duration::from_secs(15)).success());
    restart::corrupt(&node.data());
    let (status, log) = start_and_fail(node.tmp.path(), &node.config);
    assert!(!status.success());
    assert!(
        log.contains("state database") && log.contains("state.db"),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    drop(first);
}

/// Runs the binary expecting it to refuse to start; its exit status and log.
fn start_and_fail(dir: &Path, config: &str) -> (std::process::ExitStatus, String) {
    let path = dir.join("refused.toml");
    std::fs::write(&path, config).unwrap();
    let log = dir.join("refused.log");
    let mut cmd = Command::new(BIN);
    cmd.arg("--config")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut guard = ChildGuard::spawn("sandboxd", &mut cmd).log(log.clone());
    let status = guard
        .wait_exit(Duration::from_secs(20))
        .expect("sandboxd kept running on a corrupt database");
    (status, std::fs::read_to_string(log).unwrap())
}
