//! The official E2B Python SDK's pause and resume against the real `sandboxd` binary on
//! the QEMU engine (TCG, the `default` template aliased as E2B's `base`): pause is
//! hibernate, connect and agent calls wake. The scenarios are in
//! `e2b/tests/test_pause_vm.py`; this test starts the node, runs them, and checks that
//! no sandbox, QEMU or hibernation file is left.

use std::path::Path;

use testkit::e2b::{config_section, free_port, pytest};
use testkit::images::template_image;
use testkit::{DaemonProcess, ROOT, TENANT_A};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxd");

fn config(tmp: &Path, port: u16) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
on_stop = "destroy"
boot_timeout_seconds = 90
warmup_timeout_seconds = 90

[[tenants]]
name = "a"
token = "{TENANT_A}"
max_claims = 4

[qemu]
accel = "tcg"
memory_dir = "{mem}"

[templates.default]
image = "{image}"

[sizes.small]
cpus = 1
memory_mib = 384
disk_mib = 64

[[pools]]
template = "default"
size = "small"
warm = 0
warm_max = 1
{e2b}"#,
        data = tmp.join("data").display(),
        mem = tmp.join("shm").display(),
        image = template_image("default").display(),
        e2b = config_section(port, "default"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdk_pause_and_connect_on_qemu() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("shm")).unwrap();
    let port = free_port();
    let d = DaemonProcess::start(BIN, tmp.path(), &config(tmp.path(), port)).await;
    let info = d.call("GET", "/v1/info", Some(ROOT), None).await.json();
    assert_eq!(info["engine"]["name"], "qemu", "{info}");

    let out =
        tokio::task::spawn_blocking(move || pytest(port, TENANT_A, &["test_pause_vm.py"], None))
            .await
            .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "pytest failed:\n{text}");

    let r = d.call("GET", "/v1/sandboxes", Some(ROOT), None).await;
    assert_eq!(r.json()["sandboxes"], serde_json::json!([]), "left behind");
    let hibernated = tmp.path().join("data/hibernated");
    let left: Vec<_> = std::fs::read_dir(&hibernated)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "hibernation files left: {left:?}");
}
