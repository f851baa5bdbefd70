//! Per-command cgroups: each command starts inside its own child of a cgroup2 directory
//! (`--cgroup`), so a kill reaches everything it started, including processes that left
//! its process group with `setsid`. Killing is `cgroup.kill` (Linux 5.14+), else freeze
//! and SIGKILL every pid listed until none is left.
//!
//! Must not: signal a pid by number outside a frozen cgroup (it could be recycled), or
//! remove a cgroup that still holds processes (the kernel refuses; we retry later).

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{Error, Result};

/// `statfs` magic of a cgroup2 filesystem.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// How long the fallback kill waits for a cgroup to empty. SIGKILLed processes leave
/// `cgroup.procs` within microseconds; this only bounds a kernel that misbehaves.
const FALLBACK_BOUND: Duration = Duration::from_secs(2);

/// The directory commands' cgroups are created in.
#[derive(Debug)]
pub struct ExecCgroups {
    dir: PathBuf,
    next: AtomicU64,
    has_kill: bool,
}

/// One command's cgroup, just created; `procs` is its `cgroup.procs`, open for the child
/// to move itself in before it runs anything.
pub struct NewCgroup {
    /// The cgroup's directory.
    pub path: PathBuf,
    /// `cgroup.procs`, write-only, close-on-exec.
    pub procs: OwnedFd,
}

impl ExecCgroups {
    /// Checks that `dir` is a cgroup2 directory we may create children in (by creating and
    /// removing one) and whether the kernel has `cgroup.kill`.
    pub fn open(dir: &Path) -> Result<ExecCgroups> {
        let fs = nix::sys::statfs::statfs(dir).map_err(|e| {
            Error::io(
                format!("--cgroup {}", dir.display()),
                std::io::Error::from(e),
            )
        })?;
        if fs.filesystem_type().0 as i64 != CGROUP2_SUPER_MAGIC {
            return Err(Error::BadRequest(format!(
                "--cgroup {} is not a cgroup2 directory",
                dir.display()
            )));
        }
        let probe = dir.join(format!("silkd-probe-{}", std::process::id()));
        std::fs::create_dir(&probe)
            .map_err(|e| Error::io(format!("creating {}", probe.display()), e))?;
        let has_kill = probe.join("cgroup.kill").exists();
        std::fs::remove_dir(&probe)
            .map_err(|e| Error::io(format!("removing {}", probe.display()), e))?;
        Ok(ExecCgroups {
            dir: dir.to_path_buf(),
            next: AtomicU64::new(1),
            has_kill,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether kills use `cgroup.kill` (else the freeze-and-list fallback).
    pub fn has_kill(&self) -> bool {
        self.has_kill
    }

    /// Creates a fresh, empty cgroup for one command.
    pub fn create(&self) -> Result<NewCgroup> {
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            // The pid keeps two silkds sharing a directory (tests) apart.
            let path = self.dir.join(format!("exec-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => {}
                // Left by an earlier silkd with our pid; take the next name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(format!("creating {}", path.display()), e)),
            }
            let procs = match open_write(&path.join("cgroup.procs")) {
                Ok(fd) => fd,
                Err(e) => {
                    let _ = std::fs::remove_dir(&path);
                    return Err(Error::io(
                        format!("opening {}/cgroup.procs", path.display()),
                        e,
                    ));
                }
            };
            return Ok(NewCgroup { path, procs });
        }
    }

    /// SIGKILLs every process in the cgroup at `path`.
    pub fn kill(&self, path: &Path) -> Result<()> {
        if self.has_kill {
            return std::fs::write(path.join("cgroup.kill"), "1")
                .map_err(|e| Error::io(format!("writing {}/cgroup.kill", path.display()), e));
        }
        kill_listed(path)
    }

    /// Removes the cgroup once it is empty: true when it is gone, false while processes
    /// (something the command left running) still hold it.
    pub fn remove(path: &Path) -> bool {
        match std::fs::remove_dir(path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => {
                if e.raw_os_error() != Some(libc::EBUSY) {
                    tracing::warn!("removing {}: {e}", path.display());
                }
                false
            }
        }
    }
}

/// The fallback kill, for kernels without `cgroup.kill`: freeze the cgroup (so nothing
/// in it forks or exits while we read pids; a frozen task still dies of SIGKILL), SIGKILL
/// every pid in `cgroup.procs`, repeat until none is listed, thaw.
pub fn kill_listed(path: &Path) -> Result<()> {
    let freeze = path.join("cgroup.freeze");
    let frozen = std::fs::write(&freeze, "1").is_ok();
    let deadline = Instant::now() + FALLBACK_BOUND;
    let outcome = loop {
        let pids = match std::fs::read_to_string(path.join("cgroup.procs")) {
            Ok(text) => text,
            Err(e) => {
                break Err(Error::io(
                    format!("reading {}/cgroup.procs", path.display()),
                    e,
                ))
            }
        };
        let pids: Vec<i32> = pids.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            break Ok(());
        }
        if Instant::now() > deadline {
            break Err(Error::io(
                format!("{} still holds {pids:?} after SIGKILL", path.display()),
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            ));
        }
        for pid in pids {
            // ESRCH: it died between the listing and now.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        // Killed processes take a moment to leave the list; look again shortly.
        std::thread::sleep(Duration::from_millis(1));
    };
    if frozen {
        let _ = std::fs::write(&freeze, "0");
    }
    outcome
}

fn open_write(path: &Path) -> std::io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: open(2) on a NUL-terminated path we own; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned by open(2), owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs`. Runs in the
/// forked child before exec, so it only makes one async-signal-safe `write(2)`.
pub fn enter(procs: RawFd) -> std::io::Result<()> {
    // SAFETY: write(2) of a 1-byte static buffer to a descriptor the parent holds open.
    let n = unsafe { libc::write(procs, b"0".as_ptr().cast(), 1) };
    if n == 1 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
