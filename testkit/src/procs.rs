//! Reading `/proc`: processes by command line or process group, their state, pending
//! signals and counters; and the waits built on them. Pids are `u32` throughout, as the
//! wire protocol and `std::process` have them.

use std::time::Duration;

use crate::wait::{empty, wait_until};

/// `flags` bit of a task that is exiting (include/linux/sched.h).
const PF_EXITING: u64 = 0x4;

/// The fields of `/proc/PID/stat` the tests look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `D`, `Z`, ...
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
    /// Process group.
    pub pgrp: u32,
    /// Kernel task flags.
    pub flags: u64,
}

/// `/proc/PID/stat`, or `None` when the process is gone.
pub fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name: state ppid pgrp session tty tpgid flags.
    let (_, rest) = text.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        flags: f.get(6)?.parse().ok()?,
    })
}

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| !matches!(s.state, 'Z' | 'X'))
}

/// A `/proc/PID/status` value (the first number after `field`, e.g. `"VmRSS:"`).
pub fn status_field(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// True when `pid` has been signalled to death or any signal is pending for it: gone, a
/// zombie, exiting, or with a non-empty pending set. A fatal signal is visible here as
/// soon as the `kill` that sent it returned.
pub fn signalled(pid: u32) -> bool {
    let Some(s) = stat(pid) else { return true };
    if matches!(s.state, 'Z' | 'X') || s.flags & PF_EXITING != 0 {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    status.lines().any(|l| {
        let pending = l
            .strip_prefix("SigPnd:")
            .or_else(|| l.strip_prefix("ShdPnd:"));
        pending.is_some_and(|mask| u64::from_str_radix(mask.trim(), 16) != Ok(0))
    })
}

/// Bytes `pid` has written so far (`wchar` of `/proc/PID/io`).
pub fn written_bytes(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Pids of processes (other than this one) whose command line contains `marker`.
pub fn procs_with(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    pids()
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                String::from_utf8_lossy(&cmdline)
                    .replace('\0', " ")
                    .contains(marker)
            })
        })
        .collect()
}

/// Pids of live (non-zombie) processes whose process group is `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    pids()
        .filter(|&pid| stat(pid).is_some_and(|s| s.pgrp == pgid && s.state != 'Z'))
        .collect()
}

/// Every pid in `/proc`.
pub fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
}

/// A sleep duration no other test (or test process) uses, to find its processes by:
/// `sleep <marker>` shows up in `/proc/PID/cmdline`.
pub fn marker(n: u32) -> String {
    format!("{}.{:05}{n}", 600 + n, std::process::id() % 100_000)
}

/// Waits until a process with `marker` runs.
pub async fn wait_running(marker: &str) {
    let what = format!("a process with {marker:?}");
    wait_until(Duration::from_secs(5), &what, async || {
        !procs_with(marker).is_empty()
    })
    .await
}

/// Waits until no process with `marker` remains (SIGKILL takes a moment to land).
pub async fn assert_gone(marker: &str) {
    wait_gone(marker, Duration::from_secs(2)).await
}

/// [`assert_gone`] within `within`.
pub async fn wait_gone(marker: &str, within: Duration) {
    let what = format!("every process with {marker:?} to be gone");
    wait_until(within, &what, async || empty(procs_with(marker))).await
}

/// Waits until no live process of group `pgid` remains.
pub async fn wait_group_gone(pgid: u32, within: Duration) {
    let what = format!("process group {pgid} to be gone");
    wait_until(within, &what, async || empty(group_members(pgid))).await
}

/// Waits until at least `n` live processes are in group `pgid`.
pub async fn wait_group_size(pgid: u32, n: usize) {
    let what = format!("{n} processes in group {pgid}");
    wait_until(Duration::from_secs(10), &what, async || {
        let members = group_members(pgid);
        if members.len() >= n {
            Ok(())
        } else {
            Err(members)
        }
    })
    .await
}
