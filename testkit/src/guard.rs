//! [`ChildGuard`]: a process a test spawned, which never outlives the test. Dropping it
//! (at the end of the test, or while a panic unwinds) stops the child (SIGTERM, a grace
//! period, then SIGKILL), reaps it, kills whatever still carries its sweep marker (the
//! sandboxes and QEMUs a daemon left), and prints its log when the test failed.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::procs;

/// A spawned child that is stopped and reaped when dropped.
pub struct ChildGuard {
    child: Child,
    name: String,
    grace: Duration,
    log: Option<PathBuf>,
    sweep: Option<String>,
    /// Set once the test itself saw the child exit.
    exit: Option<ExitStatus>,
}

impl ChildGuard {
    /// Spawns `cmd` as `name` (for messages). The child also gets SIGTERM if the test
    /// thread dies first (`PR_SET_PDEATHSIG`).
    pub fn spawn(name: &str, cmd: &mut Command) -> ChildGuard {
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        ChildGuard {
            child,
            name: name.to_string(),
            grace: Duration::from_secs(15),
            log: None,
            sweep: None,
            exit: None,
        }
    }

    /// How long the child gets between SIGTERM and SIGKILL on drop (15 s unless set).
    pub fn grace(mut self, grace: Duration) -> ChildGuard {
        self.grace = grace;
        self
    }

    /// The file the child logs to; printed when the test fails.
    pub fn log(mut self, path: PathBuf) -> ChildGuard {
        self.log = Some(path);
        self
    }

    /// On drop, after the child is gone, SIGKILL every process whose command line
    /// contains `marker` (e.g. the daemon's data dir: its sandboxes and QEMUs).
    pub fn sweep(mut self, marker: String) -> ChildGuard {
        self.sweep = Some(marker);
        self
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the child.
    pub fn signal(&self, signal: Signal) {
        if self.exit.is_none() {
            kill(Pid::from_raw(self.pid() as i32), signal)
                .unwrap_or_else(|e| panic!("signalling {}: {e}", self.name));
        }
    }

    /// The child's exit status if it has exited (reaping it), else `None`.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("try_wait");
        }
        self.exit
    }

    /// Waits (blocking) up to `within` for the child to exit; its status, or `None`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        if self.exit.is_none() && exits_within(self.pid(), within) {
            self.exit = Some(self.child.wait().expect("wait"));
        }
        self.exit
    }

    /// Sends SIGTERM and waits up to `within` for the exit; panics if none comes.
    pub fn terminate(&mut self, within: Duration) -> ExitStatus {
        self.signal(Signal::SIGTERM);
        self.wait_exit(within)
            .unwrap_or_else(|| panic!("{} still running {within:?} after SIGTERM", self.name))
    }

    /// SIGKILLs the child and reaps it; nothing is swept (tests of crash recovery).
    pub fn kill(&mut self) -> ExitStatus {
        if self.exit.is_none() {
            let _ = self.child.kill();
            self.exit = Some(self.child.wait().expect("wait"));
        }
        self.exit.unwrap()
    }

    /// The log so far ("" without one).
    pub fn log_text(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // (how it ended, whether that was clean)
        let (how, clean) = if let Some(status) = self.try_exit() {
            (format!("exited during the test: {status}"), true)
        } else {
            self.signal(Signal::SIGTERM);
            match self.wait_exit(self.grace) {
                Some(status) => (format!("SIGTERM: {status}"), status.success()),
                None => {
                    self.kill();
                    (format!("SIGKILLed after {:?}", self.grace), false)
                }
            }
        };
        if let Some(marker) = &self.sweep {
            sweep(marker);
        }
        if self.log.is_some() && (std::thread::panicking() || !clean) {
            eprintln!("---- {} ({how}) log ----\n{}", self.name, self.log_text());
        }
    }
}

/// SIGKILLs every process (but this one) whose command line contains `marker`.
pub fn sweep(marker: &str) {
    for pid in procs::procs_with(marker) {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
}

/// Waits (blocking, without polling) up to `within` for process `pid` to exit, through a
/// pidfd; true once it has (a zombie counts).
pub fn exits_within(pid: u32, within: Duration) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        // Already reaped: nothing left to wait for.
        return true;
    }
    // SAFETY: the descriptor was just returned to us and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let timeout = within.as_millis().min(i32::MAX as u128) as i32;
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd that lives across the call.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout) };
        if n >= 0 {
            return n > 0;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            panic!("poll on a pidfd: {}", std::io::Error::last_os_error());
        }
    }
}
