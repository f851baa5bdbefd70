//! The file routes through a real sandboxd (process engine, real silkd under bwrap):
//! exact round trips of random binary files, ranges, listing, delete, an upload cut off
//! halfway that leaves nothing, a disk-full upload (507, nothing left), missing paths
//! (404), archives in and out with a hostile one refused, a watch seeing an exec's
//! changes as Server-Sent Events, and another sandbox's token answered 404.

use std::time::Duration;

use serde_json::json;
use testkit::files_http::{call_bytes, put_cut_off};
use testkit::silkd_files::{random_bytes, raw_tar_entry};
use testkit::{wait_until, Daemon, Setup};

#[tokio::test]
async fn files_over_http() {
    let daemon = Daemon::start(Setup::default()).await;
    let addr = daemon.addr();
    let (id, token) = daemon.claim().await;
    let url = |route: &str, q: &str| format!("/v1/sandboxes/{id}/{route}?{q}");
    // Exact round trips: 0 B, 1 B, 8 MiB + 1 (the disk is 64 MiB).
    for (i, len) in [0usize, 1, 8 * 1024 * 1024 + 1].into_iter().enumerate() {
        let data = random_bytes(len, i as u64);
        let path = url("files", &format!("path=/tmp/d/f{len}"));
        let r = call_bytes(addr, "PUT", &path, &token, &[], data.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["size"], len);
        let r = call_bytes(addr, "GET", &path, &token, &[], vec![]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["content-length"], len.to_string());
        assert!(r.body == data, "{len} B differ");
    }
    // Ranges.
    let data = random_bytes(1000, 9);
    let path = url("files", "path=/tmp/d/r");
    call_bytes(addr, "PUT", &path, &token, &[], data.clone()).await;
    for (range, want, content_range) in [
        ("bytes=10-19", &data[10..20], "bytes 10-19/1000"),
        ("bytes=990-", &data[990..], "bytes 990-999/1000"),
        ("bytes=-5", &data[995..], "bytes 995-999/1000"),
    ] {
        let r = call_bytes(addr, "GET", &path, &token, &[("range", range)], vec![]).await;
        assert_eq!(r.status, 206, "{range}");
        assert_eq!(&r.body[..], want, "{range}");
        assert_eq!(r.headers["content-range"], content_range);
    }
    let r = call_bytes(
        addr,
        "GET",
        &path,
        &token,
        &[("range", "bytes=1000-")],
        vec![],
    )
    .await;
    assert_eq!(r.status, 416);
    // Listing, stat, missing paths, bad paths, delete.
    let r = daemon
        .call("GET", &url("fs", "path=/tmp/d"), Some(&token), None)
        .await;
    let names: Vec<String> = r.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["f0", "f1", "f8388609", "r"]);
    let r = daemon
        .call("GET", &url("fs", "path=/tmp/d/r"), Some(&token), None)
        .await;
    assert_eq!(
        (r.json()["type"].as_str(), r.json()["size"].as_u64()),
        (Some("file"), Some(1000))
    );
    for (method, q, status) in [
        ("GET", url("files", "path=/tmp/nope"), 404),
        ("GET", url("fs", "path=/tmp/nope"), 404),
        ("GET", url("files", "path=/tmp/d"), 400),
        ("GET", url("files", "path=a%00b"), 400),
        ("GET", url("files", "nopath=1"), 400),
        ("DELETE", url("fs", "path=/tmp/d"), 400),
        ("PUT", url("files", "path=/proc/nope/x"), 404),
    ] {
        let r = daemon.call(method, &q, Some(&token), None).await;
        assert_eq!(r.status, status, "{method} {q}: {}", r.text());
    }
    let r = daemon
        .call(
            "DELETE",
            &url("fs", "path=/tmp/d&recursive=true"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    let r = daemon
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/fs/mkdir"),
            Some(&token),
            Some(r#"{"path": "/tmp/m/n"}"#),
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = daemon
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/fs/rename"),
            Some(&token),
            Some(r#"{"from": "/tmp/m/n", "to": "/tmp/m/o"}"#),
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());

    // An upload cut off halfway leaves nothing at the target, nor a temp file.
    put_cut_off(
        addr,
        &url("files", "path=/tmp/cut"),
        &token,
        4 << 20,
        &[1; 1 << 20],
    )
    .await;
    wait_until(
        Duration::from_secs(30),
        "no temp file in /tmp",
        async || {
            let r = daemon
                .exec(&id, &token, json!({"argv": ["sh", "-c", "ls -a /tmp"]}))
                .await;
            let out = r.json()["stdout"].as_str().unwrap_or_default().to_string();
            (!out.contains(".silkd-") && !out.contains("cut"))
                .then_some(())
                .ok_or(out)
        },
    )
    .await;
    // Past the disk (64 MiB): 507 and nothing left.
    let r = call_bytes(
        addr,
        "PUT",
        &url("files", "path=/tmp/huge"),
        &token,
        &[],
        vec![7; 80 << 20],
    )
    .await;
    assert_eq!(r.status, 507, "{}", r.text());
    let r = daemon
        .exec(
            &id,
            &token,
            json!({"argv": ["sh", "-c", "ls -a /tmp; df -k /tmp"]}),
        )
        .await;
    let out = r.json()["stdout"].as_str().unwrap().to_string();
    assert!(!out.contains("huge") && !out.contains(".silkd-"), "{out}");

    // Archives: out and back in; a hostile one refused.
    let script = "mkdir -p /tmp/src/a/b && echo x > /tmp/src/a/b/f && chmod 750 /tmp/src/a/b/f && ln -s b/f /tmp/src/a/l";
    assert_eq!(
        daemon
            .exec(&id, &token, json!({"argv": ["sh", "-c", script]}))
            .await
            .status,
        200
    );
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
    let r = daemon
        .exec(
            &id,
            &token,
            json!({"argv": ["sh", "-c", "cat /tmp/dst/a/l; stat -c %a /tmp/dst/a/b/f"]}),
        )
        .await;
    assert_eq!(r.json()["stdout"], "x\n750\n");
    let evil = raw_tar_entry("../evil", tar::EntryType::Regular, None, b"x");
    let r = call_bytes(
        addr,
        "PUT",
        &url("archive", "path=/tmp/e/in"),
        &token,
        &[],
        evil,
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());

    // Another sandbox's token: 404.
    let (_, other) = daemon.claim().await;
    let r = daemon
        .call("GET", &url("fs", "path=/tmp"), Some(&other), None)
        .await;
    assert_eq!(r.status, 404);
    daemon.stop().await;
}
