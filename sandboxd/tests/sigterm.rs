//! The real `sandboxd` binary: SIGTERM destroys every sandbox (idle and claimed, with a
//! command running) and leaves no process, cgroup or sandbox directory behind.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_gone, marker, procs_with, wait_running, Setup, ROOT};
use serde_json::json;

/// Kills the daemon if the test fails before it exits on its own, and prints its log.
struct Guard(Child, std::path::PathBuf);

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.1).unwrap_or_default();
            eprintln!("--- sandboxd log ---\n{log}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_destroys_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let setup = Setup {
        warm: 2,
        ..Setup::default()
    };
    let config = tmp.path().join("sandboxd.toml");
    std::fs::write(&config, setup.toml(tmp.path(), &addr.to_string())).unwrap();
    let log_path = tmp.path().join("sandboxd.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut guard = Guard(child, log_path);
    let pid = guard.0.id() as i32;

    let start = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "sandboxd never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = common::call(addr, "GET", "/healthz", None, None).await;
    assert_eq!(r.status, 200);
    let r = common::call(addr, "POST", "/v1/claim", Some(ROOT), Some("{}")).await;
    let v = r.json();
    let (id, token) = (
        v["id"].as_str().unwrap().to_string(),
        v["token"].as_str().unwrap().to_string(),
    );
    let m = marker(20);
    let body = json!({"argv": ["sleep", m]}).to_string();
    let running = tokio::spawn(async move {
        common::call(
            addr,
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&token),
            Some(&body),
        )
        .await
    });
    wait_running(&m).await;
    // Wait for the pool too, so idle sandboxes exist when the signal lands.
    let start = Instant::now();
    loop {
        let info = common::call(addr, "GET", "/v1/info", Some(ROOT), None).await;
        if info.json()["pools"][0]["warm"] == 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let data_dir = tmp.path().display().to_string();
    assert!(
        procs_with(&data_dir).len() >= 3,
        "expected bwrap processes for 3 sandboxes"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
    // The running exec got an answer (or its connection closed), never a hang.
    let _ = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("exec still hanging after shutdown");
    assert_gone(&m).await;
    assert_eq!(procs_with(&data_dir), Vec::<i32>::new());
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("sandboxes"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "sandbox dirs left: {left:?}");
}
