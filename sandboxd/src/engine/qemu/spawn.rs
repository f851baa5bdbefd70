//! Starting one QEMU process: the sockets sandboxd binds for it in its private run dir,
//! the fds it inherits (it opens nothing of ours by path), its own cgroup, and its own
//! unprivileged uid. Nothing else in this engine calls exec.
//!
//! QEMU is exec'd as its uid directly (setgroups, setgid, setuid before exec) rather than
//! with `-run-with user=`: QEMU switches users only after installing its `-sandbox`
//! filter, and `elevateprivileges=deny` kills it with SIGSYS for that very setuid.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;

use super::cmdline;
use super::console::Ring;
use crate::config::SizeConfig;
use crate::engine::cgroup::{Cgroup, Cgroups};
use crate::engine::handle::PidFd;
use crate::error::{Error, Result};

/// Bytes of console kept per VM (its tail shows in error messages).
const CONSOLE_RING: usize = 64 * 1024;
/// Bytes of QEMU's stderr kept per VM.
const STDERR_RING: usize = 16 * 1024;
/// Where the inherited fds wait between `fcntl` and `dup2`: above every target, so
/// moving one into place never overwrites another.
const PARKED_FDS_FROM: RawFd = 100;

/// The files a QEMU reads or maps; sandboxd opened (and for the golden's, verified) them.
pub struct Files<'a> {
    /// The kernel image.
    pub kernel: &'a File,
    /// The initramfs (none for a restoring QEMU, which boots nothing).
    pub initrd: Option<&'a File>,
    /// The golden's memory file (golden and clones).
    pub memory: Option<&'a File>,
    /// The golden's migration state (written by the golden, read by clones).
    pub state: Option<&'a File>,
    /// The template's read-only root disk.
    pub disk: Option<&'a File>,
}

/// Who QEMU runs as.
pub struct RunAs<'a> {
    /// Switch to `uid`/`gid` (sandboxd is root); otherwise QEMU runs as sandboxd's user.
    pub switch: bool,
    /// Its uid.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// Its supplementary groups (clones: the group that may read golden files).
    pub groups: &'a [u32],
}

/// A started QEMU and what sandboxd keeps of it.
pub struct Spawned {
    /// The process.
    pub child: tokio::process::Child,
    /// The guest console, drained into a ring.
    pub console: Ring,
    /// QEMU's stderr, drained into a ring.
    pub stderr: Ring,
    /// Its cgroup (no directories where the host has no cgroup controllers).
    pub cgroup: Cgroup,
    /// The same process through a pidfd (signals never reach a reused pid), and its
    /// start time, for the guest's record.
    pub pidfd: PidFd,
    /// Its start time in clock ticks since boot.
    pub start_time: u64,
}

/// Starts `binary args` as `run_as`, in a new cgroup `id` limited to `limits`, with the
/// QMP and channel sockets bound in `run_dir` and `files` inherited at the fd numbers
/// `cmdline` names.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    binary: &Path,
    args: &[std::ffi::OsString],
    run_dir: &Path,
    run_as: &RunAs<'_>,
    cgroups: &Cgroups,
    id: &str,
    limits: &SizeConfig,
    files: &Files<'_>,
) -> Result<Spawned> {
    let bind = |path: &Path| {
        UnixListener::bind(path).map_err(Error::io(format!("binding {}", path.display())))
    };
    let qmp = bind(&cmdline::qmp_socket(run_dir))?;
    let channel = bind(&cmdline::silkd_socket(run_dir))?;
    let (console_host, console_qemu) = UnixStream::pair().map_err(Error::io("socketpair"))?;

    let mut inherit: Vec<(OwnedFd, RawFd)> = vec![
        (park(qmp.as_raw_fd())?, cmdline::QMP_FD),
        (park(channel.as_raw_fd())?, cmdline::CHANNEL_FD),
        (park(console_qemu.as_raw_fd())?, cmdline::CONSOLE_FD),
        (park(files.kernel.as_raw_fd())?, cmdline::KERNEL_FD),
    ];
    if let Some(i) = files.initrd {
        inherit.push((park(i.as_raw_fd())?, cmdline::INITRD_FD));
    }
    if let Some(m) = files.memory {
        inherit.push((park(m.as_raw_fd())?, cmdline::MEMORY_FD));
    }
    if let Some(s) = files.state {
        inherit.push((park(s.as_raw_fd())?, cmdline::STATE_FD));
    }
    if let Some(d) = files.disk {
        inherit.push((park(d.as_raw_fd())?, cmdline::DISK_FD));
    }
    let moves: Vec<(RawFd, RawFd)> = inherit.iter().map(|(f, t)| (f.as_raw_fd(), *t)).collect();

    let (cgroup, procs) = cgroups
        .create(id, limits)
        .map_err(Error::io(format!("creating cgroup for {id}")))?;
    let procs_fds: Vec<RawFd> = procs.iter().map(|f| f.as_raw_fd()).collect();
    let (switch, uid, gid) = (run_as.switch, run_as.uid, run_as.gid);
    let groups: Vec<libc::gid_t> = run_as.groups.to_vec();

    let mut cmd = std::process::Command::new(binary);
    cmd.args(args)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // SAFETY: between fork and exec only async-signal-safe calls (setsid, write,
    // setgroups, setgid, setuid, dup2, prctl) run, on fds and a vector made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let check = |r: libc::c_int| {
                if r < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            };
            // A session of its own: the VM outlives sandboxd (a restart re-adopts it), so
            // nothing aimed at sandboxd's session or process group reaches it.
            check(libc::setsid())?;
            // Join the cgroup while still root: QEMU is inside from its first instruction.
            for fd in &procs_fds {
                if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (from, to) in &moves {
                // dup2 leaves the new fd without FD_CLOEXEC: QEMU inherits it.
                check(libc::dup2(*from, *to))?;
            }
            if switch {
                check(libc::setgroups(groups.len(), groups.as_ptr()))?;
                check(libc::setgid(gid))?;
                check(libc::setuid(uid))?;
            }
            // No transparent huge pages (inherited across exec): QEMU asks for them on its
            // TCG translation cache, and one translated block then made a whole 2 MiB of
            // it resident: an idle clone's cache held 8 MiB (four huge pages), 6.6 without.
            check(libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0))?;
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        });
    }
    // Not killed with its handle: a VM left running on stop outlives it; every other
    // path destroys the guest (or its Drop kills it through the pidfd). Once sandboxd is
    // gone QEMU's writes to its stderr pipe and console socket fail with EPIPE: QEMU
    // ignores SIGPIPE (seen in its SigIgn here), so they cost it nothing.
    let mut child = match tokio::process::Command::from(cmd)
        .kill_on_drop(false)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            cgroup.remove();
            return Err(Error::Engine(format!("spawning {}: {e}", binary.display())));
        }
    };
    // QEMU holds the listening sockets now: with ours closed, a connect after it exits
    // fails at once instead of waiting in a backlog nobody accepts.
    drop((qmp, channel, console_qemu, inherit, procs));
    // Our unreaped child: its pid cannot be reused before we wait for it.
    let (pidfd, start_time) = match child.id().map(|p| PidFd::own(p as i32)) {
        Some(Ok(p)) => p,
        failed => {
            let _ = child.start_kill();
            cgroup.kill_all();
            cgroup.remove();
            let why = match failed {
                Some(Err(e)) => e.to_string(),
                _ => "it exited at once".into(),
            };
            return Err(Error::Engine(format!("QEMU pidfd: {why}")));
        }
    };

    let console = Ring::new(CONSOLE_RING);
    console_host
        .set_nonblocking(true)
        .map_err(Error::io("console socket"))?;
    let host_end =
        tokio::net::UnixStream::from_std(console_host).map_err(Error::io("console socket"))?;
    console.fill_from(host_end);
    let stderr = Ring::new(STDERR_RING);
    if let Some(err) = child.stderr.take() {
        stderr.fill_from(err);
    }
    Ok(Spawned {
        child,
        console,
        stderr,
        cgroup,
        pidfd,
        start_time,
    })
}

/// A close-on-exec duplicate of `fd` at or above [`PARKED_FDS_FROM`].
fn park(fd: RawFd) -> Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on an fd we hold open returns a new fd or -1.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, PARKED_FDS_FROM) };
    if new < 0 {
        return Err(Error::Engine(format!(
            "dup fd: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `new` was just returned by fcntl and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}
