//! What the VM benchmarks read of the host: `MemAvailable`, the QEMUs of a run dir (by
//! command line), and a process's RSS and Pss. Included by `bench_vm` and
//! `bench_templates` with `#[path]` (a folder without `main.rs` is not an example).

use std::path::Path;

type BoxError = Box<dyn std::error::Error>;

pub fn mem_available_kib() -> Result<u64, BoxError> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no MemAvailable".into())
}

pub fn qemu_pids(run_root: &Path) -> Vec<u32> {
    let needle = run_root.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(&needle) {
                out.push(pid);
            }
        }
    }
    out
}

pub fn rss_pss_kib(pid: u32) -> Result<(u64, u64), BoxError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((field("Rss:"), field("Pss:")))
}
