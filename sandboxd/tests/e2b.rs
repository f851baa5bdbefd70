//! The official E2B Python SDK (pinned in `e2b/requirements.txt`, installed by `cargo
//! xtask deps`) against a real sandboxd: process engine, the `default` template aliased
//! as E2B's `base`, `[e2b]` on. The pytest suites under `e2b/tests/` hold the scenarios
//! (sync client, then async client, hostile requests among them); this test starts the
//! node, runs them, and checks that every sandbox they created was killed and that the
//! host is back where it started (processes, sandbox dirs, sockets, cgroups).

use std::time::Duration;

use testkit::e2b::{config_section, free_port, pytest};
use testkit::images::template_image;
use testkit::leftovers::Census;
use testkit::setup::uid_range;
use testkit::{wait_until, Daemon, Setup, ROOT, TENANT_A};

async fn node() -> (Daemon, u16) {
    // The daemon's warnings (incidents the E2B answers name) go to the test's output.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_test_writer()
        .try_init();
    let port = free_port();
    let setup = Setup {
        image: Some(template_image("default")),
        max_claims: 16,
        tenant_a_max_claims: 8,
        max_ttl_seconds: 600,
        disk_mib: 128,
        ..Setup::sdk()
    };
    let setup = Setup {
        tail: config_section(port, &setup.template()),
        ..setup
    };
    let daemon = Daemon::start(setup).await;
    listening(format!("127.0.0.1:{port}").parse().unwrap()).await;
    (daemon, port)
}

/// Waits until the E2B listener answers its liveness check.
async fn listening(addr: std::net::SocketAddr) {
    wait_until(
        Duration::from_secs(30),
        "the e2b listener answers",
        async || {
            testkit::try_call(testkit::Endpoint::Tcp(addr), "GET", "/health", None, None)
                .await
                .is_ok_and(|r| r.status == 204)
        },
    )
    .await;
}

async fn suite(port: u16, file: &'static str) {
    let out = tokio::task::spawn_blocking(move || pytest(port, TENANT_A, &[file], None))
        .await
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "pytest {file} failed:\n{text}");
}

/// Runs one suite file and checks what it left.
async fn scenarios(file: &'static str) {
    let (daemon, port) = node().await;
    daemon
        .wait_pool(Duration::from_secs(30), "1 warm", |p| p["warm"] == 1)
        .await;
    let census = Census::new(&daemon.dir, uid_range(&daemon.dir));
    let before = census.count();
    suite(port, file).await;
    let r = daemon.call("GET", "/v1/sandboxes", Some(ROOT), None).await;
    assert_eq!(r.json()["sandboxes"], serde_json::json!([]), "left behind");
    census.wait_back_to(&before).await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn official_sdk_sync_client() {
    scenarios("test_sync.py").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn official_sdk_async_client() {
    scenarios("test_async.py").await;
}

/// What the E2B surface keeps with a claim survives a restart that keeps sandboxes: the
/// metadata (filterable), the env vars, and the access token (from the node secret).
#[tokio::test(flavor = "multi_thread")]
async fn records_survive_a_restart() {
    use testkit::files_http::call_bytes;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let setup = Setup {
        on_stop: "keep",
        ..Setup::sdk()
    };
    let setup = Setup {
        tail: config_section(port, &setup.template()),
        ..setup
    };
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let key = [
        ("x-api-key", TENANT_A),
        ("content-type", "application/json"),
    ];
    let daemon = Daemon::start_in(dir.path(), &setup).await;
    listening(addr).await;
    let body =
        br#"{"templateID":"base","metadata":{"k":"v 1"},"envVars":{"E":"e1"},"timeout":300}"#;
    let r = call_bytes(addr, "POST", "/v2/sandboxes", "", &key, body.to_vec()).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let created = r.json();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    daemon.stop().await;

    let daemon = Daemon::start_in(dir.path(), &setup).await;
    listening(addr).await;
    // The SDK's filter: `metadata=` holds `k=v` pairs, each side percent-encoded again.
    let query = "/v2/sandboxes?metadata=k%3Dv%25201";
    let list = call_bytes(addr, "GET", query, "", &key, vec![])
        .await
        .json();
    assert_eq!(list[0]["sandboxID"], id.as_str(), "{list}");
    assert_eq!(list[0]["metadata"]["k"], "v 1");
    let path = format!("/v2/sandboxes/{id}/connect");
    let r = call_bytes(addr, "POST", &path, "", &key, b"{}".to_vec()).await;
    assert_eq!(r.json()["envdAccessToken"], created["envdAccessToken"]);
    let r = call_bytes(
        addr,
        "DELETE",
        &format!("/sandboxes/{id}"),
        "",
        &key,
        vec![],
    )
    .await;
    assert_eq!(r.status, 204);
    let r = call_bytes(addr, "GET", "/v2/sandboxes", "", &key, vec![]).await;
    assert_eq!(r.json(), serde_json::json!([]));
    daemon.stop().await;
}
