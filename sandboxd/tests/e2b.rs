//! The official E2B Python SDK (pinned in `e2b/requirements.txt`, installed by `cargo
//! xtask deps`) against a real sandboxd: process engine, the `default` template aliased
//! as E2B's `base`, `[e2b]` on. The pytest suites under `e2b/tests/` hold the scenarios
//! (sync client, then async client); this test starts the node, runs them, and checks
//! that every sandbox they created was killed.

use testkit::e2b::{config_section, free_port, pytest};
use testkit::images::template_image;
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
    let health = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until(
        std::time::Duration::from_secs(30),
        "the e2b listener answers",
        async || {
            testkit::try_call(testkit::Endpoint::Tcp(health), "GET", "/health", None, None)
                .await
                .is_ok_and(|r| r.status == 204)
        },
    )
    .await;
    (daemon, port)
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

async fn no_sandboxes_left(daemon: &Daemon) {
    let r = daemon.call("GET", "/v1/sandboxes", Some(ROOT), None).await;
    assert_eq!(r.json()["sandboxes"], serde_json::json!([]), "left behind");
}

#[tokio::test(flavor = "multi_thread")]
async fn official_sdk_sync_client() {
    let (daemon, port) = node().await;
    suite(port, "test_sync.py").await;
    no_sandboxes_left(&daemon).await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn official_sdk_async_client() {
    let (daemon, port) = node().await;
    suite(port, "test_async.py").await;
    no_sandboxes_left(&daemon).await;
    daemon.stop().await;
}
