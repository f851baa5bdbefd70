//! `cargo run --release -p sandboxd --example bench_templates` (what `cargo xtask bench
//! templates` runs, after building `base` and `default`): the qemu engine with a
//! template's root disk (`default`: Debian, Python, Node, git on a read-only virtio-blk
//! erofs under a tmpfs overlay) next to `base` (initramfs only), under whatever
//! accelerator the engine settles on (TCG on this machine).
//!
//! 1. Clone-to-ready: `start` of a clone of the golden to silkd answering `Info`, median
//!    of 5, for `base` and `default`.
//! 2. Memory per idle clone: RSS and Pss of each QEMU with 5 idle clones of one template
//!    running, and the drop of the host's `MemAvailable` per clone.
//! 3. First `python3 -c 'import json'` and first `node -e 0` in a fresh clone of a golden
//!    built without and with a warmup (the pool's `warmup`, run in the golden before the
//!    seal, importing both), each next to the same command's second run in that clone.
//! 4. `[qemu] template_disk`: virtio-blk vs virtio-pmem with DAX (`template_disks/`).
//!
//! `bench_templates disks` runs step 4 alone.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd::config::{AccelChoice, QemuConfig, QemuMachine, SizeConfig, TemplateConfig};
use sandboxd::engine::qemu::QemuEngine;
use sandboxd::engine::{Engine, Guest, GuestSpec};

// A debug build is `cargo xtask bench --quick`'s smoke run: small counts.
const RUNS: usize = if cfg!(debug_assertions) { 1 } else { 5 };
const IDLE_CLONES: usize = if cfg!(debug_assertions) { 1 } else { 5 };
const MEMORY_MIB: u64 = 384;
/// At most half of the guest's RAM (sandboxd's config check for qemu).
const DISK_MIB: u64 = 192;
const BOUND: Duration = Duration::from_secs(240);
/// What a pool's warmup would run: the runtimes' common modules, page-cache resident.
const WARMUP: &str = "python3 -c 'import json, os, re, subprocess, pathlib' && node -e 0";

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_templates: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[path = "host_mem/mod.rs"]
mod host_mem;
#[path = "template_disks/mod.rs"]
mod template_disks;

use host_mem::{mem_available_kib, qemu_pids, rss_pss_kib};

type BoxError = Box<dyn std::error::Error>;

fn image(name: &str) -> Result<PathBuf, BoxError> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/images")
        .join(name);
    p.canonicalize().map_err(|_| {
        format!(
            "no image at {}: run `cargo xtask image --template {name}`",
            p.display()
        )
        .into()
    })
}

fn spec(name: &str, image: &Path, golden_dir: PathBuf) -> GuestSpec {
    GuestSpec {
        template: name.into(),
        size: "small".into(),
        template_config: TemplateConfig {
            rootfs: image.join("rootfs"),
            image: Some(image.to_path_buf()),
            // The template's user, workdir and env, as sandboxd would pass them.
            meta: sandboxd::template::TemplateMeta::load(image).expect("the image's metadata"),
            detach_ring_bytes: None,
        },
        size_config: SizeConfig {
            cpus: 1,
            memory_mib: MEMORY_MIB,
            max_pids: 512,
            disk_mib: DISK_MIB,
        },
        no_balloon: false,
        golden_dir,
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn golden(engine: &QemuEngine, spec: &GuestSpec, warmup: bool) -> Result<(), BoxError> {
    let g = engine.boot_golden(spec).await?;
    sandboxd::guest::info(&*g, BOUND).await?;
    if warmup {
        let argv = ["sh", "-c", WARMUP].map(String::from);
        sandboxd::guest::run_checked(&*g, &argv, BOUND).await?;
    }
    engine.seal_golden(spec, g).await?;
    Ok(())
}

async fn clone_to_ready(
    engine: &QemuEngine,
    spec: &GuestSpec,
) -> Result<(Arc<dyn Guest>, Duration), BoxError> {
    let t = Instant::now();
    let guest = engine.start(spec).await?;
    sandboxd::guest::info(&*guest, BOUND).await?;
    if guest.origin() != "clone" {
        return Err(format!("{}: expected a clone", spec.template).into());
    }
    Ok((guest, t.elapsed()))
}

async fn timed(guest: &dyn Guest, script: &str) -> Result<Duration, BoxError> {
    let argv = ["sh", "-c", script].map(String::from);
    let t = Instant::now();
    sandboxd::guest::run_checked(guest, &argv, BOUND).await?;
    Ok(t.elapsed())
}

async fn bench() -> Result<(), BoxError> {
    let (base, default) = (image("base")?, image("default")?);
    let tmp = tempfile::tempdir()?;
    if std::env::args().nth(1).as_deref() == Some("disks") {
        return template_disks::compare(&base, &default, tmp.path()).await;
    }
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
        BOUND,
        Some(base.clone()),
    )?;
    let specs = [
        spec("base", &base, data.join("golden-base")),
        spec("default", &default, data.join("golden-default")),
    ];
    println!(
        "bench templates: {MEMORY_MIB} MiB guests, disk_mib {DISK_MIB}, accelerator {}",
        {
            let _ = engine.start(&specs[0]).await?.destroy().await;
            engine.info().accelerator.unwrap_or_default()
        }
    );
    for s in &specs {
        eprintln!("bench_templates: {}: golden, {RUNS} clones", s.template);
        golden(&engine, s, false).await?;
        let mut times = Vec::new();
        for _ in 0..RUNS {
            let (g, t) = clone_to_ready(&engine, s).await?;
            times.push(t);
            g.destroy().await;
        }
        println!(
            "  {:<8} clone-to-ready, median of {RUNS}: {:>7.1} ms (all: {:?})",
            s.template,
            ms(median(times.clone())),
            times.iter().map(|d| ms(*d).round()).collect::<Vec<_>>()
        );
        let avail_before = mem_available_kib()?;
        let mut idle = Vec::new();
        for _ in 0..IDLE_CLONES {
            idle.push(clone_to_ready(&engine, s).await?.0);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let avail_after = mem_available_kib()?;
        let pids = qemu_pids(&data.join("qemu/run"));
        let (mut rss, mut pss) = (0, 0);
        for pid in &pids {
            let (r, p) = rss_pss_kib(*pid)?;
            rss += r;
            pss += p;
        }
        let n = pids.len().max(1) as f64;
        println!(
            "  {:<8} idle clone ({IDLE_CLONES} running): RSS {:.1} MiB, Pss {:.1} MiB, \
             host MemAvailable drop {:.1} MiB",
            s.template,
            rss as f64 / 1024.0 / n,
            pss as f64 / 1024.0 / n,
            avail_before.saturating_sub(avail_after) as f64 / 1024.0 / IDLE_CLONES as f64
        );
        for g in idle {
            g.destroy().await;
        }
    }

    for warmup in [false, true] {
        let s = spec(
            "default",
            &default,
            data.join(format!("golden-default-warm-{warmup}")),
        );
        eprintln!("bench_templates: default golden, warmup {warmup}");
        golden(&engine, &s, warmup).await?;
        let (g, _) = clone_to_ready(&engine, &s).await?;
        for (what, script) in [
            ("python3 -c 'import json'", "python3 -c 'import json'"),
            ("node -e 0", "node -e 0"),
        ] {
            let first = timed(&*g, script).await?;
            let second = timed(&*g, script).await?;
            println!(
                "  default, {:<10} first {what:<26} {:>8.1} ms   second {:>8.1} ms",
                if warmup { "warmup" } else { "no warmup" },
                ms(first),
                ms(second)
            );
        }
        g.destroy().await;
    }
    engine.shutdown(false);
    // The quick form (a debug build) stops here: the disk comparison boots three more
    // goldens, minutes under TCG.
    if cfg!(debug_assertions) {
        return Ok(());
    }
    template_disks::compare(&base, &default, tmp.path()).await
}
