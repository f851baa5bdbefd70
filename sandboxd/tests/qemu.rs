//! Real VMs end to end through sandboxd's HTTP API, `engine = "qemu"` under TCG: golden
//! with warmup, concurrent copy-on-write clones, per-clone identity (clock, hostname,
//! randomness), the golden memory file untouched, exec and relay, kill from a second
//! connection, a kill reaching `setsid` escapees (per-command cgroups), balloon on/off, a
//! killed QEMU failing its sandbox cleanly, SIGTERM.
//!
//! Needs `qemu-system-x86_64` (`.ci/run` installs QEMU 10 from bookworm-backports) and
//! the guest image (`cargo xtask image`, run by `cargo xtask test`). Without either the
//! tests FAIL and say how to get it; they never pass silently.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use testkit::procs::procs_with;
use testkit::{wait_until, Daemon, DaemonProcess, ROOT};
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

/// VM tests run one at a time: each boots several TCG guests, and two cores shared by
/// concurrent golden builds make every boot (and so every bound) slower.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Fails the test, naming what is missing, without QEMU or the guest image.
fn require_qemu() {
    // `RUST_LOG=info cargo test ... -- --nocapture` shows the daemon's logs.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    testkit::vm::require();
}

fn config(data: &Path, mem_dir: &Path, listen: &str, pools: &str) -> String {
    format!(
        r#"listen = "{listen}"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
# A stopped node leaves nothing (qemu_restart.rs covers "keep").
on_stop = "destroy"
boot_timeout_seconds = 60
warmup_timeout_seconds = 60

[qemu]
accel = "tcg"
memory_dir = "{mem}"

[templates.base]
image = "{image}"

[sizes.small]
cpus = 1
memory_mib = 256

{pools}
"#,
        data = data.display(),
        mem = mem_dir.display(),
        image = testkit::vm::guest_image().display(),
    )
}

/// One test node's scratch space: its data dir and a private directory for golden RAM
/// files (so tests never share goldens).
struct Scratch {
    tmp: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("shm")).unwrap();
        Scratch { tmp }
    }

    fn data(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    fn mem_dir(&self) -> PathBuf {
        self.tmp.path().join("shm")
    }

    /// sandboxd in this process, on port 0.
    async fn daemon(&self, pools: &str) -> Daemon {
        let text = config(&self.data(), &self.mem_dir(), "127.0.0.1:0", pools);
        Daemon::start_text(&self.data(), &text).await
    }

    /// The real sandboxd binary on port 0, for signal tests.
    async fn spawn(&self, pools: &str) -> DaemonProcess {
        let text = config(&self.data(), &self.mem_dir(), "127.0.0.1:0", pools);
        DaemonProcess::start(env!("CARGO_BIN_EXE_sandboxd"), self.tmp.path(), &text).await
    }
}

fn pool(warm: u32) -> String {
    format!("[[pools]]\ntemplate = \"base\"\nsize = \"small\"\nwarm = {warm}\nwarm_max = 4\n")
}

/// Waits until a daemon serves `warm` idle sandboxes.
async fn wait_warm(d: &testkit::Api, warm: u64) {
    d.wait_pool(Duration::from_secs(120), "the pool warm", |p| {
        p["warm"] == warm
    })
    .await;
}

const MARKER_POOL: &str = r#"[[pools]]
template = "base"
size = "small"
warm = 2
warm_max = 4
warmup = ["sh", "-c", "echo golden-marker > /etc/warmed; head -c 1048576 /dev/urandom > /tmp/ballast"]
"#;

async fn exec(d: &Daemon, id: &str, token: &str, argv: &[&str]) -> Value {
    let r = d.exec(id, token, json!({ "argv": argv })).await;
    assert_eq!(r.status, 200, "exec {argv:?}: {}", r.text());
    r.json()
}

fn stdout(v: &Value) -> String {
    v["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("no text stdout: {v}"))
        .to_string()
}

fn sha256_file(p: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
}

/// Golden memory files, in the daemon's private directory under `memory_dir`.
fn golden_memory_files(mem_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(mem_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sandboxd-"))
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".mem"))
        .collect()
}

/// Opens the relay (`Upgrade: silkd`) and returns a framed wire connection.
async fn relay(
    d: &Daemon,
    id: &str,
    token: &str,
) -> Framed<TokioIo<hyper::upgrade::Upgraded>, HostCodec> {
    let stream = tokio::net::TcpStream::connect(d.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    let req = hyper::Request::builder()
        .method("GET")
        .uri(format!("/v1/sandboxes/{id}/agent"))
        .header("host", "sandboxd")
        .header("authorization", format!("Bearer {token}"))
        .header("connection", "upgrade")
        .header("upgrade", "silkd")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 101);
    let upgraded = hyper::upgrade::on(resp).await.unwrap();
    Framed::new(TokioIo::new(upgraded), HostCodec::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_clones_identity_exec_relay_kill() {
    require_qemu();
    let _serial = ONE_AT_A_TIME.lock().await;
    let node = Scratch::new();
    let (data, mem_dir) = (node.data(), node.mem_dir());
    let d = node.daemon(MARKER_POOL).await;
    d.wait_pool(Duration::from_secs(120), "golden and 2 warm clones", |p| {
        p["golden"]["state"] == "ready" && p["warm"] == 2
    })
    .await;
    let info = d.info().await;
    assert_eq!(info["engine"]["name"], "qemu");
    assert_eq!(info["engine"]["accelerator"], "tcg");
    let mems = golden_memory_files(&mem_dir);
    assert_eq!(mems.len(), 1, "one golden memory file: {mems:?}");
    let golden_sha = sha256_file(&mems[0]);

    // Two clones at once.
    let (a, b) = tokio::join!(d.claim(), d.claim());
    let ((ida, toka), (idb, tokb)) = (a, b);
    let probe = [
        "sh",
        "-c",
        "cat /etc/warmed; uname -r; hostname; date +%s; cat /proc/sys/kernel/random/uuid",
    ];
    let host_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let before = host_now();
    let (ra, rb) = tokio::join!(exec(&d, &ida, &toka, &probe), exec(&d, &idb, &tokb, &probe));
    let after = host_now();
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(testkit::vm::guest_image().join("manifest.json")).unwrap(),
    )
    .unwrap();
    let kernel = manifest["kernel"]["release"].as_str().unwrap();
    let mut hostnames = Vec::new();
    let mut uuids = Vec::new();
    for r in [&ra, &rb] {
        let out = stdout(r);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 5, "{out}");
        assert_eq!(
            lines[0], "golden-marker",
            "warmup marker missing in a clone"
        );
        assert_eq!(lines[1], kernel);
        let guest_now: i64 = lines[3].parse().unwrap();
        assert!(
            (before - 2..=after + 2).contains(&guest_now),
            "guest clock {guest_now} outside host {before}..{after} ± 2 s"
        );
        hostnames.push(lines[2].to_string());
        uuids.push(lines[4].to_string());
    }
    assert_ne!(hostnames[0], hostnames[1], "clones share a hostname");
    let metrics = d.call("GET", "/metrics", Some(ROOT), None).await.text();
    assert!(
        metrics.contains("sandboxd_claims_total{source=\"warm\"} 2"),
        "two warm claims in the metrics: {metrics}"
    );
    assert_ne!(uuids[0], uuids[1], "clones share their randomness");

    // Clones write memory: 64 MiB each, then the golden file must be byte-identical.
    let fill = [
        "sh",
        "-c",
        "head -c 67108864 /dev/urandom > /tmp/fill && sync && echo ok",
    ];
    let (fa, fb) = tokio::join!(exec(&d, &ida, &toka, &fill), exec(&d, &idb, &tokb, &fill));
    assert_eq!(stdout(&fa), "ok\n");
    assert_eq!(stdout(&fb), "ok\n");
    assert_eq!(
        sha256_file(&mems[0]),
        golden_sha,
        "a clone altered the golden memory file"
    );

    // Exact bytes through buffered exec.
    let bin = d
        .exec(
            &ida,
            &toka,
            json!({ "argv": ["head", "-c", "4096", "/bin/busybox"] }),
        )
        .await
        .json();
    let ours = {
        let f = std::fs::read(testkit::vm::guest_image().join("rootfs/bin/busybox")).unwrap();
        base64_std(&f[..4096])
    };
    assert_eq!(bin["stdout_b64"].as_str().unwrap(), ours);

    // Relay: a silent command on one connection, killed from a second one.
    let mut first = relay(&d, &ida, &toka).await;
    first
        .send(Request::Exec {
            detach: false,
            pty: None,
            argv: vec!["sleep".into(), "600".into()],
            cwd: None,
            env: None,
            stdin: false,
            timeout_ms: None,
            user: None,
        })
        .await
        .unwrap();
    let pid = match first.next().await.unwrap().unwrap() {
        Response::Started { pid } => pid,
        other => panic!("expected Started, got {other:?}"),
    };
    let mut second = relay(&d, &ida, &toka).await;
    second
        .send(Request::Kill { pid, signal: None })
        .await
        .unwrap();
    assert_eq!(second.next().await.unwrap().unwrap(), Response::Done);
    match tokio::time::timeout(Duration::from_secs(20), first.next())
        .await
        .unwrap()
    {
        Some(Ok(Response::Exit {
            signal: Some(9), ..
        })) => {}
        other => panic!("expected Exit by SIGKILL, got {other:?}"),
    }
    second.send(Request::Ps).await.unwrap();
    let Some(Ok(Response::Procs { procs })) = second.next().await else {
        panic!("expected Procs")
    };
    assert!(
        procs.iter().all(|p| p.state == wire::ProcState::Exited),
        "{procs:?}"
    );

    // Per-command cgroups in the VM (silkd as PID 1 mounts cgroup2): a command's timeout
    // kill reaches what it started in another session, which its process group would miss.
    let r = d
        .exec(
            &ida,
            &toka,
            json!({"argv": ["sh", "-c", "setsid sleep 611 & sleep 611"], "timeout_seconds": 1}),
        )
        .await;
    assert_eq!(r.status, 504, "{}", r.text());
    // `61[1]`: the pattern must not match the checking shell's own command line. SIGKILL
    // lands at once but dying takes the guest a moment: look up to 2 s.
    let check = [
        "sh",
        "-c",
        "grep -c ' /sys/fs/cgroup cgroup2 ' /proc/mounts; \
         for i in 1 2 3 4 5 6 7 8 9 10; do \
           n=$(cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c 'sleep 61[1]'); \
           [ \"$n\" = 0 ] && break; sleep 0.2; \
         done; echo $n",
    ];
    assert_eq!(
        stdout(&exec(&d, &ida, &toka, &check).await),
        "1\n0\n",
        "cgroup2 mounted once, and no sleep 611 left"
    );

    for (id, tok) in [(&ida, &toka), (&idb, &tokb)] {
        let r = d
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/release"),
                Some(tok),
                None,
            )
            .await;
        assert_eq!(r.status, 204);
    }
    d.stop().await;
    let left = procs_with(&data.to_string_lossy());
    assert!(
        left.is_empty(),
        "QEMU left running after shutdown: {left:?}"
    );
}

fn base64_std(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balloon_is_visible_only_without_no_balloon() {
    require_qemu();
    let _serial = ONE_AT_A_TIME.lock().await;
    let node = Scratch::new();
    let data = node.data();
    let pools = r#"[[pools]]
template = "base"
size = "small"
warm = 1
warm_max = 2

[sizes.tiny]
cpus = 1
memory_mib = 192

[[pools]]
template = "base"
size = "tiny"
warm = 1
warm_max = 2
no_balloon = true
"#;
    let d = node.daemon(pools).await;
    d.wait_info(Duration::from_secs(120), "pools ready", |info| {
        info["pools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["golden"]["state"] == "ready" && p["warm"] == 1)
    })
    .await;
    // virtio device id 5 is the balloon.
    let probe = ["sh", "-c", "cat /sys/bus/virtio/devices/*/device"];
    for (size, want) in [("small", true), ("tiny", false)] {
        let r = d
            .call(
                "POST",
                "/v1/claim",
                Some(ROOT),
                Some(&json!({ "size": size }).to_string()),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let (id, tok) = (v["id"].as_str().unwrap(), v["token"].as_str().unwrap());
        let out = stdout(&exec(&d, id, tok, &probe).await);
        assert_eq!(
            out.lines().any(|l| l.trim() == "0x0005"),
            want,
            "size {size}: {out}"
        );
        if want {
            // The balloon reports guest memory statistics and never free pages.
            let host = stdout(&exec(&d, id, tok, &["hostname"]).await);
            let guest_id = host.trim().strip_prefix("sbx-").unwrap().to_string();
            let run = std::fs::read_dir(data.join("qemu/run"))
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with(&guest_id)
                })
                .expect("run dir of the sandbox");
            let mut qmp = QmpClient::connect(&run.join("qmp.sock")).await;
            let fpr = qmp.qom_get("free-page-reporting").await;
            assert_eq!(fpr, json!(false));
            wait_until(Duration::from_secs(20), "balloon stats", async || {
                let stats = qmp.qom_get("guest-stats").await;
                if stats["stats"]["stat-total-memory"].as_i64().unwrap_or(-1) > 0 {
                    Ok(())
                } else {
                    Err(stats)
                }
            })
            .await;
        }
    }
    d.stop().await;
}

/// Just enough QMP for a test to read a balloon property.
struct QmpClient {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>>,
    write: tokio::net::unix::OwnedWriteHalf,
}

impl QmpClient {
    async fn connect(path: &Path) -> QmpClient {
        use tokio::io::AsyncBufReadExt;
        let (r, w) = tokio::net::UnixStream::connect(path)
            .await
            .unwrap()
            .into_split();
        let mut c = QmpClient {
            lines: tokio::io::BufReader::new(r).lines(),
            write: w,
        };
        c.lines.next_line().await.unwrap().expect("QMP greeting");
        c.call(json!({"execute": "qmp_capabilities"})).await;
        c
    }

    async fn qom_get(&mut self, property: &str) -> Value {
        let path = "/machine/peripheral/balloon0";
        self.call(json!({"execute": "qom-get", "arguments": {"path": path, "property": property}}))
            .await
    }

    async fn call(&mut self, cmd: Value) -> Value {
        use tokio::io::AsyncWriteExt;
        self.write
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .unwrap();
        loop {
            let line = self.lines.next_line().await.unwrap().expect("QMP reply");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("event").is_some() {
                continue;
            }
            return v
                .get("return")
                .cloned()
                .unwrap_or_else(|| panic!("QMP error: {v}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_qemu_fails_its_sandbox_and_the_pool_refills() {
    require_qemu();
    let _serial = ONE_AT_A_TIME.lock().await;
    let node = Scratch::new();
    let data = node.data();
    let d = node.daemon(&pool(1)).await;
    d.wait_pool(Duration::from_secs(120), "one warm clone", |p| {
        p["warm"] == 1
    })
    .await;
    let (id, tok) = d.claim().await;
    let host = stdout(&exec(&d, &id, &tok, &["hostname"]).await);
    let guest_id = host
        .trim()
        .strip_prefix("sbx-")
        .expect("sbx- hostname")
        .to_string();
    let qemu = procs_with(&format!("qemu/run/{guest_id}"));
    assert_eq!(qemu.len(), 1, "the sandbox's QEMU: {qemu:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(qemu[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Exec answers 502 saying the sandbox failed (the host-side detail is root's: the
    // sandbox token gets an incident id); root reads why.
    let msg = wait_until(Duration::from_secs(10), "exec answering 502", async || {
        let r = d.exec(&id, &tok, json!({ "argv": ["true"] })).await;
        if r.status == 502 {
            Ok(r.json()["error"].as_str().unwrap().to_string())
        } else {
            Err(r.status)
        }
    })
    .await;
    assert!(
        msg.contains("has failed") && msg.contains("incident"),
        "{msg}"
    );
    let r = d.exec(&id, ROOT, json!({ "argv": ["true"] })).await;
    assert_eq!(r.status, 502);
    assert!(r.text().contains("QEMU exited"), "{}", r.text());
    let list = d
        .call("GET", "/v1/sandboxes", Some(ROOT), None)
        .await
        .json();
    let row = list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(row["state"], "failed", "{row}");
    // The pool refills and a new claim works.
    d.wait_pool(Duration::from_secs(120), "refill", |p| p["warm"] == 1)
        .await;
    let (id2, tok2) = d.claim().await;
    assert_eq!(
        stdout(&exec(&d, &id2, &tok2, &["echo", "alive"]).await),
        "alive\n"
    );
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/release"),
            Some(&tok),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    d.stop().await;
    let left = procs_with(&data.to_string_lossy());
    assert!(left.is_empty(), "QEMU left running: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_leaves_no_qemu_running() {
    require_qemu();
    let _serial = ONE_AT_A_TIME.lock().await;
    let node = Scratch::new();
    let data = node.data().to_string_lossy().into_owned();
    let mut d = node.spawn(&pool(2)).await;
    wait_warm(&d, 2).await;
    let r = d.call("POST", "/v1/claim", Some(ROOT), Some("{}")).await;
    assert_eq!(r.status, 200);
    assert!(procs_with(&data).len() >= 2, "QEMUs should run");
    let status = d.process().terminate(Duration::from_secs(60));
    assert!(status.success(), "sandboxd exit: {status}");
    let left = procs_with(&data);
    assert!(left.is_empty(), "QEMU left running after SIGTERM: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_sigkill_cleans_leftover_qemus() {
    require_qemu();
    let _serial = ONE_AT_A_TIME.lock().await;
    let node = Scratch::new();
    let run_root = node.data().join("qemu/run").to_string_lossy().into_owned();
    let mut first = node.spawn(&pool(1)).await;
    wait_warm(&first, 1).await;
    let old = procs_with(&run_root);
    assert_eq!(old.len(), 1, "one warm QEMU: {old:?}");
    // A crash: the daemon dies at once and its QEMU stays behind.
    first.process().kill();
    assert_eq!(
        procs_with(&run_root),
        old,
        "the QEMU should outlive a SIGKILLed daemon"
    );
    let mut second = node.spawn(&pool(1)).await;
    wait_warm(&second, 1).await;
    let now = procs_with(&run_root);
    assert!(
        old.iter().all(|p| !now.contains(p)),
        "leftover {old:?} still runs: {now:?}"
    );
    let status = second.process().terminate(Duration::from_secs(60));
    assert!(status.success(), "sandboxd exit: {status}");
    let left = procs_with(&node.data().to_string_lossy());
    assert!(left.is_empty(), "QEMU left running: {left:?}");
}
