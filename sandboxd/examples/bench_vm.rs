//! `cargo run --release -p sandboxd --example bench_vm` (what `cargo xtask bench vm`
//! runs, after `cargo xtask image`): the VM benchmark of issue 4, under whatever
//! accelerator the qemu engine settles on (TCG on this machine).
//!
//! 1. Cold boot vs clone-from-golden, time from `start` to silkd answering `Info`,
//!    median of 5 each in the same run, and their ratio.
//! 2. Memory per clone with 10 idle clones running: RSS and Pss of each QEMU
//!    (`/proc/PID/smaps_rollup`), where one clone's private dirty memory is (its largest
//!    mappings in `/proc/PID/smaps`), the drop of the host's `MemAvailable`, and their
//!    idle CPU over 5 s (guest + QEMU: silkd waiting for work must not spin).
//!
//! `BENCH_VM_COLD=0` leaves the cold boots out (a quicker run while tuning clones);
//! `BENCH_VM_HOLD_S=N` keeps the idle clones N seconds more, their pids printed, for a
//! look from outside (`strace -c -f -p`, `perf trace`, smaps).
//! 3. Warm-claim server time: a real sandboxd (in-process, HTTP on loopback) with a warm
//!    pool; the `Server-Timing` of 20 claims, median.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd::config::{AccelChoice, QemuConfig, QemuMachine, SizeConfig, TemplateConfig};
use sandboxd::engine::qemu::QemuEngine;
use sandboxd::engine::{Engine, Guest, GuestSpec};

// A debug build is `cargo xtask bench --quick`'s smoke run: small counts.
const RUNS: usize = if cfg!(debug_assertions) { 2 } else { 5 };
const IDLE_CLONES: usize = if cfg!(debug_assertions) { 3 } else { 10 };
const CLAIMS: usize = if cfg!(debug_assertions) { 5 } else { 20 };
const ROOT: &str = "bench-vm-root-token-0001";

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_vm: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[path = "host_mem/mod.rs"]
mod host_mem;

use host_mem::{mem_available_kib, qemu_pids, rss_pss_kib};

type BoxError = Box<dyn std::error::Error>;

fn image() -> Result<PathBuf, BoxError> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/images/base");
    p.canonicalize()
        .map_err(|_| format!("no image at {}: run `cargo xtask image`", p.display()).into())
}

fn spec(image: &Path, golden_dir: PathBuf) -> GuestSpec {
    GuestSpec {
        template: "base".into(),
        size: "small".into(),
        template_config: TemplateConfig {
            rootfs: image.join("rootfs"),
            image: Some(image.to_path_buf()),
            meta: Default::default(),
            detach_ring_bytes: None,
        },
        size_config: SizeConfig {
            cpus: 1,
            memory_mib: 256,
            max_pids: 512,
            disk_mib: 512,
        },
        no_balloon: false,
        golden_dir,
    }
}

async fn start_to_info(
    engine: &QemuEngine,
    spec: &GuestSpec,
) -> Result<(Arc<dyn Guest>, Duration), BoxError> {
    let t = Instant::now();
    let guest = engine.start(spec).await?;
    sandboxd::guest::info(&*guest, Duration::from_secs(60)).await?;
    Ok((guest, t.elapsed()))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn bench() -> Result<(), BoxError> {
    let image = image()?;
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    let cfg = QemuConfig {
        binary: "qemu-system-x86_64".into(),
        accel: AccelChoice::Auto,
        machine: QemuMachine::Microvm,
        memory_dir: tmp.path().join("shm"),
        ..QemuConfig::default()
    };
    let engine = QemuEngine::new(
        &cfg,
        &data,
        Path::new("/sys/fs/cgroup"),
        Duration::from_secs(60),
        Some(image.clone()),
    )?;
    let golden = spec(&image, data.join("golden-a"));
    let cold = spec(&image, data.join("golden-none"));

    eprintln!("bench_vm: building the golden");
    let g = engine.boot_golden(&golden).await?;
    sandboxd::guest::info(&*g, Duration::from_secs(60)).await?;
    engine.seal_golden(&golden, g).await?;

    let with_cold = std::env::var("BENCH_VM_COLD").map_or(true, |v| v != "0");
    eprintln!("bench_vm: {RUNS} cold boots and {RUNS} clones, interleaved");
    let (mut colds, mut clones) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        if with_cold {
            let (g, t) = start_to_info(&engine, &cold).await?;
            if g.origin() != "cold" {
                return Err("expected a cold boot".into());
            }
            colds.push(t);
            g.destroy().await;
        }
        let (g, t) = start_to_info(&engine, &golden).await?;
        if g.origin() != "clone" {
            return Err("expected a clone".into());
        }
        clones.push(t);
        g.destroy().await;
    }
    let k = median(clones.clone());
    println!(
        "start → Info, median of {RUNS} ({}):",
        engine.info().accelerator.unwrap_or_default()
    );
    if with_cold {
        println!(
            "  cold boot:          {:>8.1} ms   (all: {:?})",
            ms(median(colds.clone())),
            colds.iter().map(|d| ms(*d).round()).collect::<Vec<_>>()
        );
    }
    println!(
        "  clone from golden:  {:>8.1} ms   (all: {:?})",
        ms(k),
        clones.iter().map(|d| ms(*d).round()).collect::<Vec<_>>()
    );
    if with_cold {
        println!(
            "  ratio cold / clone: {:>8.1}x",
            median(colds).as_secs_f64() / k.as_secs_f64()
        );
    }

    eprintln!("bench_vm: {IDLE_CLONES} idle clones");
    let avail_before = mem_available_kib()?;
    let mut idle = Vec::new();
    for _ in 0..IDLE_CLONES {
        idle.push(start_to_info(&engine, &golden).await?.0);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let avail_after = mem_available_kib()?;
    let pids = qemu_pids(&data.join("qemu/run"));
    if pids.len() != IDLE_CLONES {
        return Err(format!("found {} QEMUs, expected {IDLE_CLONES}", pids.len()).into());
    }
    let mut rss = Vec::new();
    let mut pss = Vec::new();
    for pid in &pids {
        let (r, p) = rss_pss_kib(*pid)?;
        rss.push(r);
        pss.push(p);
    }
    let avg = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64 / 1024.0;
    println!("{IDLE_CLONES} idle clones (256 MiB guests):");
    println!("  RSS per clone: {:>6.1} MiB (avg)", avg(&rss));
    println!("  Pss per clone: {:>6.1} MiB (avg)", avg(&pss));
    println!("  private dirty of one clone, largest mappings (KiB):");
    for (kib, what) in private_dirty_by_mapping(pids[0])? {
        println!("    {kib:>7}  {what}");
    }
    println!(
        "  host MemAvailable drop: {:.1} MiB per clone",
        (avail_before.saturating_sub(avail_after)) as f64 / 1024.0 / IDLE_CLONES as f64
    );
    let window = Duration::from_secs(if cfg!(debug_assertions) { 1 } else { 5 });
    let before: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    tokio::time::sleep(window).await;
    let after: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    let ticks_per_s = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let core_pct = (after - before) as f64 / ticks_per_s / window.as_secs_f64() * 100.0;
    println!(
        "  idle CPU: {:.1}% of one core for all {IDLE_CLONES} ({:.1}% each)",
        core_pct,
        core_pct / IDLE_CLONES as f64
    );
    if let Some(hold) = std::env::var("BENCH_VM_HOLD_S")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        eprintln!("bench_vm: holding the idle clones {hold} s: pids {pids:?}");
        tokio::time::sleep(Duration::from_secs(hold)).await;
    }
    for g in idle {
        g.destroy().await;
    }
    engine.shutdown(false);

    eprintln!("bench_vm: warm claims through a real sandboxd");
    let warm = warm_claims(&image, tmp.path()).await?;
    println!(
        "warm claim server time (Server-Timing), median of {CLAIMS}: {:.3} ms",
        ms(median(warm))
    );
    Ok(())
}

async fn warm_claims(image: &Path, dir: &Path) -> Result<Vec<Duration>, BoxError> {
    let data = dir.join("daemon");
    let text = format!(
        r#"listen = "127.0.0.1:0"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
# A stopped node leaves nothing (the bench counts only its own run).
on_stop = "destroy"
boot_timeout_seconds = 60
[qemu]
memory_dir = "{mem}"
[templates.base]
image = "{image}"
[sizes.small]
cpus = 1
memory_mib = 256
[[pools]]
template = "base"
size = "small"
warm = 2
warm_max = 4
"#,
        data = data.display(),
        mem = dir.join("shm2").display(),
        image = image.display()
    );
    let config = sandboxd::Config::parse(&text)?;
    let listener = sandboxd::Listener::bind(&config).await?;
    let sandboxd::Listener::Tcp(tcp) = &listener else {
        return Err("expected TCP".into());
    };
    let addr = tcp.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(sandboxd::run(listener, config, async move {
        let _ = stopped.await;
    }));
    let mut times = Vec::new();
    let result = async {
        for _ in 0..CLAIMS {
            wait_warm(addr, 2).await?;
            let (status, headers, body) = http(addr, "POST", "/v1/claim", Some("{}")).await?;
            if status != 200 {
                return Err(format!("claim answered {status}: {body}").into());
            }
            let timing = headers
                .get("server-timing")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split("dur=").nth(1))
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or("no Server-Timing on the claim")?;
            times.push(Duration::from_secs_f64(timing / 1e3));
            let v: serde_json::Value = serde_json::from_str(&body)?;
            let id = v["id"].as_str().ok_or("no id")?;
            http(addr, "POST", &format!("/v1/sandboxes/{id}/release"), None).await?;
        }
        Ok::<_, BoxError>(())
    }
    .await;
    let _ = stop.send(());
    let _ = daemon.await;
    result.map(|()| times)
}

async fn wait_warm(addr: std::net::SocketAddr, n: u64) -> Result<(), BoxError> {
    let start = Instant::now();
    loop {
        let (_, _, body) = http(addr, "GET", "/v1/info", None).await?;
        let v: serde_json::Value = serde_json::from_str(&body)?;
        if v["pools"][0]["warm"].as_u64() == Some(n) {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err(format!("pool never reached {n} warm: {v}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, hyper::HeaderMap, String), BoxError> {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "sandboxd")
        .header("authorization", format!("Bearer {ROOT}"))
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.unwrap_or("").to_string(),
        )))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
}

/// `Private_Dirty` of each mapping of `pid` in KiB, largest first, with what it maps (a
/// file, `[heap]`, or its size and permissions for an anonymous one; the rest summed).
fn private_dirty_by_mapping(pid: u32) -> Result<Vec<(u64, String)>, BoxError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut out: Vec<(u64, String)> = Vec::new();
    let mut what = String::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            let range = first;
            let perms = f.next().unwrap_or("");
            let name = f.nth(3).unwrap_or("");
            what = if name.is_empty() {
                let (a, b) = range.split_once('-').unwrap_or(("0", "0"));
                let size = u64::from_str_radix(b, 16)? - u64::from_str_radix(a, 16)?;
                format!("anonymous {} KiB {perms}", size / 1024)
            } else {
                let file = name.rsplit('/').next().unwrap_or(name);
                format!("{file} {perms}")
            };
        } else if first == "Private_Dirty:" {
            let kib: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            if kib > 0 {
                out.push((kib, what.clone()));
            }
        }
    }
    out.sort_by_key(|o| std::cmp::Reverse(o.0));
    let total: u64 = out.iter().map(|(k, _)| k).sum();
    let shown: u64 = out.iter().take(8).map(|(k, _)| k).sum();
    out.truncate(8);
    out.push((total - shown, "the rest".into()));
    out.push((total, "in all".into()));
    Ok(out)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command name: state is field 3; utime and stime are fields 14 and 15.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}
