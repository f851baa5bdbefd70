//! The HTTP API against a real sandboxd, silkd and bubblewrap: the auth matrix on every
//! route, claim limits, TTL expiry, pool targets online and across restarts, goldens
//! (warmup failure, stamp reuse and mismatch), and the relay.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::json;
use testkit::procs::{assert_gone, marker, wait_running};
use testkit::relay::{upgrade, upgrade_with};
use testkit::{Daemon, Setup, ROOT, TENANT_A, TENANT_B};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

/// The five kinds of caller the auth matrix tries.
#[derive(Clone, Copy, Debug)]
enum Who {
    Nobody,
    Root,
    Tenant,
    Own,
    Other,
}

const WHO: [Who; 5] = [Who::Nobody, Who::Root, Who::Tenant, Who::Own, Who::Other];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_matrix_on_every_route() {
    let d = Daemon::start(Setup {
        warm: 2,
        ..Setup::default()
    })
    .await;
    let (other_id, other_token) = d.claim().await;
    let _ = other_id;
    let token_for = |who: Who, own: &str| -> Option<String> {
        match who {
            Who::Nobody => None,
            Who::Root => Some(ROOT.into()),
            Who::Tenant => Some(TENANT_A.into()),
            Who::Own => Some(own.into()),
            Who::Other => Some(other_token.clone()),
        }
    };
    // A token nobody issued is 401 everywhere but /healthz.
    let r = d.call("GET", "/v1/info", Some("bogus-token"), None).await;
    assert_eq!(r.status, 401);

    // (method, path template, body, expected per WHO). Release goes last: it destroys.
    let pools_body = r#"{"pools":[{"template":"base","size":"small","warm":2,"warm_max":4}]}"#;
    let table: Vec<(&str, &str, Option<&str>, [u16; 5])> = vec![
        ("GET", "/healthz", None, [200, 200, 200, 200, 200]),
        ("GET", "/metrics", None, [401, 200, 403, 403, 403]),
        ("GET", "/v1/info", None, [401, 200, 403, 403, 403]),
        (
            "PUT",
            "/v1/pools",
            Some(pools_body),
            [401, 200, 403, 403, 403],
        ),
        ("GET", "/v1/sandboxes", None, [401, 200, 200, 403, 403]),
        ("GET", "/v1/sandboxes/{id}", None, [401, 200, 403, 403, 403]),
        (
            "POST",
            "/v1/sandboxes/{id}/renew",
            Some(r#"{"ttl_seconds":30}"#),
            [401, 200, 403, 200, 404],
        ),
        (
            "POST",
            "/v1/sandboxes/{id}/exec",
            Some(r#"{"argv":["true"]}"#),
            [401, 200, 403, 200, 404],
        ),
        (
            "GET",
            "/v1/sandboxes/{id}/agent",
            None,
            [401, 101, 403, 101, 404],
        ),
    ];
    let (id, own) = d.claim().await;
    for (method, template, body, expected) in &table {
        let path = template.replace("{id}", &id);
        for (who, want) in WHO.iter().zip(expected) {
            let token = token_for(*who, &own);
            let status = if path.ends_with("/agent") {
                upgrade(d.addr(), &path, token.as_deref()).await.0
            } else {
                d.call(method, &path, token.as_deref(), *body)
                    .await
                    .status
                    .as_u16()
            };
            assert_eq!(status, *want, "{method} {template} as {who:?}");
        }
    }
    // Claim: root and tenants may; sandbox tokens may not.
    for (who, want) in WHO.iter().zip([401u16, 200, 200, 403, 403]) {
        let r = d
            .call(
                "POST",
                "/v1/claim",
                token_for(*who, &own).as_deref(),
                Some("{}"),
            )
            .await;
        assert_eq!(r.status.as_u16(), want, "claim as {who:?}: {}", r.text());
    }
    // Release: nobody 401, tenant 403, another sandbox's token 404, then the sandbox
    // itself 204, and again 404 (its token stays known); root releases any by id.
    let release = format!("/v1/sandboxes/{id}/release");
    for (who, want) in [
        (Who::Nobody, 401u16),
        (Who::Tenant, 403),
        (Who::Other, 404),
        (Who::Own, 204),
        (Who::Own, 404),
        (Who::Root, 404),
    ] {
        let r = d
            .call("POST", &release, token_for(who, &own).as_deref(), None)
            .await;
        assert_eq!(r.status.as_u16(), want, "release as {who:?}");
    }
    let (id2, _) = d.claim().await;
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{id2}/release"),
            Some(ROOT),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    // Unknown ids are 404 for root; unknown routes 404; wrong methods 405.
    let r = d
        .call("GET", "/v1/sandboxes/sb-nope", Some(ROOT), None)
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(
        d.call("GET", "/v1/nope", Some(ROOT), None).await.status,
        404
    );
    assert_eq!(
        d.call("DELETE", "/v1/claim", Some(ROOT), None).await.status,
        405
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_limits_list_and_renew() {
    let d = Daemon::start(Setup {
        max_claims: 3,
        warm: 0,
        ..Setup::default()
    })
    .await;
    let (a1, _) = d.claim_as(TENANT_A).await;
    let (_a2, _) = d.claim_as(TENANT_A).await;
    let r = d.call("POST", "/v1/claim", Some(TENANT_A), None).await;
    assert_eq!(r.status, 429, "tenant limit: {}", r.text());
    let (b1, _) = d.claim_as(TENANT_B).await;
    // Node limit (3) reached: root too gets 429.
    let r = d.call("POST", "/v1/claim", Some(ROOT), Some("{}")).await;
    assert_eq!(r.status, 429, "node limit: {}", r.text());

    // A tenant lists only its own; root lists all; no tokens anywhere.
    let r = d.call("GET", "/v1/sandboxes", Some(TENANT_B), None).await;
    let list = r.json()["sandboxes"].as_array().unwrap().clone();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["id"], b1.as_str());
    assert_eq!(list[0]["tenant"], "b");
    let r = d.call("GET", "/v1/sandboxes", Some(ROOT), None).await;
    assert_eq!(r.json()["sandboxes"].as_array().unwrap().len(), 3);
    assert!(!r.text().contains("token"));

    // Renew is clamped to max_ttl_seconds (120).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{a1}/renew"),
            Some(ROOT),
            Some(r#"{"ttl_seconds": 1000000}"#),
        )
        .await;
    let deadline = r.json()["deadline"].as_u64().unwrap();
    assert!(
        deadline >= now + 119 && deadline <= now + 121,
        "{deadline} vs {now}"
    );
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{a1}/renew"),
            Some(ROOT),
            Some(r#"{"ttl_seconds": 5, "extra": 1}"#),
        )
        .await;
    assert_eq!(r.status, 400);

    // Releasing frees the tenant's slot.
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{a1}/release"),
            Some(ROOT),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    d.claim_as(TENANT_A).await;
    // Unknown template or size → 400.
    for body in [
        r#"{"template":"nope"}"#,
        r#"{"size":"huge"}"#,
        r#"{"ttl":1}"#,
    ] {
        let r = d.call("POST", "/v1/claim", Some(ROOT), Some(body)).await;
        assert_eq!(r.status, 400, "{body}");
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_kills_running_command() {
    let d = Daemon::start(Setup::default()).await;
    let r = d
        .call(
            "POST",
            "/v1/claim",
            Some(ROOT),
            Some(r#"{"ttl_seconds": 1}"#),
        )
        .await;
    let v = r.json();
    let (id, token) = (
        v["id"].as_str().unwrap().to_string(),
        v["token"].as_str().unwrap().to_string(),
    );
    let m = marker(10);
    let addr = d.addr();
    let (id2, token2, m2) = (id.clone(), token.clone(), m.clone());
    let running = tokio::spawn(async move {
        let body = json!({"argv": ["sleep", m2]}).to_string();
        testkit::call(
            addr,
            "POST",
            &format!("/v1/sandboxes/{id2}/exec"),
            Some(&token2),
            Some(&body),
        )
        .await
    });
    wait_running(&m).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("exec still hanging after the deadline")
        .unwrap();
    assert_eq!(answer.status, 502, "{}", answer.text());
    assert_gone(&m).await;
    let r = d
        .call("GET", &format!("/v1/sandboxes/{id}"), Some(ROOT), None)
        .await;
    assert_eq!(r.status, 404);
    let r = d.call("GET", "/metrics", Some(ROOT), None).await;
    assert!(
        r.text().contains("sandboxd_expired_total 1"),
        "{}",
        r.text()
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_put_validates_changes_online_and_persists() {
    let tmp = tempfile::tempdir().unwrap();
    let setup = Setup {
        warm: 1,
        ..Setup::default()
    };
    let d = Daemon::start_in(tmp.path(), &setup).await;
    d.wait_pool(Duration::from_secs(10), "1 warm", |p| p["warm"] == 1)
        .await;
    for body in [
        r#"{"pools":[{"template":"base","size":"small","warm":1,"warm_max":4,"warmup":["true"]}]}"#,
        r#"{"pools":[{"template":"base","size":"small","warm":1,"warm_max":4,"no_balloon":true}]}"#,
        r#"{"pools":[{"template":"base","size":"small","warm":1,"warm_max":4,"x":1}]}"#,
        r#"{"pools":[{"template":"base","size":"small","warm":5,"warm_max":4}]}"#,
        r#"{"pools":[{"template":"nope","size":"small","warm":1,"warm_max":4}]}"#,
        r#"{"pools":[{"template":"base","size":"small","warm":1,"warm_max":4},
                     {"template":"base","size":"small","warm":1,"warm_max":4}]}"#,
        r#"{"targets":[]}"#,
    ] {
        let r = d.call("PUT", "/v1/pools", Some(ROOT), Some(body)).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
    let r = d
        .call(
            "PUT",
            "/v1/pools",
            Some(ROOT),
            Some(r#"{"pools":[{"template":"base","size":"small","warm":3,"warm_max":4}]}"#),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    d.wait_pool(Duration::from_secs(10), "3 warm", |p| {
        p["warm"] == 3 && p["target"] == 3
    })
    .await;
    // Absent from the list → drained.
    let r = d
        .call("PUT", "/v1/pools", Some(ROOT), Some(r#"{"pools":[]}"#))
        .await;
    assert_eq!(r.status, 200);
    d.wait_pool(Duration::from_secs(10), "drained", |p| {
        p["warm"] == 0 && p["target"] == 0
    })
    .await;
    let r = d
        .call(
            "PUT",
            "/v1/pools",
            Some(ROOT),
            Some(r#"{"pools":[{"template":"base","size":"small","warm":2,"warm_max":4}]}"#),
        )
        .await;
    assert_eq!(r.status, 200);
    d.stop().await;

    // Same config: the saved target (2) survives the restart.
    let d = Daemon::start_in(tmp.path(), &setup).await;
    let info = d
        .wait_pool(Duration::from_secs(10), "2 warm", |p| p["warm"] == 2)
        .await;
    assert_eq!(info["pools"][0]["target"], 2);
    assert_eq!(info["warnings"], json!([]));
    d.stop().await;

    // The config's own pool list changed: the config wins, with a warning.
    let changed = Setup {
        warm: 1,
        warm_max: 6,
        ..Setup::default()
    };
    let d = Daemon::start_in(tmp.path(), &changed).await;
    let info = d.info().await;
    assert_eq!(info["pools"][0]["target"], 1, "{info}");
    assert_eq!(info["pools"][0]["warm_max"], 6);
    assert!(
        info["warnings"][0]
            .as_str()
            .unwrap()
            .contains("config file wins"),
        "{info}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_failure_is_reported_and_retried() {
    let d = Daemon::start(Setup {
        warmup: Some(r#"["sh", "-c", "echo warmup-boom >&2; exit 3"]"#.into()),
        ..Setup::default()
    })
    .await;
    let info = d
        .wait_pool(Duration::from_secs(10), "a second failed build", |p| {
            p["golden"]["state"] == "failed" && p["golden"]["builds"].as_u64() >= Some(2)
        })
        .await;
    let pool = &info["pools"][0];
    let err = pool["golden"]["last_error"].as_str().unwrap();
    assert!(
        err.contains("warmup") && err.contains("warmup-boom"),
        "{err}"
    );
    assert_eq!(pool["warm"], 0);
    // Claims still work, on demand.
    let (id, token) = d.claim().await;
    let r = d.exec(&id, &token, json!({"argv": ["true"]})).await;
    assert_eq!(r.status, 200);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_stamp_is_reused_and_mismatch_rebuilds() {
    let tmp = tempfile::tempdir().unwrap();
    let setup = Setup {
        warmup: Some(r#"["true"]"#.into()),
        ..Setup::default()
    };
    let ready = |p: &serde_json::Value| p["golden"]["state"] == "ready";
    let d = Daemon::start_in(tmp.path(), &setup).await;
    let info = d.wait_pool(Duration::from_secs(10), "golden", ready).await;
    let stamp = info["pools"][0]["golden"]["stamp"].clone();
    assert_eq!(info["pools"][0]["golden"]["builds"], 1);
    d.stop().await;
    let stamp_file = tmp.path().join("goldens/base.small.stamp");
    assert_eq!(
        std::fs::read_to_string(&stamp_file).unwrap(),
        stamp.as_str().unwrap()
    );

    // Restart, same inputs: the stamp matches and nothing is rebuilt.
    let d = Daemon::start_in(tmp.path(), &setup).await;
    let info = d.wait_pool(Duration::from_secs(10), "golden", ready).await;
    assert_eq!(info["pools"][0]["golden"]["builds"], 0, "{info}");
    assert_eq!(info["pools"][0]["golden"]["stamp"], stamp);
    d.stop().await;

    // A stamp that does not match (stale or corrupt) rebuilds.
    std::fs::write(&stamp_file, "0000").unwrap();
    let d = Daemon::start_in(tmp.path(), &setup).await;
    let info = d.wait_pool(Duration::from_secs(10), "golden", ready).await;
    assert_eq!(info["pools"][0]["golden"]["builds"], 1, "{info}");
    assert_eq!(info["pools"][0]["golden"]["stamp"], stamp);
    d.stop().await;

    // A changed input (warmup) changes the stamp and rebuilds.
    let changed = Setup {
        warmup: Some(r#"["sh", "-c", "true"]"#.into()),
        ..Setup::default()
    };
    let d = Daemon::start_in(tmp.path(), &changed).await;
    let info = d.wait_pool(Duration::from_secs(10), "golden", ready).await;
    assert_eq!(info["pools"][0]["golden"]["builds"], 1, "{info}");
    assert_ne!(info["pools"][0]["golden"]["stamp"], stamp);
    d.stop().await;
}

/// Sends a relay request on a fresh connection; returns the status and, on 101, the
/// connection with any bytes read past the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_speaks_wire_and_half_closes() {
    let d = Daemon::start(Setup::default()).await;
    let (id, token) = d.claim().await;
    let path = format!("/v1/sandboxes/{id}/agent");
    let (status, _, _) = upgrade_with(d.addr(), &path, Some(&token), false).await;
    assert_eq!(status, 426);
    let (status, _, _) = upgrade(d.addr(), "/v1/sandboxes/sb-unknown/agent", Some(ROOT)).await;
    assert_eq!(status, 404);

    let (status, stream, rest) = upgrade(d.addr(), &path, Some(&token)).await;
    assert_eq!(status, 101);
    assert!(rest.is_empty());
    let mut conn = Framed::new(stream, HostCodec::new());
    conn.send(Request::Info).await.unwrap();
    assert!(matches!(
        conn.next().await.unwrap().unwrap(),
        Response::Info { .. }
    ));
    conn.send(Request::Exec {
        detach: false,
        pty: None,
        argv: vec!["sh".into(), "-c".into(), "printf hi".into()],
        cwd: None,
        env: None,
        stdin: false,
        timeout_ms: None,
        user: None,
    })
    .await
    .unwrap();
    let mut out = Vec::new();
    loop {
        match conn.next().await.unwrap().unwrap() {
            Response::Started { .. } => {}
            Response::Stdout { data } => out.extend(data),
            Response::Exit { code, .. } => {
                assert_eq!(code, Some(0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(out, b"hi");
    // Half-close: our write side ends, yet the answer to the last request still arrives,
    // then the relay closes its side too.
    conn.send(Request::Info).await.unwrap();
    let mut stream = conn.into_inner();
    stream.shutdown().await.unwrap();
    let mut conn = Framed::new(stream, HostCodec::new());
    assert!(matches!(
        conn.next().await.unwrap().unwrap(),
        Response::Info { .. }
    ));
    let end = tokio::time::timeout(Duration::from_secs(5), conn.next())
        .await
        .expect("relay did not close after the half-close");
    assert!(end.is_none());

    // A guest that is gone answers 502, before any 101.
    let r = d
        .exec(&id, &token, json!({"argv": ["sh", "-c", "kill -9 $PPID"]}))
        .await;
    assert_eq!(r.status, 502);
    let (status, _, _) = upgrade(d.addr(), &path, Some(&token)).await;
    assert_eq!(status, 502);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listens_on_a_unix_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("api.sock");
    let text = Setup {
        warm: 0,
        ..Setup::default()
    }
    .toml(tmp.path(), &format!("unix:{}", sock.display()));
    let d = Daemon::start_text(tmp.path(), &text).await;
    assert_eq!(d.endpoint, testkit::Endpoint::Unix(sock.clone()));
    let info = d.info().await;
    assert_eq!(info["engine"]["name"], "process");
    d.stop().await;
    assert!(!sock.exists(), "socket file removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_a_golden_build_is_bounded_and_clean() {
    let m = marker(11);
    let d = Daemon::start(Setup {
        warmup: Some(format!(r#"["sleep", "{m}"]"#)),
        ..Setup::default()
    })
    .await;
    wait_running(&m).await;
    let started = std::time::Instant::now();
    d.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "stop took {:?}",
        started.elapsed()
    );
    assert_gone(&m).await;
}
