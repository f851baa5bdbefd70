//! Snapshots on the process engine (a real sandboxd in-process, bubblewrap sandboxes):
//! the writable layer only (`"memory": false`), a fork sees the snapshot's files and
//! neither sees the other's later writes, hibernation is refused with a typed 409, the
//! byte quota answers 429 naming its key, tenants see only their own snapshots, and a
//! deleted or expired snapshot leaves no file.

use serde_json::{json, Value};
use testkit::{Daemon, Setup, TENANT_A, TENANT_B};

/// `[sizes.small]`'s memory and disk in the test config, which is what a new snapshot
/// counts against the byte quota until it is written.
const EXPECTED: u64 = (256 + 64) << 20;

async fn sh(d: &Daemon, id: &str, token: &str, script: &str) -> String {
    let r = d
        .exec(id, token, json!({"argv": ["sh", "-c", script]}))
        .await;
    assert_eq!(r.status, 200, "{script}: {}", r.text());
    r.json()["stdout"].as_str().unwrap().trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_snapshots_carry_the_writable_layer_only() {
    let d = Daemon::start(Setup {
        tenant_a_max_claims: 3,
        tail: format!("[snapshots]\nmax_bytes_per_tenant = {EXPECTED}\n"),
        ..Setup::default()
    })
    .await;
    let (parent, ptoken) = d.claim_as(TENANT_A).await;
    sh(
        &d,
        &parent,
        &ptoken,
        "echo kept > /tmp/f && mkdir -p /home/w && echo deep > /home/w/g",
    )
    .await;

    let path = format!("/v1/sandboxes/{parent}/snapshot");
    let r = d
        .call("POST", &path, Some(&ptoken), Some(r#"{"name":"p"}"#))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["memory"], false);
    let snap = r.json()["snapshot_id"].as_str().unwrap().to_string();
    let files = d.dir.join("snapshots").join(&snap);
    assert!(files.is_dir());

    // The byte quota: what the tenant holds plus a new snapshot's bound is over it.
    let r = d.call("POST", &path, Some(&ptoken), Some("{}")).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.text().contains("max_bytes_per_tenant"), "{}", r.text());
    assert_eq!(
        std::fs::read_dir(d.dir.join("snapshots")).unwrap().count(),
        1
    );

    // Hibernation would free nothing: a typed refusal, and the sandbox runs on.
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{parent}/hibernate"),
            Some(&ptoken),
            None,
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("cannot hibernate"), "{}", r.text());
    assert_eq!(sh(&d, &parent, &ptoken, "cat /tmp/f").await, "kept");
    assert!(!d.dir.join("hibernated").join(&parent).exists());

    // Another tenant cannot see, fork or delete it.
    let body = json!({ "snapshot": snap }).to_string();
    let r = d
        .call("POST", "/v1/claim", Some(TENANT_B), Some(&body))
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    let listed: Value = d
        .call("GET", "/v1/snapshots", Some(TENANT_B), None)
        .await
        .json();
    assert_eq!(listed["snapshots"], json!([]));
    let r = d
        .call(
            "DELETE",
            &format!("/v1/snapshots/{snap}"),
            Some(TENANT_B),
            None,
        )
        .await;
    assert_eq!(r.status, 404);

    // A fork: the files, its own writes, none of the parent's later ones.
    let r = d
        .call("POST", "/v1/claim", Some(TENANT_A), Some(&body))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (fork, ftoken) = (
        r.json()["id"].as_str().unwrap().to_string(),
        r.json()["token"].as_str().unwrap().to_string(),
    );
    assert_eq!(
        sh(&d, &fork, &ftoken, "cat /tmp/f /home/w/g").await,
        "kept\ndeep"
    );
    sh(&d, &fork, &ftoken, "echo mine > /tmp/fork-only").await;
    sh(&d, &parent, &ptoken, "echo later > /tmp/later").await;
    let parent_sees = sh(&d, &parent, &ptoken, "ls /tmp").await;
    assert!(!parent_sees.contains("fork-only"), "{parent_sees}");
    let fork_sees = sh(&d, &fork, &ftoken, "ls /tmp").await;
    assert!(!fork_sees.contains("later"), "{fork_sees}");

    let mine: Value = d
        .call("GET", "/v1/snapshots", Some(TENANT_A), None)
        .await
        .json();
    assert_eq!(mine["snapshots"][0]["memory"], false, "{mine}");
    assert_eq!(mine["snapshots"][0]["source"], parent.as_str(), "{mine}");
    let r = d
        .call(
            "DELETE",
            &format!("/v1/snapshots/{snap}"),
            Some(TENANT_A),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    assert!(!files.exists(), "the deleted snapshot's files stayed");
    let body = json!({ "snapshot": snap }).to_string();
    let r = d
        .call("POST", "/v1/claim", Some(TENANT_A), Some(&body))
        .await;
    assert_eq!(
        r.status,
        404,
        "a deleted snapshot cannot be forked: {}",
        r.text()
    );

    // A snapshot past its TTL is gone: unlisted, unforkable, its files deleted.
    let r = d
        .call("POST", &path, Some(&ptoken), Some(r#"{"ttl_seconds": 1}"#))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let short = r.json()["snapshot_id"].as_str().unwrap().to_string();
    let short_files = d.dir.join("snapshots").join(&short);
    testkit::wait_until(
        std::time::Duration::from_secs(30),
        "the expired snapshot deleted",
        async || !short_files.exists(),
    )
    .await;
    let listed: Value = d
        .call("GET", "/v1/snapshots", Some(TENANT_A), None)
        .await
        .json();
    assert_eq!(listed["snapshots"], json!([]));
    d.stop().await;
}
