//! Faults on the process engine, each with its exact outcome, a bystander sandbox that
//! must be untouched, and the host's leftovers counted before and after: the data
//! directory's disk full during a golden build and during a claim (a small tmpfs as
//! `data_dir`), and clients that vanish mid-exec and mid-relay. The VM faults are in
//! `qemu_faults.rs`.

use std::path::Path;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::json;
use testkit::leftovers::{Census, Count};
use testkit::procs::{assert_gone, marker, wait_running};
use testkit::relay::upgrade;
use testkit::setup::uid_range;
use testkit::tmpfs::Tmpfs;
use testkit::{wait_until, Daemon, Setup};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

const NOTHING: Count = Count {
    processes: 0,
    sandbox_dirs: 0,
    sockets: 0,
    cgroups: 0,
};

async fn echo(d: &Daemon, id: &str, token: &str, text: &str) {
    let r = d.exec(id, token, json!({"argv": ["echo", text]})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["stdout"], format!("{text}\n"));
}

fn files_named(dir: &Path, suffix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(suffix))
                .collect()
        })
        .unwrap_or_default()
}

/// The sandbox directories under `data_dir/sandboxes`.
fn sandbox_dirs(data: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(data.join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_dir_fails_the_golden_cleanly_and_a_later_retry_builds_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let disk = Tmpfs::mount(&data, 4);
    // The golden's warmup waits for a file the test creates in its socket directory
    // (`/run/silkd` inside), so the disk fills while the build is under way.
    let d = Daemon::start_in(
        &data,
        &Setup {
            warm: 1,
            default_ttl_seconds: 120,
            max_output_bytes: 4 * 1024 * 1024,
            warmup: Some(
                r#"["sh", "-c", "while [ ! -e /run/silkd/go ]; do sleep 0.05; done"]"#.into(),
            ),
            ..Setup::default()
        },
    )
    .await;
    let golden_dir = wait_until(
        Duration::from_secs(30),
        "the golden's sandbox",
        async || {
            let dirs = sandbox_dirs(&data);
            if dirs.len() == 1 {
                Ok(dirs[0].clone())
            } else {
                Err(dirs)
            }
        },
    )
    .await;
    let (id, token) = d.claim().await;
    echo(&d, &id, &token, "bystander").await;
    let census = Census::new(&data, uid_range(&data));

    // The goldens' directory runs out of space (a tmpfs of its own, full) while the build
    // is under way: the warmup ends, the golden is sealed, its stamp cannot be written. The
    // build fails, says why, and leaves neither a stamp nor a half-written one behind.
    let goldens = data.join("goldens");
    let goldens_disk = Tmpfs::mount(&goldens, 1);
    let goldens_filler = goldens_disk.fill("filler");
    std::fs::write(golden_dir.join("sock/go"), "").unwrap();
    let info = d
        .wait_pool(Duration::from_secs(30), "golden failed", |p| {
            p["golden"]["state"] == "failed"
        })
        .await;
    let why = info["pools"][0]["golden"]["last_error"].as_str().unwrap();
    assert!(why.contains("No space left on device"), "{why}");
    assert_eq!(files_named(&goldens, ".tmp"), Vec::<String>::new());
    assert_eq!(files_named(&goldens, "stamp"), Vec::<String>::new());

    // A sandbox claimed while there is space, then the whole data directory fills. A
    // claim now cannot be recorded in the state database: it is refused whole (503 +
    // Retry-After, no guest left behind), not half-made and not an internal error.
    let r = d
        .call("POST", "/v1/claim", Some(testkit::ROOT), Some("{}"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (full_id, full_token) = (
        r.json()["id"].as_str().unwrap().to_string(),
        r.json()["token"].as_str().unwrap().to_string(),
    );
    let filler = disk.fill("filler");
    let r = d
        .call("POST", "/v1/claim", Some(testkit::ROOT), Some("{}"))
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.headers["retry-after"], "5");
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("data_dir is full"));
    // A process sandbox writes nothing on data_dir but its log (whose writes fail and are
    // dropped) once started, so the one claimed before serves on.
    echo(&d, &full_id, &full_token, "claimed before the disk filled").await;
    // Output past the node's memory budget spills to data_dir/spill, which is full.
    let big = d
        .exec(
            &full_id,
            &full_token,
            json!({"argv": ["head", "-c", "3000000", "/dev/zero"]}),
        )
        .await;
    // The node is out of space for now: 503 with Retry-After, not an internal error.
    assert_eq!(big.status, 503, "{}", big.text());
    assert_eq!(big.headers["retry-after"], "5");
    assert!(big.json()["error"]
        .as_str()
        .unwrap()
        .contains("data_dir is full"));
    // The bystander is untouched.
    echo(&d, &id, &token, "bystander on a full disk").await;

    // Space again: the retry (backoff) builds the golden and the pool fills.
    std::fs::remove_file(&filler).unwrap();
    std::fs::remove_file(&goldens_filler).unwrap();
    wait_until(
        Duration::from_secs(90),
        "golden ready, one warm",
        async || {
            // Each rebuild's warmup waits for its own `go`.
            for dir in sandbox_dirs(&data) {
                let _ = std::fs::write(dir.join("sock/go"), "");
            }
            let pool = d.info().await["pools"][0].clone();
            if pool["golden"]["state"] == "ready" && pool["warm"] == 1 {
                Ok(())
            } else {
                Err(pool)
            }
        },
    )
    .await;
    assert_eq!(files_named(&goldens, ".tmp"), Vec::<String>::new());
    echo(&d, &id, &token, "still serving").await;
    d.stop().await;
    census.wait_back_to(&NOTHING).await;
    drop(goldens_disk);
    drop(disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_vanishing_mid_exec_and_mid_relay_leave_no_process() {
    let d = Daemon::start(Setup {
        warm: 0,
        ..Setup::default()
    })
    .await;
    let (id, token) = d.claim().await;
    let (other, other_token) = d.claim().await;
    let census = Census::new(&d.dir, uid_range(&d.dir));
    let before = census.count();

    // Mid-exec: the request is sent, its command runs, the client's socket closes.
    let m = marker(11);
    let body = json!({"argv": ["sleep", m]}).to_string();
    let mut stream = tokio::net::TcpStream::connect(d.addr()).await.unwrap();
    let req = format!(
        "POST /v1/sandboxes/{id}/exec HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    wait_running(&m).await;
    drop(stream);
    assert_gone(&m).await;

    // Mid-relay: a command started through the relay, then the client vanishes.
    let m = marker(12);
    let path = format!("/v1/sandboxes/{id}/agent");
    let (status, stream, _) = upgrade(d.addr(), &path, Some(&token)).await;
    assert_eq!(status, 101);
    let mut conn = Framed::new(stream, HostCodec::new());
    conn.send(Request::Exec {
        detach: false,
        pty: None,
        argv: vec!["sleep".into(), m.clone()],
        cwd: None,
        env: None,
        stdin: false,
        timeout_ms: None,
        user: None,
    })
    .await
    .unwrap();
    assert!(matches!(
        conn.next().await.unwrap().unwrap(),
        Response::Started { .. }
    ));
    wait_running(&m).await;
    drop(conn);
    assert_gone(&m).await;

    // Both sandboxes serve; nothing is left over.
    echo(&d, &id, &token, "after the vanished clients").await;
    echo(&d, &other, &other_token, "bystander").await;
    wait_until(Duration::from_secs(10), "leftovers as before", async || {
        let now = census.count();
        if now == before {
            Ok(())
        } else {
            Err(format!("before {before:?}, now {now:?}"))
        }
    })
    .await;
    d.stop().await;
    census.wait_back_to(&NOTHING).await;
}
