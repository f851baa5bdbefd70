//! `cargo run --release -p sandboxd --example bench_exec_memory`: the exec-memory
//! benchmark of issue 3 (what `cargo xtask bench exec-memory` runs), plus the median server
//! time of a warm claim.
//!
//! Starts the real sandboxd binary (beside this example) with the process engine, then:
//! 1. claims sandboxes from a warm pool one at a time and reports the median
//!    `Server-Timing` of a warm claim;
//! 2. runs 50 concurrent buffered execs, each printing 8 MiB − 1 bytes of 0x01, checks
//!    every 200 body byte for byte as it streams (nothing is buffered here), counts 200s and
//!    503s (with `Retry-After`), and samples sandboxd's RSS: the peak above idle must stay
//!    within `memory_budget_bytes` + 32 MiB;
//! 3. the same with `encoding: "base64"`.
//!
//! Exits non-zero when an answer is wrong or the memory bound is exceeded.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

const ROOT: &str = "bench-root-token-000001";
// A debug build is `cargo xtask bench --quick`'s smoke run: small counts.
const CONCURRENCY: usize = if cfg!(debug_assertions) { 10 } else { 50 };
const OUTPUT: u64 = 8 * 1024 * 1024 - 1;
const BUDGET: u64 = 64 * 1024 * 1024;
const SLACK: u64 = 32 * 1024 * 1024;
const CLAIMS: usize = if cfg!(debug_assertions) { 5 } else { 30 };

/// Stops sandboxd (SIGTERM; `on_stop = "destroy"` destroys its sandboxes) when the bench
/// ends or fails.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_exec_memory: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The directory holding this example's sibling binaries (`target/PROFILE`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

fn build_binaries(bin: &Path) -> Result<(), String> {
    let release = bin.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "silkd", "-p", "sandboxd", "--bins"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .map_err(|e| format!("running cargo build: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| "cargo build of silkd and sandboxd failed".to_string())
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// A running sandboxd with its data dir.
struct Running {
    daemon: Daemon,
    addr: SocketAddr,
    _data: tempfile::TempDir,
}

async fn start_daemon(bin: &Path) -> Result<Running, String> {
    let data = tempfile::tempdir().map_err(|e| e.to_string())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let config = format!(
        r#"listen = "{addr}"
data_dir = "{data}"
api_token = "{ROOT}"
silkd_path = "{silkd}"
max_claims = 64
# The rounds end with a sandbox still claimed: the default "keep" would leave it running
# after the SIGTERM, with its data dir deleted (two orphaned sandboxes every run).
on_stop = "destroy"
[templates.base]
rootfs = "{rootfs}"
[sizes.bench]
cpus = 2
memory_mib = 2048
max_pids = 4096
[[pools]]
template = "base"
size = "bench"
warm = 4
warm_max = 8
[exec]
max_output_bytes = 8388608
memory_budget_bytes = {BUDGET}
max_in_flight = 256
"#,
        // A dedicated directory: sandboxd refuses a data_dir that holds other files.
        data = data.path().join("data").display(),
        silkd = bin.join("silkd").display(),
        rootfs = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/images/base/rootfs"),
    );
    let config_path = data.path().join("sandboxd.toml");
    std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
    let log = std::fs::File::create(data.path().join("sandboxd.log")).map_err(|e| e.to_string())?;
    let child = Command::new(bin.join("sandboxd"))
        .arg("--config")
        .arg(&config_path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting sandboxd: {e}"))?;
    let daemon = Daemon(child);
    let start = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        // Generous: a debug build on a loaded shared machine starts slowly.
        if start.elapsed() > Duration::from_secs(60) {
            let log = std::fs::read_to_string(data.path().join("sandboxd.log")).unwrap_or_default();
            return Err(format!(
                "sandboxd did not listen within 60 s; its log:\n{log}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_warm_n(addr, 4).await?;
    Ok(Running {
        daemon,
        addr,
        _data: data,
    })
}

async fn bench() -> Result<(), String> {
    let bin = bin_dir();
    // `cargo xtask bench` built them already, with the workspace's feature set; building
    // again with a narrower one would recompile both.
    if std::env::var_os("BENCH_JSON").is_none() {
        build_binaries(&bin)?;
    }

    // 1. Warm claims: wait for a warm sandbox before each, so every claim is served warm.
    let running = start_daemon(&bin).await?;
    let addr = running.addr;
    let mut server_ms = Vec::new();
    for _ in 0..CLAIMS {
        wait_warm(addr).await?;
        let (status, headers, body) = request(addr, "POST", "/v1/claim", ROOT, "{}").await?;
        if status != 200 {
            return Err(format!("claim answered {status}"));
        }
        let timing = headers
            .get("server-timing")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split("dur=").nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or("claim without Server-Timing")?;
        server_ms.push(timing);
        let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        let id = v["id"].as_str().unwrap_or_default();
        request(
            addr,
            "POST",
            &format!("/v1/sandboxes/{id}/release"),
            ROOT,
            "",
        )
        .await?;
    }
    drop(running);
    server_ms.sort_by(f64::total_cmp);
    println!(
        "warm claim server time over {CLAIMS} claims: median {:.3} ms, min {:.3} ms, max {:.3} ms",
        server_ms[CLAIMS / 2],
        server_ms[0],
        server_ms[CLAIMS - 1]
    );

    // 2. and 3.: each encoding against a fresh daemon, so "idle" really is idle.
    let mut failed = false;
    for encoding in ["utf8", "base64"] {
        let running = start_daemon(&bin).await?;
        let addr = running.addr;
        let (status, _, body) = request(addr, "POST", "/v1/claim", ROOT, "{}").await?;
        if status != 200 {
            return Err(format!("claim answered {status}"));
        }
        let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        let id = v["id"].as_str().unwrap_or_default().to_string();
        // Idle figure after the pool settled and one small exec warmed the allocator.
        wait_warm_n(addr, 4).await?;
        let small = r#"{"argv":["true"]}"#;
        request(
            addr,
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            ROOT,
            small,
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        failed |= !exec_round(addr, running.daemon.0.id(), &id, encoding).await?;
    }
    if failed {
        return Err("a round failed (see above)".into());
    }
    Ok(())
}

/// One round of 50 concurrent execs; true when every answer was right and memory bounded.
async fn exec_round(addr: SocketAddr, pid: u32, id: &str, encoding: &str) -> Result<bool, String> {
    let idle = rss_bytes(pid);
    let peak = Arc::new(AtomicU64::new(idle));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        std::thread::spawn(move || {
            while sampling.load(Ordering::SeqCst) {
                peak.fetch_max(rss_bytes(pid), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let body = serde_json::json!({
        "argv": ["sh", "-c", format!("head -c {OUTPUT} /dev/zero | tr '\\0' '\\1'")],
        "encoding": encoding,
    })
    .to_string();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (body, path, encoding) = (
            body.clone(),
            format!("/v1/sandboxes/{id}/exec"),
            encoding.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            checked_exec(addr, &path, &body, &encoding).await
        }));
    }
    let (mut ok, mut busy, mut wrong) = (0, 0, Vec::new());
    for t in tasks {
        match t.await.map_err(|e| e.to_string())? {
            Ok(200) => ok += 1,
            Ok(503) => busy += 1,
            Ok(other) => wrong.push(format!("status {other}")),
            Err(e) => wrong.push(e),
        }
    }
    let elapsed = started.elapsed();
    sampling.store(false, Ordering::SeqCst);
    let _ = sampler.join();
    let delta = peak.load(Ordering::SeqCst).saturating_sub(idle);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let within = delta <= BUDGET + SLACK;
    println!(
        "exec-memory encoding={encoding}: requests {CONCURRENCY}, 200s {ok}, 503s {busy}, wrong {}, \
         idle RSS {:.1} MiB, peak RSS delta {:.1} MiB, budget {:.0} MiB (+{:.0} MiB slack) → {}, \
         wall {:.1} s",
        wrong.len(),
        mib(idle),
        mib(delta),
        mib(BUDGET),
        mib(SLACK),
        if within { "within" } else { "EXCEEDED" },
        elapsed.as_secs_f64()
    );
    for w in &wrong {
        println!("  wrong answer: {w}");
    }
    Ok(within && wrong.is_empty())
}

/// The exact body a successful exec must stream, byte by byte, without building it.
fn expected_byte(encoding: &str, pos: u64) -> Option<u8> {
    let head: &[u8] = if encoding == "utf8" {
        b"{\"exit_code\":0,\"stdout\":\""
    } else {
        b"{\"exit_code\":0,\"stdout_b64\":\""
    };
    let tail: &[u8] = if encoding == "utf8" {
        b"\",\"stderr\":\"\"}"
    } else {
        b"\",\"stderr_b64\":\"\"}"
    };
    // 0x01 is "\u0001" in a JSON string; base64 of 01 01 01 is "AQEB", and the last lone
    // byte (8388607 = 3 * 2796202 + 1) is "AQ==".
    let (unit, middle_len, last): (&[u8], u64, &[u8]) = if encoding == "utf8" {
        (b"\\u0001", 6 * OUTPUT, b"")
    } else {
        (b"AQEB", 4 * (OUTPUT / 3), b"AQ==")
    };
    let pos = pos as usize;
    if pos < head.len() {
        return Some(head[pos]);
    }
    let p = (pos - head.len()) as u64;
    if p < middle_len {
        return Some(unit[(p % unit.len() as u64) as usize]);
    }
    let p = (p - middle_len) as usize;
    if p < last.len() {
        return Some(last[p]);
    }
    tail.get(p - last.len()).copied()
}

async fn checked_exec(
    addr: SocketAddr,
    path: &str,
    body: &str,
    encoding: &str,
) -> Result<u16, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::post(path)
        .header("host", "sandboxd")
        .header("authorization", format!("Bearer {ROOT}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    if status == 503 && resp.headers().get("retry-after").is_none() {
        return Err("503 without Retry-After".into());
    }
    let mut body = resp.into_body();
    let mut pos: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        if status == 200 {
            for &b in data.iter() {
                if expected_byte(encoding, pos) != Some(b) {
                    return Err(format!("body differs at byte {pos}"));
                }
                pos += 1;
            }
        }
    }
    if status == 200 && expected_byte(encoding, pos).is_some() {
        return Err(format!("body ended early at byte {pos}"));
    }
    Ok(status)
}

async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> Result<(u16, hyper::HeaderMap, Bytes), String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "sandboxd")
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, headers, body))
}

async fn wait_warm(addr: SocketAddr) -> Result<(), String> {
    wait_warm_n(addr, 1).await
}

async fn wait_warm_n(addr: SocketAddr, n: u64) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let (_, _, body) = request(addr, "GET", "/v1/info", ROOT, "").await?;
        let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        if v["pools"][0]["warm"].as_u64().unwrap_or(0) >= n {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err(format!("pool never reached {n} warm: {v}"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
