//! The environment a `cargo xtask bench --json` run stamps on its figures: CPU, cores,
//! engines, accelerator, QEMU and kernel versions, git commit. Read from the host, never
//! guessed: a value it cannot read is `null`.

use std::process::Command;

use serde_json::{json, Value};

use crate::workspace_root;

/// First line of a command's stdout, when it runs and succeeds.
fn first_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().map(|l| l.trim().to_string())
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

/// The stamp. The suites run QEMU with `accel = "tcg"`; `kvm_present` says whether this
/// host could have offered KVM.
pub fn stamp(quick: bool) -> Value {
    let dirty = first_line("git", &["status", "--porcelain"]).is_some();
    json!({
        "cpu": cpu_model(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "engines": ["process", "qemu"],
        "accelerator": "tcg",
        "kvm_present": std::path::Path::new("/dev/kvm").exists(),
        "qemu": first_line("qemu-system-x86_64", &["--version"]),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string()),
        "commit": first_line("git", &["rev-parse", "HEAD"]),
        "dirty": dirty,
        "build": if quick { "debug (--quick)" } else { "release" },
        "loadavg": std::fs::read_to_string("/proc/loadavg").ok().map(|s| s.trim().to_string()),
    })
}
