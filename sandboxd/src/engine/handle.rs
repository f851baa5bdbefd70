//! What finds a running guest again after sandboxd restarts (its [`GuestHandle`], stored
//! with its claim), and [`PidFd`]: a process proven to be the recorded one (pid and start
//! time from `/proc/PID/stat`), signalled and watched through a pidfd so that a pid the
//! kernel reuses is never mistaken for it. Nothing here decides what is ours; engines
//! check a handle's run dir and cgroups against their own before trusting it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;

/// Enough to find and re-open one guest: stored with its claim, read back on start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestHandle {
    /// The engine that made it (`process`, `qemu`).
    pub engine: String,
    /// The engine's guest id (its run dir's name).
    pub guest_id: String,
    /// The guest's run dir (sockets, log), under the engine's own directory.
    pub run_dir: PathBuf,
    /// The process the guest lives as long as (bwrap, QEMU).
    pub pid: i32,
    /// Its start time, in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start_time: u64,
    /// The process engine's pid-namespace init (killing it ends the namespace).
    #[serde(default)]
    pub init: Option<(i32, u64)>,
    /// The host uid it runs as, when sandboxd gave it one of its own.
    #[serde(default)]
    pub uid: Option<u32>,
    /// Its cgroup directories.
    #[serde(default)]
    pub cgroups: Vec<PathBuf>,
}

/// A process's start time in clock ticks since boot, or `None` when there is no such
/// process (or it is a zombie already being torn down).
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and ')': fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    // `rest` starts at field 3 (state); the start time is field 22. A zombie has exited
    // (an orphan waits for a reaper that may be slow): gone, whatever its stat says.
    let mut fields = rest.split_whitespace();
    if matches!(fields.next()?, "Z" | "X") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// A process held by a pidfd: signals reach it or nothing, never a later process that
/// got its pid.
pub struct PidFd {
    pid: i32,
    fd: OwnedFd,
}

impl PidFd {
    /// Opens `pid` if it is running and started at `start` (the recorded one); `None`
    /// otherwise. The start time is checked after the pidfd is open, so the pidfd holds
    /// the very process that matched.
    pub fn open(pid: i32, start: u64) -> Option<PidFd> {
        if pid <= 1 {
            return None;
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the descriptor was just returned to us and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        (start_time(pid) == Some(start)).then_some(PidFd { pid, fd })
    }

    /// Opens a process that is known to be ours right now (a child just spawned), with
    /// its start time for the record.
    pub fn own(pid: i32) -> std::io::Result<(PidFd, u64)> {
        let start = start_time(pid)
            .ok_or_else(|| std::io::Error::other(format!("pid {pid} has no start time")))?;
        PidFd::open(pid, start)
            .map(|p| (p, start))
            .ok_or_else(|| std::io::Error::other(format!("pid {pid} exited")))
    }

    /// The pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Sends SIGKILL; a process that has exited ignores it (ESRCH), and a reused pid is
    /// never reached.
    pub fn kill(&self) {
        // SAFETY: pidfd_send_signal with a pidfd we own, no siginfo, no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }

    /// Resolves once the process has exited (whoever reaps it: it is not our child after
    /// a restart).
    pub async fn exited(self) -> std::io::Result<()> {
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the same for its life.
        let fd = unsafe { AsyncFd::register_with_interest(self.fd, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let _ready = fd.readable().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_tells_processes_apart() {
        let me = std::process::id() as i32;
        let t = start_time(me).expect("our own start time");
        assert!(PidFd::open(me, t).is_some());
        // The same pid with another start time is another process: refused.
        assert!(PidFd::open(me, t + 1).is_none());
        assert!(PidFd::open(1, start_time(1).unwrap_or(0)).is_none());
        assert_eq!(start_time(i32::MAX), None);
    }

    #[tokio::test]
    async fn exited_resolves_for_a_process_that_is_not_waited_on() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.05")
            .spawn()
            .unwrap();
        let (fd, _) = PidFd::own(child.id() as i32).unwrap();
        // Reaped elsewhere, as init reaps an adopted guest's process.
        let waiter = std::thread::spawn(move || child.wait());
        fd.exited().await.unwrap();
        waiter.join().unwrap().unwrap();
    }

    #[test]
    fn a_zombie_has_no_start_time() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Exited but not yet reaped: a zombie, which no record may match.
        let zombie = (0..1000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
        });
        assert!(zombie, "the child never became a zombie");
        assert_eq!(start_time(pid), None);
        child.wait().unwrap();
    }
}
