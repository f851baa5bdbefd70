//! Benchmark: silkd's exec round trip for `true` over a Unix socket (one kept
//! connection) next to a plain fork+exec+wait of `true` from this process, same run.
//!
//! Run through `cargo xtask bench exec` (builds release binaries first), or directly:
//! `cargo run --release -p silkd --example exec_rtt -- target/release/silkd [N]`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio::net::UnixStream;
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() as f64 - 1.0) * p) as usize]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let silkd = args.next().map(PathBuf::from).unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("current_exe");
        exe.parent().unwrap().parent().unwrap().join("silkd")
    });
    let n: usize = args.next().map(|s| s.parse().expect("N")).unwrap_or(1000);
    assert!(silkd.exists(), "no silkd at {}", silkd.display());

    let dir = std::env::temp_dir().join(format!("exec-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("silkd.sock");
    let mut child = Command::new(&silkd)
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn silkd");
    let start = Instant::now();
    let stream = loop {
        match UnixStream::connect(&sock).await {
            Ok(s) => break s,
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("silkd did not listen: {e}"),
        }
    };
    let mut conn = Framed::new(stream, HostCodec::new());

    let exec = Request::Exec {
        detach: false,
        pty: None,
        argv: vec!["true".into()],
        cwd: None,
        env: None,
        stdin: false,
        timeout_ms: None,
        user: None,
    };
    let mut silkd_times = Vec::with_capacity(n);
    let mut spawn_times = Vec::with_capacity(n);
    // Interleave the two so machine noise hits both alike; 20 warm-up rounds first.
    for i in 0..n + 20 {
        let t = Instant::now();
        conn.send(exec.clone()).await.unwrap();
        loop {
            match conn.next().await.expect("closed").expect("decode") {
                Response::Exit { code: Some(0), .. } => break,
                Response::Started { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        let silkd_rt = t.elapsed();
        let t = Instant::now();
        let status = Command::new("true").status().unwrap();
        let spawn_rt = t.elapsed();
        assert!(status.success());
        if i >= 20 {
            silkd_times.push(silkd_rt);
            spawn_times.push(spawn_rt);
        }
    }
    let s = median(silkd_times.clone());
    let p = median(spawn_times.clone());
    println!("exec round trip of `true`, {n} runs, one kept Unix-socket connection");
    println!(
        "  silkd exec:          median {:>8.1} µs   p90 {:>8.1} µs",
        s.as_secs_f64() * 1e6,
        percentile(&silkd_times, 0.9).as_secs_f64() * 1e6
    );
    println!(
        "  local fork+exec+wait: median {:>8.1} µs   p90 {:>8.1} µs",
        p.as_secs_f64() * 1e6,
        percentile(&spawn_times, 0.9).as_secs_f64() * 1e6
    );
    println!(
        "  ratio silkd / local:  {:.2}x",
        s.as_secs_f64() / p.as_secs_f64()
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
