//! The file routes in a real VM (`engine = "qemu"` under TCG, the base image, one guest
//! booted cold): an exact round trip of a random 8 MiB + 1 file and a range, a listing,
//! a directory out and back in as tar with its modes and an absolute symlink, a hostile
//! archive (a symlink, then a file through it) refused with nothing written, and a
//! missing path 404. silkd runs here as the guest's PID 1 over the virtio-serial channel,
//! not as the process engine's child over a Unix socket.
//!
//! Needs `qemu-system-x86_64` and the guest image (`cargo xtask image`); it FAILS, naming
//! what is missing, without them.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::files_http::call_bytes;
use testkit::silkd_files::{random_bytes, raw_tar, raw_tar_entry};
use testkit::{Daemon, ROOT};

fn config(data: &Path, mem_dir: &Path) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
on_stop = "destroy"
boot_timeout_seconds = 90
warmup_timeout_seconds = 90

[qemu]
accel = "tcg"
memory_dir = "{mem}"

[templates.base]
image = "{image}"

[sizes.small]
cpus = 1
memory_mib = 256

[[pools]]
template = "base"
size = "small"
warm = 0
warm_max = 1
"#,
        data = data.display(),
        mem = mem_dir.display(),
        image = testkit::vm::guest_image().display(),
    )
}

/// `sh -c script` in the guest, which must exit 0; its stdout.
async fn ok(d: &Daemon, id: &str, token: &str, script: &str) -> String {
    let body = json!({"argv": ["sh", "-c", script], "timeout_seconds": 120});
    let v: Value = d.exec(id, token, body).await.json();
    assert_eq!(v["exit_code"], 0, "{script:?}: {v}");
    v["stdout"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_in_a_vm() {
    // `RUST_LOG=info cargo test ... -- --nocapture` shows the daemon's logs.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    testkit::vm::require();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("shm")).unwrap();
    let data = tmp.path().join("data");
    let d = Daemon::start_text(&data, &config(&data, &tmp.path().join("shm"))).await;
    let addr = d.addr();
    let (id, token) = d.claim().await;
    let url = |route: &str, q: &str| format!("/v1/sandboxes/{id}/{route}?{q}");

    // A file, exactly, and a range of it.
    let blob = random_bytes(8 * 1024 * 1024 + 1, 12);
    let path = url("files", "path=/tmp/in/blob");
    let r = call_bytes(addr, "PUT", &path, &token, &[], blob.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = call_bytes(addr, "GET", &path, &token, &[], vec![]).await;
    assert_eq!(r.status, 200);
    assert!(r.body == blob, "the 8 MiB + 1 came back different");
    let r = call_bytes(addr, "GET", &path, &token, &[("range", "bytes=-3")], vec![]).await;
    assert_eq!(
        (r.status.as_u16(), &r.body[..]),
        (206, &blob[blob.len() - 3..])
    );
    let r = d
        .call("GET", &url("fs", "path=/tmp/in"), Some(&token), None)
        .await;
    assert_eq!(r.json()["entries"][0]["name"], "blob", "{}", r.text());
    assert_eq!(r.json()["entries"][0]["size"], blob.len());

    // A directory out as tar and back in elsewhere: contents, modes, links kept.
    let script = "mkdir -p /tmp/src/a && echo x > /tmp/src/a/f && chmod 750 /tmp/src/a/f \
                  && ln -s /bin/busybox /tmp/src/a/abs && ln -s f /tmp/src/a/rel";
    ok(&d, &id, &token, script).await;
    let tar = call_bytes(
        addr,
        "GET",
        &url("archive", "path=/tmp/src"),
        &token,
        &[],
        vec![],
    )
    .await;
    assert_eq!(tar.status, 200);
    let r = call_bytes(
        addr,
        "PUT",
        &url("archive", "path=/tmp/dst"),
        &token,
        &[],
        tar.body.to_vec(),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let out = ok(
        &d,
        &id,
        &token,
        "cat /tmp/dst/a/rel; stat -c %a /tmp/dst/a/f; readlink /tmp/dst/a/abs",
    )
    .await;
    assert_eq!(out, "x\n750\n/bin/busybox\n");

    // Hostile: a symlink out, then a file through it: 400, nothing written.
    let evil = raw_tar(&[
        raw_tar_entry("l", tar::EntryType::Symlink, Some("/etc"), b""),
        raw_tar_entry("l/evil", tar::EntryType::Regular, None, b"x"),
    ]);
    let r = call_bytes(
        addr,
        "PUT",
        &url("archive", "path=/tmp/e"),
        &token,
        &[],
        evil,
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let out = ok(&d, &id, &token, "ls /etc /tmp").await;
    assert!(!out.contains("evil") && !out.contains("\ne\n"), "{out}");

    // Missing: 404.
    let r = call_bytes(
        addr,
        "GET",
        &url("files", "path=/tmp/nope"),
        &token,
        &[],
        vec![],
    )
    .await;
    assert_eq!(r.status, 404);
    d.stop().await;
    // The claimed VM went with the daemon (`on_stop = "destroy"`; the default keeps it
    // running, and the temp dir's removal would then leave an orphan QEMU behind).
    testkit::procs::wait_gone(&data.to_string_lossy(), Duration::from_secs(10)).await;
}
