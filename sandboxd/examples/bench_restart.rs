//! `cargo xtask bench restart`: how long a restarted sandboxd takes to re-adopt 50 claimed
//! process-engine sandboxes. Runs the real binary with `on_stop = "keep"`, claims 50
//! sandboxes, `kill -9`s it and starts it again on the same data_dir; the baseline is the
//! same kill and restart with no claim, measured in the same process. Prints the
//! reconciliation time sandboxd logs (records read, each guest proven ours, pidfd opened,
//! `Info` answered; then the sweep), the start-to-serving wall time of both, and their
//! ratio; then checks that every sandbox answers an exec.
//!
//! Run as root, after `cargo xtask image`.

use serde_json::json;
use testkit::restart::kill_and_restart;
use testkit::{DaemonProcess, Setup};

// A debug build is `cargo xtask bench --quick`'s smoke run: small counts.
const SANDBOXES: usize = if cfg!(debug_assertions) { 8 } else { 50 };

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_restart: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn bench() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("run as root: the process engine's sandboxes need their identities".into());
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let setup = Setup {
        on_stop: "keep",
        max_claims: SANDBOXES as u32 + 8,
        warm: 4,
        warm_max: 8,
        ..Setup::default()
    };
    let text = setup.toml(&dir.path().join("data"), "127.0.0.1:0");
    let sandboxd = testkit::bins::debug_dir().join("sandboxd");
    let mut first = DaemonProcess::start(&sandboxd, dir.path(), &text).await;
    let (mut empty, empty_wall, empty_reconcile) =
        kill_and_restart(&mut first, &sandboxd, dir.path(), &text).await?;

    let mut claimed = Vec::new();
    for _ in 0..SANDBOXES {
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
    println!("restart after kill -9 (process engine, warm pool of 4 rebuilt each time):");
    println!(
        "  no claims:      start to serving {:>8.1} ms, reconcile {empty_reconcile}",
        empty_wall.as_secs_f64() * 1e3
    );
    println!(
        "  {SANDBOXES} claims:      start to serving {:>8.1} ms, reconcile {reconcile}",
        wall.as_secs_f64() * 1e3
    );
    println!(
        "  ratio (50 claims / none, start to serving): {:.2}",
        wall.as_secs_f64() / empty_wall.as_secs_f64()
    );
    println!("  sandboxes answering exec after the restart: {answered}/{SANDBOXES}");
    for (id, _) in &claimed {
        let _ = second
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/release"),
                Some(testkit::ROOT),
                None,
            )
            .await;
    }
    if answered != SANDBOXES {
        return Err(format!(
            "only {answered} of {SANDBOXES} sandboxes came back"
        ));
    }
    drop(second);
    drop(empty);
    drop(first);
    Ok(())
}
