//! VMs an earlier sandboxd started: re-adopting a recorded one (trusted only as far as it
//! is provably ours: its run dir at its exact path and private to us, its cgroups at
//! their exact paths, QEMU alive with the recorded start time, inside that cgroup and
//! running as the recorded uid from our range, then its channel answering a fresh
//! session), and the sweep of every VM, run dir, cgroup and stray memory file no kept
//! record owns. A process is never matched by its command line.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::console::Ring;
use super::guest::{Parts, Qemu};
use super::{private, QemuEngine, QemuGuest};
use crate::engine::handle::{start_time, PidFd};
use crate::engine::GuestHandle;
use crate::error::{Error, Result};

/// Bound on the channel handshake with a running VM being re-adopted: its silkd is up and
/// wakes on the reconnect within milliseconds; a VM that cannot answer in this is dropped.
const ADOPT_CONNECT: Duration = Duration::from_secs(15);

impl QemuEngine {
    /// Re-opens the VM `h` records, or says why it is not (or no longer) ours.
    pub(super) async fn adopt_guest(&self, h: &GuestHandle) -> Result<Arc<QemuGuest>> {
        let not_ours = |why: String| Error::Engine(format!("VM {}: {why}", h.guest_id));
        if h.engine != "qemu" {
            return Err(not_ours(format!("recorded by the {} engine", h.engine)));
        }
        // `random_id`'s shape: 12 bytes in hex. Anything else never came from us.
        let id_ok = h.guest_id.len() == 24 && h.guest_id.bytes().all(|b| b.is_ascii_hexdigit());
        let dir = self.run_root.join(&h.guest_id);
        if !id_ok || h.run_dir != dir || h.init.is_some() {
            return Err(not_ours(format!(
                "run dir {} is not one of ours",
                h.run_dir.display()
            )));
        }
        if !private::is_private_dir(&dir) {
            return Err(not_ours(format!(
                "run dir {} is gone or not private to sandboxd",
                dir.display()
            )));
        }
        let cgroup = self
            .cgroups
            .reopen(&h.guest_id, &h.cgroups)
            .ok_or_else(|| not_ours(format!("cgroups {:?} are not ours", h.cgroups)))?;
        let pidfd = PidFd::open(h.pid, h.start_time).ok_or_else(|| {
            not_ours(format!(
                "its QEMU is gone (no process {} started at {})",
                h.pid, h.start_time
            ))
        })?;
        // Where cgroups exist, QEMU must be in the VM's own: a pid and start time alone
        // are not proof enough to signal a process.
        if !cgroup.dirs().is_empty() && !cgroup.pids().contains(&h.pid) {
            return Err(not_ours(format!("process {} is not in its cgroup", h.pid)));
        }
        let identity = match (self.identities.switching(), h.uid) {
            (true, Some(uid)) => self.identities.reserve(uid)?,
            (false, None) => self.identities.take()?,
            _ => {
                return Err(not_ours(
                    "its uid does not match this node's identities".into(),
                ))
            }
        };
        if real_uid(h.pid) != Some(identity.uid()) {
            return Err(not_ours(format!(
                "process {} does not run as uid {}",
                h.pid,
                identity.uid()
            )));
        }
        let watch = PidFd::open(h.pid, h.start_time)
            .ok_or_else(|| not_ours("its QEMU exited while being adopted".into()))?;
        let guest = QemuGuest::supervise(
            Qemu::Adopted(watch),
            Parts {
                id: h.guest_id.clone(),
                run_dir: dir,
                // The earlier sandboxd held the console and stderr; they are not
                // re-attached (QEMU drops what it writes there while nobody listens).
                console: Ring::new(1),
                stderr: Ring::new(1),
                cgroup,
                identity,
                pidfd,
                handle: h.clone(),
            },
        );
        // A fresh session: silkd ended the old one when the earlier sandboxd's end of the
        // chardev hung up, and the nonce handshake keeps any stale byte out of this one.
        if let Err(e) = guest.connect(ADOPT_CONNECT).await {
            let e = guest.launch_error(e);
            guest.kill_and_clean().await;
            return Err(not_ours(format!("its channel did not reopen: {e}")));
        }
        Ok(guest)
    }

    /// Destroys what no record in `keep` owns: VMs in cgroups of ours, VMs holding a
    /// socket in a run dir of ours (hosts without cgroups), those run dirs, and files in
    /// the memory dir that are not golden memory files.
    pub(super) fn sweep_unowned(&self, keep: &[GuestHandle]) {
        let cgroups: Vec<PathBuf> = keep.iter().flat_map(|h| h.cgroups.clone()).collect();
        self.cgroups.remove_stale_except(&cgroups);
        if let Ok(files) = std::fs::read_dir(&self.memory_dir) {
            for f in files.flatten() {
                if !is_golden_memory_name(&f.file_name().to_string_lossy()) {
                    tracing::warn!(file = %f.path().display(), "removing a memory file no golden owns");
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
        let Ok(entries) = std::fs::read_dir(&self.run_root) else {
            return;
        };
        let unowned: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| !keep.iter().any(|h| &h.run_dir == p))
            .collect();
        if unowned.is_empty() {
            return;
        }
        for holder in socket_holders(&unowned) {
            tracing::warn!(
                pid = holder.pid(),
                "killing a QEMU no record owns (it holds a socket of ours)"
            );
            holder.kill();
        }
        for d in unowned {
            tracing::warn!(dir = %d.display(), "removing a VM run dir no record owns");
            if let Err(e) = std::fs::remove_dir_all(&d) {
                tracing::warn!(dir = %d.display(), "cannot remove: {e}");
            }
        }
    }
}

/// `golden-<16 hex>.mem`, the only files the engine puts in its memory dir.
fn is_golden_memory_name(name: &str) -> bool {
    name.strip_prefix("golden-")
        .and_then(|n| n.strip_suffix(".mem"))
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A process's real uid (`/proc/PID/status`).
fn real_uid(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Every process (but this one) holding a Unix socket bound in one of `dirs`, through a
/// pidfd. Only sandboxd can bind in its 0700 run dirs, so a holder got the socket from
/// a sandboxd: it is a QEMU of ours, whatever its command line says.
fn socket_holders(dirs: &[PathBuf]) -> Vec<PidFd> {
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return Vec::new();
    };
    let inodes: HashSet<u64> = table
        .lines()
        .skip(1)
        .filter_map(unix_socket_entry)
        .filter(|(_, path)| {
            Path::new(path)
                .parent()
                .is_some_and(|p| dirs.iter().any(|d| d == p))
        })
        .map(|(inode, _)| inode)
        .collect();
    if inodes.is_empty() {
        return Vec::new();
    }
    let me = std::process::id() as i32;
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut holders = Vec::new();
    for p in procs.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        // The pidfd first, then the check: the process checked is the one signalled.
        let Some(fd) = start_time(pid).and_then(|t| PidFd::open(pid, t)) else {
            continue;
        };
        if holds_any(pid, &inodes) {
            holders.push(fd);
        }
    }
    holders
}

fn holds_any(pid: i32, inodes: &HashSet<u64>) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| inodes.contains(&n))
        })
    })
}

/// The inode and path of one `/proc/net/unix` line (`Num RefCount Protocol Flags Type St
/// Inode Path`); `None` for an unnamed socket. The path is the rest of the line, spaces
/// and all.
fn unix_socket_entry(line: &str) -> Option<(u64, &str)> {
    let mut rest = line;
    let mut inode = None;
    for _ in 0..7 {
        rest = rest.trim_start();
        let end = rest.find(' ').unwrap_or(rest.len());
        inode = Some(&rest[..end]);
        rest = &rest[end..];
    }
    let path = rest.strip_prefix(' ')?;
    (!path.is_empty()).then_some(())?;
    Some((inode?.parse().ok()?, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_unix_lines_give_inode_and_path() {
        let named =
            "0000000000000000: 00000002 00000000 00010000 0001 01 123456 /run/a b/silkd.sock";
        assert_eq!(
            unix_socket_entry(named),
            Some((123456, "/run/a b/silkd.sock"))
        );
        let unnamed = "0000000000000000: 00000003 00000000 00000000 0001 03  7890";
        assert_eq!(unix_socket_entry(unnamed), None);
        assert_eq!(unix_socket_entry("garbage"), None);
    }

    #[test]
    fn only_golden_memory_names_are_kept() {
        assert!(is_golden_memory_name("golden-0123456789abcdef.mem"));
        for stray in [
            "golden-0123456789abcdef.mem.tmp",
            "golden-xyz.mem",
            "clone.mem",
            "golden-0123456789abcdef0.mem",
        ] {
            assert!(!is_golden_memory_name(stray), "{stray}");
        }
    }

    #[tokio::test]
    async fn a_holder_of_a_socket_in_our_dir_is_found_and_no_one_else() {
        let tmp = tempfile::tempdir().unwrap();
        let ours = tmp.path().join("ours");
        let other = tmp.path().join("other");
        std::fs::create_dir_all(&ours).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(ours.join("s.sock")).unwrap();
        let _bystander = std::os::unix::net::UnixListener::bind(other.join("s.sock")).unwrap();
        // A child inherits our listener (as QEMU does); this process itself is skipped.
        let mut child = {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let fd = listener.as_raw_fd();
            let mut cmd = std::process::Command::new("sleep");
            cmd.arg("30");
            // SAFETY: only dup2 runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::dup2(fd, 3) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            cmd.spawn().unwrap()
        };
        let found: Vec<i32> = socket_holders(std::slice::from_ref(&ours))
            .iter()
            .map(|p| p.pid())
            .collect();
        assert_eq!(found, vec![child.id() as i32]);
        assert!(socket_holders(&[tmp.path().join("none")]).is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
