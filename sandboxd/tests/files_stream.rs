//! The file routes under load and over time, against the sandboxd binary (process
//! engine, real silkd): a watch as Server-Sent Events sees an exec's create, write and
//! delete and costs silkd nothing once the client leaves (threads and inotify fds counted
//! from `/proc`); a file the user may not read is 403; and a 1 GiB upload and download
//! keep sandboxd's RSS within a stated bound, far under the file's size.

use std::time::Duration;

use serde_json::json;
use testkit::files_stream::{generated_sha256, get_hashed, put_generated, silkd_watch_cost, Sse};
use testkit::{bins, wait_until, DaemonProcess, Listen, Setup};

/// sandboxd as the binary on TCP in `dir`, its sandboxes' memory `memory_mib`.
async fn start(dir: &std::path::Path, setup: &Setup, memory_mib: u64) -> DaemonProcess {
    let text = setup
        .toml(&dir.join("data"), &Listen::Tcp.address(dir))
        .replace("memory_mib = 256", &format!("memory_mib = {memory_mib}"));
    DaemonProcess::start(bins::sandboxd(), dir, &text).await
}

#[tokio::test]
async fn a_watch_over_sse_sees_an_exec_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let setup = Setup {
        warm: 0,
        ..Setup::default()
    };
    let d = start(tmp.path(), &setup, 256).await;
    let uids = testkit::setup::uid_range(&tmp.path().join("data"));
    let addr = d.addr();
    let (id, token) = d.claim().await;
    let route = |q: &str| format!("/v1/sandboxes/{id}/fs/watch?{q}");
    let script = "mkdir -p /tmp/w && echo s > /tmp/secret && chmod 000 /tmp/secret";
    let r = d
        .exec(&id, &token, json!({"argv": ["sh", "-c", script]}))
        .await;
    assert_eq!(r.json()["exit_code"], 0, "{}", r.text());
    let (threads_before, inotify_before) = silkd_watch_cost(uids.clone());
    assert!(threads_before > 0, "no silkd found running as {uids:?}");

    let mut sse = Sse::open(addr, &route("path=/tmp/w"), &token).await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.next().await, Some((":".into(), "watching".into())));
    // The count sees a watch: one more inotify fd while it is open.
    assert_eq!(silkd_watch_cost(uids.clone()).1, inotify_before + 1);
    let script = "echo one > /tmp/w/f && echo two >> /tmp/w/f && rm /tmp/w/f";
    let r = d
        .exec(&id, &token, json!({"argv": ["sh", "-c", script]}))
        .await;
    assert_eq!(r.json()["exit_code"], 0, "{}", r.text());
    let mut seen: Vec<String> = Vec::new();
    while !seen.iter().any(|k| k == "delete") {
        let (event, data) = tokio::time::timeout(Duration::from_secs(20), sse.next())
            .await
            .expect("no event within 20 s")
            .expect("the stream ended early");
        let v: serde_json::Value = serde_json::from_str(&data).unwrap();
        assert_eq!(
            (v["kind"].as_str(), v["path"].as_str()),
            (Some(event.as_str()), Some("/tmp/w/f"))
        );
        if seen.last() != Some(&event) {
            seen.push(event);
        }
    }
    assert_eq!(seen, ["create", "modify", "delete"]);
    // The client leaves: silkd drops the watch and its thread.
    drop(sse);
    wait_until(
        Duration::from_secs(30),
        "the watch gone from silkd",
        async || {
            let (threads, inotify) = silkd_watch_cost(uids.clone());
            (inotify == inotify_before && threads <= threads_before)
                .then_some(())
                .ok_or(format!(
                    "{threads} threads (had {threads_before}), {inotify} inotify fds"
                ))
        },
    )
    .await;

    // Typed refusals: not a directory, missing, an unknown parameter; then a read-only path.
    for (q, status) in [
        ("path=/tmp/secret", 400),
        ("path=/tmp/nope", 404),
        ("path=/tmp/w&bogus=1", 400),
    ] {
        let sse = Sse::open(addr, &route(q), &token).await;
        assert_eq!(sse.status, status, "{q}");
    }
    // The sandbox's root (the base image has no other user) holds DAC_OVERRIDE inside its
    // user namespace, so a mode-000 file is readable; the read-only template tree is not
    // writable by anyone (EROFS): 403, and nothing appears.
    let r = testkit::files_http::call_bytes(
        addr,
        "PUT",
        &format!("/v1/sandboxes/{id}/files?path=/etc/planted"),
        &token,
        &[],
        b"x".to_vec(),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.json()["error"].as_str().is_some(), "{}", r.text());
}

/// Largest growth of sandboxd's RSS over its level before the transfers: far under the
/// 1 GiB file, and a sum of the bounded queues (a few MiB) plus allocator slack.
const RSS_BOUND_KIB: u64 = 64 * 1024;

#[tokio::test]
async fn a_gibibyte_up_and_down_keeps_sandboxds_memory_bounded() {
    const LEN: u64 = 1 << 30;
    let tmp = tempfile::tempdir().unwrap();
    let setup = Setup {
        warm: 0,
        disk_mib: 1100,
        ..Setup::default()
    };
    // The file lives in the sandbox's tmpfs, which its memory cgroup is charged for.
    let mut d = start(tmp.path(), &setup, 1400).await;
    let pid = d.process().pid();
    let addr = d.addr();
    let (id, token) = d.claim().await;
    let url = format!("/v1/sandboxes/{id}/files?path=/tmp/big");
    // Warm the paths once (allocator arenas, connection buffers), then take the baseline.
    let (status, _) = put_generated(addr, &url, &token, 4 << 20).await;
    assert_eq!(status, 200);
    assert_eq!(get_hashed(addr, &url, &token).await.1, 4 << 20);
    let rss = move || testkit::procs::status_field(pid, "VmRSS:").expect("sandboxd's VmRSS");
    let start_kib = rss();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(start_kib));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let (status, body) = put_generated(addr, &url, &token, LEN).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, n, sha) = get_hashed(addr, &url, &token).await;
    sampler.abort();
    assert_eq!((status.as_u16(), n), (200, LEN));
    assert!(
        sha == generated_sha256(LEN),
        "the 1 GiB came back different"
    );
    let peak_kib = peak.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        peak_kib <= start_kib + RSS_BOUND_KIB,
        "sandboxd's RSS went from {start_kib} KiB to {peak_kib} KiB moving 1 GiB"
    );
    eprintln!("sandboxd RSS: {start_kib} KiB before, {peak_kib} KiB at most while moving 1 GiB");
}
