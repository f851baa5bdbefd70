//! The real `sandboxd` binary: SIGTERM destroys every sandbox (idle and claimed, with a
//! command running) and leaves no process, cgroup or sandbox directory behind.

use std::time::Duration;

use serde_json::json;
use testkit::procs::{assert_gone, marker, procs_with, wait_running};
use testkit::{Api, DaemonProcess, Setup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_destroys_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let setup = Setup {
        warm: 2,
        ..Setup::default()
    };
    // The data dir is sandboxd's own; the config and log live beside it.
    let config = setup.toml(&tmp.path().join("data"), "127.0.0.1:0");
    let mut d = DaemonProcess::start(env!("CARGO_BIN_EXE_sandboxd"), tmp.path(), &config).await;

    let r = d.call("GET", "/healthz", None, None).await;
    assert_eq!(r.status, 200);
    let (id, token) = d.claim().await;
    let m = marker(20);
    let (api, body) = (Api::clone(&d), json!({"argv": ["sleep", m]}));
    let running = tokio::spawn(async move { api.exec(&id, &token, body).await });
    wait_running(&m).await;
    // Wait for the pool too, so idle sandboxes exist when the signal lands.
    d.wait_pool(Duration::from_secs(10), "2 warm", |p| p["warm"] == 2)
        .await;
    let data_dir = tmp.path().join("data").display().to_string();
    assert!(
        procs_with(&data_dir).len() >= 3,
        "expected bwrap processes for 3 sandboxes"
    );

    let status = d.process().terminate(Duration::from_secs(15));
    assert!(status.success(), "{status}");
    // The running exec got an answer (or its connection closed), never a hang.
    let _ = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("exec still hanging after shutdown");
    assert_gone(&m).await;
    assert_eq!(procs_with(&data_dir), Vec::<u32>::new());
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("data/sandboxes"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "sandbox dirs left: {left:?}");
}
