//! bench_templates' `[qemu] template_disk` comparison: `default`'s image reaching its
//! guests as one read-only virtio-blk disk (microvm, the default; and q35, to separate
//! the machine from the device) or as a virtio-pmem region mounted with DAX (q35 only:
//! microvm cannot map it). Per variant, with an engine of its own: clone-to-ready, memory
//! per idle clone, and the first and second `python3 -c 'import json'` in a fresh clone
//! of a golden without warmup (so the first run reads the image).

use std::path::Path;
use std::time::Duration;

use sandboxd::config::{AccelChoice, QemuConfig, QemuMachine, TemplateDisk};
use sandboxd::engine::qemu::QemuEngine;
use sandboxd::engine::{Engine, Guest};

use super::host_mem::{mem_available_kib, qemu_pids, rss_pss_kib};
use super::{clone_to_ready, golden, median, ms, spec, timed, BoxError, BOUND, IDLE_CLONES, RUNS};

/// (label, machine, disk), in the order printed.
const VARIANTS: [(&str, QemuMachine, TemplateDisk); 3] = [
    ("blk microvm", QemuMachine::Microvm, TemplateDisk::Blk),
    ("blk q35", QemuMachine::Q35, TemplateDisk::Blk),
    ("pmem q35", QemuMachine::Q35, TemplateDisk::Pmem),
];

pub async fn compare(base: &Path, default: &Path, tmp: &Path) -> Result<(), BoxError> {
    println!("template_disk: `default`, golden without warmup, {IDLE_CLONES} idle clones each");
    for (i, (label, machine, disk)) in VARIANTS.into_iter().enumerate() {
        eprintln!("bench_templates: template_disk {label}");
        let data = tmp.join(format!("disk-data-{i}"));
        let cfg = QemuConfig {
            binary: "qemu-system-x86_64".into(),
            accel: AccelChoice::Auto,
            machine,
            template_disk: disk,
            memory_dir: tmp.join(format!("disk-shm-{i}")),
            ..QemuConfig::default()
        };
        let engine = QemuEngine::new(
            &cfg,
            &data,
            Path::new("/sys/fs/cgroup"),
            BOUND,
            Some(base.to_path_buf()),
        )?;
        let s = spec("default", default, data.join("golden"));
        golden(&engine, &s, false).await?;
        let mut times = Vec::new();
        for _ in 0..RUNS {
            let (g, t) = clone_to_ready(&engine, &s).await?;
            times.push(t);
            g.destroy().await;
        }
        let avail_before = mem_available_kib()?;
        let mut idle: Vec<std::sync::Arc<dyn Guest>> = Vec::new();
        for _ in 0..IDLE_CLONES {
            idle.push(clone_to_ready(&engine, &s).await?.0);
        }
        // Each idle clone runs Python once: the image's pages it reads are what DAX
        // would share with the host's page cache and blk would copy into each guest.
        let mut first = Vec::new();
        let mut second = Vec::new();
        for g in &idle {
            first.push(timed(&**g, "python3 -c 'import json'").await?);
            second.push(timed(&**g, "python3 -c 'import json'").await?);
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
            "  {label:<12} clone-to-ready median {:>6.1} ms | after python: RSS {:.1} MiB, \
             Pss {:.1} MiB, host MemAvailable drop {:.1} MiB per clone | first python \
             median {:.0} ms (all {:?}), second {:.0} ms",
            ms(median(times)),
            rss as f64 / 1024.0 / n,
            pss as f64 / 1024.0 / n,
            avail_before.saturating_sub(avail_after) as f64 / 1024.0 / IDLE_CLONES as f64,
            ms(median(first.clone())),
            first.iter().map(|d| ms(*d).round()).collect::<Vec<_>>(),
            ms(median(second)),
        );
        for g in idle {
            g.destroy().await;
        }
        engine.shutdown(false);
    }
    Ok(())
}
