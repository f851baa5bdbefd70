//! `cargo xtask bench restart`, qemu case: how long a restarted sandboxd takes to
//! re-adopt 8 claimed VMs (TCG). Runs the real binary with `on_stop = "keep"` and a warm
//! pool of 1, claims 8 VMs, `kill -9`s it and starts it again on the same data_dir; the
//! baseline is the same kill and restart with no claim, measured in the same process.
//! Prints the reconciliation time sandboxd logs (each VM proven ours, its channel
//! re-opened through a fresh session handshake, `Info` answered; then the sweep), the
//! start-to-serving wall time of both and their ratio; then checks every VM answers an
//! exec. 8, not 50 as for the process engine: each VM is a TCG guest on a small host.
//!
//! Needs QEMU and `cargo xtask image`.

use std::path::Path;

use serde_json::json;
use testkit::restart::kill_and_restart;
use testkit::{DaemonProcess, ROOT};

// A debug build is `cargo xtask bench --quick`'s smoke run: small counts.
const VMS: usize = if cfg!(debug_assertions) { 2 } else { 8 };

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_restart_vm: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn config(dir: &Path) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
on_stop = "keep"
boot_timeout_seconds = 60
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
warm = 1
warm_max = 2
"#,
        data = dir.join("data").display(),
        mem = dir.join("shm").display(),
        image = testkit::vm::require().display(),
    )
}

async fn bench() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let text = config(dir.path());
    let sandboxd = testkit::bins::debug_dir().join("sandboxd");
    let mut first = DaemonProcess::start(&sandboxd, dir.path(), &text).await;
    // The golden is built once; both restarts below re-use it (its stamp matches).
    first
        .wait_pool(std::time::Duration::from_secs(180), "1 warm VM", |p| {
            p["warm"] == 1
        })
        .await;
    let (mut empty, empty_wall, empty_reconcile) =
        kill_and_restart(&mut first, &sandboxd, dir.path(), &text).await?;
    let mut claimed = Vec::new();
    for _ in 0..VMS {
        claimed.push(empty.claim().await);
    }
    let (second, wall, reconcile) =
        kill_and_restart(&mut empty, &sandboxd, dir.path(), &text).await?;
    let mut answered = 0;
    for (id, token) in &claimed {
        let r = second.exec(id, token, json!({"argv": ["true"]})).await;
        if r.status == 200 {
            answered += 1;
        }
    }
    println!("restart after kill -9 (qemu engine, TCG, warm pool of 1 rebuilt each time):");
    println!(
        "  no claims:     start to serving {:>8.1} ms, reconcile {empty_reconcile}",
        empty_wall.as_secs_f64() * 1e3
    );
    println!(
        "  {VMS} VMs:         start to serving {:>8.1} ms, reconcile {reconcile}",
        wall.as_secs_f64() * 1e3
    );
    println!(
        "  ratio ({VMS} VMs / none, start to serving): {:.2}",
        wall.as_secs_f64() / empty_wall.as_secs_f64()
    );
    println!("  VMs answering exec after the restart: {answered}/{VMS}");
    for (id, _) in &claimed {
        let path = format!("/v1/sandboxes/{id}/release");
        let _ = second.call("POST", &path, Some(ROOT), None).await;
    }
    if answered != VMS {
        return Err(format!("only {answered} of {VMS} VMs came back"));
    }
    drop(second);
    drop(empty);
    drop(first);
    Ok(())
}
