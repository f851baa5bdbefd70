//! `cargo xtask bench isolation`: what the process engine's seccomp filter and per-sandbox
//! identity (unprivileged uid + user namespace) cost an exec round trip. Starts four real
//! sandboxd binaries side by side, one per combination of the two measuring opt-outs
//! (`[process] unsafe_no_seccomp`, `unsafe_no_identity`), claims one sandbox on each, and
//! runs `true` through `POST /v1/sandboxes/{id}/exec` round-robin across them, so machine
//! noise hits every configuration alike. Prints the median and p90 client round trip of
//! each, and the differences.
//!
//! Run as root (otherwise there is no identity to switch to), after `cargo xtask image`.

use std::time::{Duration, Instant};

use serde_json::json;
use testkit::{DaemonProcess, Setup};

// A debug build is `cargo xtask bench --quick`'s smoke run: small counts.
const ROUNDS: usize = if cfg!(debug_assertions) { 40 } else { 400 };
const WARMUP: usize = 20;

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_isolation: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn bench() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("run as root: sandboxes only get identities of their own under root".into());
    }
    let configs = [
        ("seccomp + identity (default)", ""),
        ("identity, no seccomp", "unsafe_no_seccomp = true\n"),
        ("seccomp, no identity", "unsafe_no_identity = true\n"),
        (
            "neither",
            "unsafe_no_seccomp = true\nunsafe_no_identity = true\n",
        ),
    ];
    let sandboxd = testkit::bins::debug_dir().join("sandboxd");
    let mut nodes = Vec::new();
    for (name, extra) in configs {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let setup = Setup {
            process_extra: extra.into(),
            max_output_bytes: 1024 * 1024,
            ..Setup::default()
        };
        let text = setup.toml(&dir.path().join("data"), "127.0.0.1:0");
        let d = DaemonProcess::start(&sandboxd, dir.path(), &text).await;
        let sandbox = d.claim().await;
        nodes.push((name, d, sandbox, Vec::with_capacity(ROUNDS), dir));
    }
    for round in 0..WARMUP + ROUNDS {
        for (name, d, (id, token), times, _) in &mut nodes {
            let start = Instant::now();
            let r = d.exec(id, token, json!({"argv": ["true"]})).await;
            let took = start.elapsed();
            if r.status != 200 {
                return Err(format!("{name}: exec answered {}: {}", r.status, r.text()));
            }
            if round >= WARMUP {
                times.push(took);
            }
        }
    }
    let stats = |times: &mut Vec<Duration>| {
        times.sort();
        (times[times.len() / 2], times[times.len() * 9 / 10])
    };
    println!("exec round trip of `true`, {ROUNDS} rounds each, interleaved:");
    let mut medians = Vec::new();
    for (name, _, _, times, _) in &mut nodes {
        let (p50, p90) = stats(times);
        medians.push(p50);
        println!(
            "  {name:<30} median {:>7.1} µs  p90 {:>7.1} µs",
            micros(p50),
            micros(p90)
        );
    }
    let diff = |a: Duration, b: Duration| micros(a) - micros(b);
    println!(
        "seccomp costs {:+.1} µs with identity, {:+.1} µs without; identity costs {:+.1} µs \
         with seccomp, {:+.1} µs without",
        diff(medians[0], medians[1]),
        diff(medians[2], medians[3]),
        diff(medians[0], medians[2]),
        diff(medians[1], medians[3]),
    );
    Ok(())
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
