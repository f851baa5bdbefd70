//! `cargo run --release -p sandboxd --example bench_snapshots` (what `cargo xtask bench
//! snapshots` runs, after building `base`): snapshots on the qemu engine, under whatever
//! accelerator it settles on (TCG on this machine), all in one process so every figure
//! sits next to its baseline.
//!
//! 1. Snapshot time of a running clone (pause, whole-RAM stream, helper seal), median
//!    of 3, with the snapshot's bytes on disk; the engine's log lines give each one's
//!    pause of the source VM (`paused=`) next to its total.
//! 2. Fork-to-ready (restore from the snapshot until silkd answers `Info`), median of
//!    10, next to clone-to-ready from the golden, median of 10, interleaved.
//! 3. Host memory per idle fork: 10 forks idle, RSS and Pss per QEMU and the drop of
//!    `MemAvailable` per fork.
//! 4. Hibernate: time to write out and destroy a VM with 96 MiB in its tmpfs, the
//!    QEMU's RSS before, and `MemAvailable` before and after.
//! 5. Wake to first exec: restore of the hibernated VM until `true` has run in it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd::config::{AccelChoice, QemuConfig, QemuMachine, SizeConfig, TemplateConfig};
use sandboxd::engine::qemu::QemuEngine;
use sandboxd::engine::{Engine, Guest, GuestSpec};

/// `cargo xtask bench --quick` (CI's smoke test) sets `BENCH_QUICK=1`: fewer rounds.
fn quick() -> bool {
    std::env::var("BENCH_QUICK").as_deref() == Ok("1")
}

/// Forks and clones measured (3 when quick).
fn runs() -> usize {
    if quick() {
        3
    } else {
        10
    }
}

/// Snapshots measured (1 when quick).
fn snapshot_runs() -> usize {
    if quick() {
        1
    } else {
        3
    }
}
const MEMORY_MIB: u64 = 256;
const BOUND: Duration = Duration::from_secs(240);

#[path = "host_mem/mod.rs"]
mod host_mem;

use host_mem::{mem_available_kib, qemu_pids, rss_pss_kib};

type BoxError = Box<dyn std::error::Error>;

fn main() -> std::process::ExitCode {
    // The engine logs each snapshot's pause of its source VM and its total time.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "sandboxd::engine::qemu::snapshot=info",
        ))
        .with_target(false)
        .with_ansi(false)
        .without_time()
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_snapshots: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn ready(guest: Arc<dyn Guest>) -> Result<Arc<dyn Guest>, BoxError> {
    sandboxd::guest::info(&*guest, BOUND).await?;
    Ok(guest)
}

async fn sh(guest: &dyn Guest, script: &str) -> Result<(), BoxError> {
    let argv = ["sh", "-c", script].map(String::from);
    sandboxd::guest::run_checked(guest, &argv, BOUND).await?;
    Ok(())
}

fn disk_kib(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|es| {
            es.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.blocks() / 2)
                .sum()
        })
        .unwrap_or(0)
}

/// RSS and Pss summed over the QEMUs running now, and how many there are.
fn qemus(run_root: &Path) -> Result<(u64, u64, usize), BoxError> {
    let pids = qemu_pids(run_root);
    let (mut rss, mut pss) = (0, 0);
    for pid in &pids {
        let (r, p) = rss_pss_kib(*pid)?;
        rss += r;
        pss += p;
    }
    Ok((rss, pss, pids.len()))
}

async fn bench() -> Result<(), BoxError> {
    let image = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/images/base")
        .canonicalize()
        .map_err(|_| "no image at target/images/base: run `cargo xtask image`")?;
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    let run_root = data.join("qemu/run");
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
        BOUND,
        Some(image.clone()),
    )?;
    let spec = GuestSpec {
        template: "base".into(),
        size: "small".into(),
        template_config: TemplateConfig {
            rootfs: image.join("rootfs"),
            image: Some(image.clone()),
            meta: sandboxd::template::TemplateMeta::load(&image)?,
            detach_ring_bytes: None,
        },
        size_config: SizeConfig {
            cpus: 1,
            memory_mib: MEMORY_MIB,
            max_pids: 512,
            disk_mib: 128,
        },
        no_balloon: false,
        golden_dir: data.join("golden"),
    };
    let g = engine.boot_golden(&spec).await?;
    sandboxd::guest::info(&*g, BOUND).await?;
    engine.seal_golden(&spec, g).await?;
    let parent = ready(engine.start(&spec).await?).await?;
    println!(
        "bench snapshots: {MEMORY_MIB} MiB guests, accelerator {}",
        engine.info().accelerator.unwrap_or_default()
    );
    // A parent with state: a file and 32 MiB of touched memory in its tmpfs.
    sh(
        &*parent,
        "echo kept > /tmp/f && head -c 33554432 /dev/urandom > /tmp/blob",
    )
    .await?;

    // 1. Snapshot time.
    let snaps = data.join("snapshots");
    std::fs::create_dir_all(&snaps)?;
    let mut times = Vec::new();
    let mut dir = PathBuf::new();
    for i in 0..snapshot_runs() {
        dir = snaps.join(format!("s{i}"));
        std::fs::create_dir(&dir)?;
        let t = Instant::now();
        engine.snapshot(&spec, &*parent, &dir, true).await?;
        times.push(t.elapsed());
    }
    println!(
        "  snapshot of a running VM, median of {}: {:>8.1} ms (all: {:?}); {:.1} MiB on disk",
        snapshot_runs(),
        ms(median(times.clone())),
        times.iter().map(|d| ms(*d).round()).collect::<Vec<_>>(),
        mib(disk_kib(&dir))
    );

    // 2. Fork-to-ready next to clone-to-ready, interleaved.
    let (mut forks, mut clones) = (Vec::new(), Vec::new());
    for _ in 0..runs() {
        let t = Instant::now();
        let f = ready(engine.restore(&spec, &dir, None).await?).await?;
        forks.push(t.elapsed());
        f.destroy().await;
        let t = Instant::now();
        let c = ready(engine.start(&spec).await?).await?;
        clones.push(t.elapsed());
        c.destroy().await;
    }
    let (fork_ms, clone_ms) = (ms(median(forks.clone())), ms(median(clones.clone())));
    println!(
        "  fork-to-ready, median of {}:  {fork_ms:>8.1} ms (all: {:?})",
        runs(),
        forks.iter().map(|d| ms(*d).round()).collect::<Vec<_>>()
    );
    println!(
        "  clone-to-ready (golden), median of {}: {clone_ms:>8.1} ms (all: {:?}); fork/clone {:.2}",
        runs(),
        clones.iter().map(|d| ms(*d).round()).collect::<Vec<_>>(),
        fork_ms / clone_ms
    );

    // 3. Host memory per idle fork.
    let parent_pid = parent.handle().ok_or("the parent has no handle")?.pid as u32;
    let avail = mem_available_kib()?;
    let mut idle = Vec::new();
    for _ in 0..runs() {
        idle.push(ready(engine.restore(&spec, &dir, None).await?).await?);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dropped = avail.saturating_sub(mem_available_kib()?);
    let (rss, pss, n) = qemus(&run_root)?;
    // The parent's QEMU is in the sums too: take it out.
    let (prss, ppss) = rss_pss_kib(parent_pid)?;
    let forks_n = (n - 1).max(1) as f64;
    println!(
        "  idle fork ({} running): RSS {:.1} MiB, Pss {:.1} MiB per fork QEMU, host \
         MemAvailable drop {:.1} MiB per fork",
        runs(),
        mib(rss - prss) / forks_n,
        mib(pss - ppss) / forks_n,
        mib(dropped) / runs() as f64
    );
    for f in idle {
        f.destroy().await;
    }

    // 4. Hibernate, 5. wake to first exec.
    sh(&*parent, "head -c 67108864 /dev/urandom > /tmp/more").await?;
    let (rss_before, _) = rss_pss_kib(parent_pid)?;
    let avail_before = mem_available_kib()?;
    let sleep_dir = data.join("hibernated");
    std::fs::create_dir(&sleep_dir)?;
    let t = Instant::now();
    engine.snapshot(&spec, &*parent, &sleep_dir, false).await?;
    let hostname = parent.hostname();
    parent.destroy().await;
    let hibernate = t.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let avail_after = mem_available_kib()?;
    println!(
        "  hibernate (32+64 MiB in its tmpfs): {:>8.1} ms; QEMU RSS before {:.1} MiB; host \
         MemAvailable +{:.1} MiB; {:.1} MiB on disk",
        ms(hibernate),
        mib(rss_before),
        mib(avail_after.saturating_sub(avail_before)),
        mib(disk_kib(&sleep_dir))
    );
    let t = Instant::now();
    let woken = engine
        .restore(&spec, &sleep_dir, hostname.as_deref())
        .await?;
    sh(&*woken, "true").await?;
    let wake = t.elapsed();
    sh(
        &*woken,
        "test \"$(cat /tmp/f)\" = kept && test -s /tmp/more",
    )
    .await?;
    println!("  wake to first exec:            {:>8.1} ms", ms(wake));
    woken.destroy().await;
    Ok(())
}
