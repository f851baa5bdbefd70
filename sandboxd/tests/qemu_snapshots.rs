//! The real `sandboxd` binary, `engine = "qemu"` under TCG: snapshot a VM with a file
//! and a background counter, fork it three times (each sees the file and the counter
//! still counting from the snapshot's value, has its own hostname and entropy, and sees
//! none of the others' writes; the parent goes on unaffected; the snapshot's files stay
//! byte-identical), tenant isolation and hostile ids and names, the quota; then
//! hibernate (its QEMU and cgroup gone, host memory measured), a `kill -9` and restart
//! keeping the hibernated sandbox and the snapshot (which still forks) and sweeping the
//! files a crash mid-write would leave, an exec that wakes it with its state and
//! hostname, and the disk headroom checked before writing. One daemon, one parent and three forks: TCG VMs are slow.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::vm_leftovers::{VmCensus, VmCount};
use testkit::{procs, restart, snapshots, wait_until, DaemonProcess, ROOT};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxd");
const TENANT_A: &str = "tenant-a-token-0123456789";
const TENANT_B: &str = "tenant-b-token-0123456789";

fn config(tmp: &std::path::Path) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
boot_timeout_seconds = 90

[[tenants]]
name = "a"
token = "{TENANT_A}"
max_claims = 8

[[tenants]]
name = "b"
token = "{TENANT_B}"
max_claims = 8

[snapshots]
max_per_tenant = 1

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
"#,
        data = tmp.join("data").display(),
        mem = tmp.join("shm").display(),
        image = testkit::vm::require().display(),
    )
}

async fn sh(d: &DaemonProcess, id: &str, token: &str, script: &str) -> String {
    let r = d
        .exec(id, token, json!({"argv": ["sh", "-c", script]}))
        .await;
    assert_eq!(r.status, 200, "{id}: {script}: {}", r.text());
    let v = r.json();
    assert_eq!(v["exit_code"], 0, "{id}: {script}: {v}");
    v["stdout"].as_str().unwrap().trim().to_string()
}

async fn count(d: &DaemonProcess, id: &str, token: &str) -> u64 {
    sh(d, id, token, "cat /tmp/count").await.parse().unwrap()
}

/// Waits until the counter in `id` passes `above`: it is still counting.
async fn counting(d: &DaemonProcess, id: &str, token: &str, above: u64) {
    wait_until(
        Duration::from_secs(60),
        "the counter moving on",
        async || count(d, id, token).await > above,
    )
    .await;
}

async fn claim_fork(d: &DaemonProcess, token: &str, snapshot: &str) -> (String, String) {
    let body = json!({ "snapshot": snapshot }).to_string();
    let r = d.call("POST", "/v1/claim", Some(token), Some(&body)).await;
    assert_eq!(r.status, 200, "fork: {}", r.text());
    let v = r.json();
    (
        v["id"].as_str().unwrap().into(),
        v["token"].as_str().unwrap().into(),
    )
}

fn error_of(r: &testkit::http::Resp) -> String {
    r.json()["error"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_fork_hibernate_wake_and_restart() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("shm")).unwrap();
    let text = config(tmp.path());
    let data: PathBuf = tmp.path().join("data");
    let d = DaemonProcess::start(BIN, tmp.path(), &text).await;

    let (parent, ptoken) = d.claim_as(TENANT_A).await;
    sh(
        &d,
        &parent,
        &ptoken,
        "echo from-parent > /tmp/marker && (setsid sh -c 'i=0; while :; do i=$((i+1)); \
         echo $i > /tmp/count.new && mv /tmp/count.new /tmp/count; sleep 0.1; done' \
         </dev/null >/dev/null 2>&1 &) && sleep 0.3",
    )
    .await;
    let parent_host = sh(&d, &parent, &ptoken, "hostname").await;
    let census = VmCensus::new(&data, &tmp.path().join("shm"));
    let one_vm = census.count();
    assert_eq!(one_vm.qemus, 1);
    let before = count(&d, &parent, &ptoken).await;

    // Hostile snapshot requests are refused before anything is written.
    let path = format!("/v1/sandboxes/{parent}/snapshot");
    for (body, status) in [
        (r#"{"name": "../x"}"#, 400),
        (r#"{"ttl_seconds": 0}"#, 400),
        (r#"{"bogus": 1}"#, 400),
    ] {
        let r = d.call("POST", &path, Some(&ptoken), Some(body)).await;
        assert_eq!(r.status, status, "{body}: {}", r.text());
    }
    let r = d
        .call("POST", &path, Some(&ptoken), Some(r#"{"name": "base-1"}"#))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["memory"], true);
    let snap = r.json()["snapshot_id"].as_str().unwrap().to_string();
    let at_snapshot = count(&d, &parent, &ptoken).await;
    let files = data.join("snapshots").join(&snap);
    let digests = snapshots::digests(&files);
    assert_eq!(
        digests.keys().collect::<Vec<_>>(),
        ["memory", "state.mig"],
        "a snapshot is its memory and device state, nothing left over"
    );

    // Quota: tenant a holds one snapshot, the most its config allows.
    let r = d.call("POST", &path, Some(&ptoken), Some("{}")).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(error_of(&r).contains("max_per_tenant"), "{}", r.text());
    assert_eq!(
        std::fs::read_dir(data.join("snapshots")).unwrap().count(),
        1,
        "the refused snapshot left files"
    );

    // Tenant isolation and hostile ids: all look like an unknown snapshot.
    let listed = d.call("GET", "/v1/snapshots", Some(TENANT_B), None).await;
    assert_eq!(listed.json()["snapshots"], json!([]));
    let mine = d.call("GET", "/v1/snapshots", Some(TENANT_A), None).await;
    assert_eq!(mine.json()["snapshots"][0]["id"], snap.as_str());
    assert_eq!(mine.json()["snapshots"][0]["name"], "base-1");
    for id in [
        snap.as_str(),
        "snap-000000000000000000000000",
        "snap-..%2F..%2Fetc",
        "..",
        "snap-",
    ] {
        let body = json!({ "snapshot": id }).to_string();
        let r = d
            .call("POST", "/v1/claim", Some(TENANT_B), Some(&body))
            .await;
        assert_eq!(r.status, 404, "{id}: {}", r.text());
        let r = d
            .call(
                "DELETE",
                &format!("/v1/snapshots/{id}"),
                Some(TENANT_B),
                None,
            )
            .await;
        assert_eq!(r.status, 404, "{id}: {}", r.text());
    }
    let body = json!({ "snapshot": snap, "size": "large" }).to_string();
    let r = d
        .call("POST", "/v1/claim", Some(TENANT_A), Some(&body))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());

    // Three forks.
    let mut forks = Vec::new();
    for _ in 0..3 {
        forks.push(claim_fork(&d, TENANT_A, &snap).await);
    }
    // Every fork maps the snapshot's one memory file (copy-on-write, shared pages).
    let inode =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(files.join("memory")).unwrap());
    for (id, _) in &forks {
        let pid = restart::guest_pids(&data, id)[0];
        assert!(
            testkit::host::maps_inode(pid, inode),
            "{id} does not map the snapshot"
        );
    }
    let mut hosts = vec![parent_host.clone()];
    let mut entropy = Vec::new();
    for (n, (id, token)) in forks.iter().enumerate() {
        assert_eq!(sh(&d, id, token, "cat /tmp/marker").await, "from-parent");
        let c = count(&d, id, token).await;
        assert!(
            c >= before,
            "{id}: counter {c} is behind the snapshot's {before}"
        );
        assert!(
            c <= at_snapshot + 50,
            "{id}: counter {c}, parent was at {at_snapshot}"
        );
        counting(&d, id, token, c).await;
        hosts.push(sh(&d, id, token, "hostname").await);
        entropy.push(sh(&d, id, token, "head -c 16 /dev/urandom | od -An -tx1").await);
        sh(&d, id, token, &format!("echo {n} > /tmp/own-{n}")).await;
    }
    let mut unique = hosts.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 4, "hostnames: {hosts:?}");
    let mut e = entropy.clone();
    e.sort();
    e.dedup();
    assert_eq!(e.len(), 3, "entropy: {entropy:?}");
    for (n, (id, token)) in forks.iter().enumerate() {
        let seen = sh(&d, id, token, "ls /tmp").await;
        for other in (0..3).filter(|o| *o != n) {
            assert!(
                !seen.contains(&format!("own-{other}")),
                "{id} sees fork {other}: {seen}"
            );
        }
    }
    // The parent goes on: still counting, its own file, none of the forks'.
    counting(&d, &parent, &ptoken, at_snapshot).await;
    let seen = sh(&d, &parent, &ptoken, "cat /tmp/marker; ls /tmp").await;
    assert!(
        seen.starts_with("from-parent") && !seen.contains("own-"),
        "{seen}"
    );
    // Another sandbox's token cannot reach the parent's snapshot, hibernate or wake; a
    // tenant token is not a sandbox token.
    for action in ["snapshot", "hibernate", "wake"] {
        let path = format!("/v1/sandboxes/{parent}/{action}");
        let r = d.call("POST", &path, Some(&forks[0].1), Some("{}")).await;
        assert_eq!(r.status, 404, "{action}: {}", r.text());
        let r = d.call("POST", &path, Some(TENANT_A), Some("{}")).await;
        assert_eq!(r.status, 403, "{action}: {}", r.text());
    }
    // A fork whose QEMU died cannot be snapshotted or hibernated: the sandbox's failure.
    let dead = restart::guest_pids(&data, &forks[2].0)[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dead as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_until(Duration::from_secs(10), "the fork failed", async || {
        let rows: Value = d
            .call("GET", "/v1/sandboxes", Some(ROOT), None)
            .await
            .json();
        rows["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"] == forks[2].0.as_str() && r["state"] == "failed")
    })
    .await;
    for action in ["snapshot", "hibernate"] {
        let path = format!("/v1/sandboxes/{}/{action}", forks[2].0);
        let r = d.call("POST", &path, Some(&forks[2].1), Some("{}")).await;
        assert_eq!(r.status, 502, "{action}: {}", r.text());
    }
    for (id, token) in &forks {
        let r = d
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/release"),
                Some(token),
                None,
            )
            .await;
        assert_eq!(r.status, 204);
    }
    // Back to the parent alone: the snapshot's helper QEMU left nothing either.
    census.wait_for(one_vm).await;
    assert_eq!(
        snapshots::digests(&files),
        digests,
        "forks changed the snapshot"
    );

    // Hibernate: its QEMU and memory go; its id, token and state stay.
    sh(&d, &parent, &ptoken, "echo before-sleep > /tmp/slept").await;
    let qemu = restart::guest_pids(&data, &parent)[0];
    let avail = snapshots::mem_available_kib();
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{parent}/hibernate"),
            Some(&ptoken),
            None,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    wait_until(Duration::from_secs(10), "the QEMU gone", async || {
        !procs::alive(qemu)
    })
    .await;
    let nothing = VmCount {
        qemus: 0,
        run_dirs: 0,
        sockets: 0,
        memory_files: 0,
        cgroups: 0,
    };
    census.wait_for(nothing).await;
    eprintln!(
        "hibernate: MemAvailable {} -> {} KiB",
        avail,
        snapshots::mem_available_kib()
    );
    let row = d
        .call("GET", "/v1/sandboxes", Some(TENANT_A), None)
        .await
        .json();
    assert_eq!(row["sandboxes"][0]["state"], "hibernated", "{row}");
    let at_sleep = {
        let dir = data.join("hibernated").join(&parent);
        assert!(dir.join("memory").is_file(), "no hibernation files");
        dir
    };

    // kill -9 and restart (with no disk to spare): the hibernated sandbox and the
    // snapshot are both kept.
    // What a crash mid-write would leave: files no record owns, swept at the start.
    let strays = [
        data.join("snapshots/snap-0123456789abcdef01234567"),
        data.join("hibernated/sb-0123456789abcdef"),
    ];
    for s in &strays {
        std::fs::create_dir(s).unwrap();
        std::fs::write(s.join("memory"), b"half").unwrap();
    }
    let mut first = d;
    let text = text.replace(
        "max_per_tenant = 1",
        "max_per_tenant = 2\nmin_free_bytes = 1152921504606846976",
    );
    let (d, _, _) = restart::kill_and_restart(&mut first, BIN.as_ref(), tmp.path(), &text)
        .await
        .unwrap();
    let mine: Value = d
        .call("GET", "/v1/snapshots", Some(TENANT_A), None)
        .await
        .json();
    assert_eq!(mine["snapshots"][0]["id"], snap.as_str(), "{mine}");
    let row = d
        .call("GET", "/v1/sandboxes", Some(TENANT_A), None)
        .await
        .json();
    assert_eq!(row["sandboxes"][0]["state"], "hibernated", "{row}");
    // An exec wakes it: its files, its counter going on, its hostname.
    let c = count(&d, &parent, &ptoken).await;
    assert_eq!(
        sh(&d, &parent, &ptoken, "cat /tmp/slept").await,
        "before-sleep"
    );
    counting(&d, &parent, &ptoken, c).await;
    assert_eq!(sh(&d, &parent, &ptoken, "hostname").await, parent_host);
    assert!(
        !at_sleep.exists(),
        "the hibernation files outlived the wake"
    );
    // The disk is checked before anything is written: 507, and no file left.
    for action in ["snapshot", "hibernate"] {
        let path = format!("/v1/sandboxes/{parent}/{action}");
        let r = d.call("POST", &path, Some(&ptoken), Some("{}")).await;
        assert_eq!(r.status, 507, "{action}: {}", r.text());
        assert!(error_of(&r).contains("min_free_bytes"), "{}", r.text());
    }
    let r = d
        .call(
            "DELETE",
            &format!("/v1/snapshots/{snap}"),
            Some(TENANT_A),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    assert!(!files.exists());
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{parent}/release"),
            Some(&ptoken),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    census.wait_for(nothing).await;
    for dir in ["snapshots", "hibernated"] {
        let left: Vec<_> = std::fs::read_dir(data.join(dir)).unwrap().collect();
        assert!(left.is_empty(), "{dir}: {left:?}");
    }
}
