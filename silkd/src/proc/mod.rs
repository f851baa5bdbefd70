//! The process table: every command silkd started, live or recently exited.
//!
//! One table, one reaper. The table lock is held across spawn-and-insert and across
//! reap-and-mark, so the reaper never reaps a pid the table has not heard of, and `Kill`
//! checks liveness and signals under the same lock: an exited entry answers `Done`
//! without signalling a pid, so a recycled pid is never hit.
//!
//! The table is bounded: at most `max` entries, running and exited together. A spawn
//! into a full table forgets the oldest exited entry; when every entry runs, it is
//! refused (`resource_exhausted`). What it remembers of an argv is bounded too
//! ([`PS_ARGS`], [`PS_ARG_BYTES`]), so a `Procs` answer always fits the wire caps.

pub mod cgroup;
pub mod pty;
pub mod reaper;
pub mod spawn;
pub mod user;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::detach::{Detached, MAX_DETACHED};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;
use wire::{ProcInfo, ProcState};

use crate::{Error, Result};

/// How long an exited command stays in the table, so a late `Kill` answers `Done`.
pub const KEEP_EXITED: Duration = Duration::from_secs(5 * 60);
/// Default `--max-procs`.
pub const DEFAULT_MAX_PROCS: u32 = 1024;
/// Largest `--max-procs`: a `Procs` answer listing that many entries of [`PS_ARGS`]
/// arguments of [`PS_ARG_BYTES`] stays under both wire caps (values and bytes).
pub const MAX_MAX_PROCS: u32 = 2048;
/// Arguments of an argv the table keeps (and `Procs` lists).
pub const PS_ARGS: usize = 16;
/// Bytes of each argument the table keeps (cut at a character boundary).
pub const PS_ARG_BYTES: usize = 128;

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exited with this code.
    Code(i32),
    /// Ended by this signal.
    Signal(i32),
}

/// What `Kill` did.
#[derive(Debug, PartialEq, Eq)]
pub enum KillOutcome {
    /// The group was signalled, or had already exited (nothing signalled).
    Done,
    /// No such pid in the table.
    NotFound,
}

struct Entry {
    /// What [`summary`] kept of the argv.
    argv: Vec<String>,
    /// When it started (guest clock), for `Procs`.
    started: SystemTime,
    /// Started with `detach: true` (set under the lock at spawn, so the count of
    /// detached entries cannot overshoot).
    detach: bool,
    /// Its ring, stdin and terminal, once `conn` has set them up.
    detached: Option<Arc<Detached>>,
    exited: Option<(ExitStatus, Instant)>,
    status_tx: watch::Sender<Option<ExitStatus>>,
    /// The command's own cgroup, until it is removed.
    cgroup: Option<PathBuf>,
}

/// What the lock guards.
#[derive(Default)]
struct Inner {
    entries: HashMap<u32, Entry>,
    /// Cgroups of forgotten entries that something the command left running still holds;
    /// removed once empty. Each holds at least one live process, so the guest's own
    /// process limit bounds this list.
    leftovers: Vec<PathBuf>,
}

/// Every command silkd started, keyed by pid (= process group id).
pub struct ProcessTable {
    inner: Mutex<Inner>,
    max: usize,
    /// Output kept per detached command (`--detach-ring`).
    ring_bytes: u64,
    cgroups: Option<cgroup::ExecCgroups>,
}

impl Default for ProcessTable {
    fn default() -> Self {
        ProcessTable::new(DEFAULT_MAX_PROCS, None)
    }
}

impl ProcessTable {
    /// An empty table of at most `max` entries (clamped to 1..=[`MAX_MAX_PROCS`]); each
    /// command gets its own cgroup under `cgroups` when given, else only its process
    /// group.
    pub fn new(max: u32, cgroups: Option<cgroup::ExecCgroups>) -> Self {
        ProcessTable {
            inner: Mutex::default(),
            max: max.clamp(1, MAX_MAX_PROCS) as usize,
            ring_bytes: crate::detach::DEFAULT_RING_BYTES,
            cgroups,
        }
    }

    /// Keeps `bytes` of output per detached command (clamped to 1..=`MAX_RING_BYTES`).
    pub fn with_ring_bytes(mut self, bytes: u64) -> Self {
        self.ring_bytes = bytes.clamp(1, crate::detach::MAX_RING_BYTES);
        self
    }

    /// Output kept per detached command.
    pub fn ring_bytes(&self) -> u64 {
        self.ring_bytes
    }

    /// Records the ring and handles of a command spawned with `detach`.
    pub fn set_detached(&self, pid: u32, det: Arc<Detached>) {
        if let Some(e) = self.lock().entries.get_mut(&pid) {
            e.detached = Some(det);
        }
    }

    /// The detached command `pid`, to attach to: `not_found` for an unknown pid,
    /// `bad_request` for one not started with `detach`.
    pub fn attachable(&self, pid: u32) -> Result<Arc<Detached>> {
        let inner = self.lock();
        match inner.entries.get(&pid) {
            None => Err(Error::NotFound(format!("no command with pid {pid}"))),
            Some(Entry {
                detached: Some(d), ..
            }) => Ok(Arc::clone(d)),
            Some(_) => Err(Error::BadRequest(format!(
                "pid {pid} was not started with detach: true; only detached commands can be attached"
            ))),
        }
    }

    /// Whether commands get their own cgroup.
    pub fn has_cgroups(&self) -> bool {
        self.cgroups.is_some()
    }

    /// Spawns `cmd` under the table lock and records it. The returned receiver sees the
    /// exit status once the reaper collects it.
    pub fn spawn(
        &self,
        spec: &spawn::Spec,
        detach: bool,
    ) -> Result<(spawn::Spawned, watch::Receiver<Option<ExitStatus>>)> {
        let launch = spawn::prepare(spec)?;
        spawn::check(spec, &launch)?;
        let mut inner = self.lock();
        gc(&mut inner);
        if detach {
            self.make_room_detached(&mut inner)?;
        }
        self.make_room(&mut inner)?;
        let cgroup = self.cgroups.as_ref().map(|c| c.create()).transpose()?;
        let spawned = match spawn::spawn(spec, &launch, cgroup.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                if let Some(cg) = &cgroup {
                    cgroup::ExecCgroups::remove(&cg.path);
                }
                return Err(e);
            }
        };
        let (status_tx, status_rx) = watch::channel(None);
        inner.entries.insert(
            spawned.pid,
            Entry {
                argv: summary(&spec.argv),
                started: SystemTime::now(),
                detach,
                detached: None,
                exited: None,
                status_tx,
                cgroup: cgroup.map(|c| c.path),
            },
        );
        Ok((spawned, status_rx))
    }

    /// Refuses a detached spawn when [`MAX_DETACHED`] detached commands run; else forgets
    /// the oldest exited detached entries (and their rings) until one more fits.
    fn make_room_detached(&self, inner: &mut Inner) -> Result<()> {
        loop {
            let detached = || inner.entries.iter().filter(|(_, e)| e.detach);
            if detached().count() < MAX_DETACHED {
                return Ok(());
            }
            let oldest = detached()
                .filter_map(|(pid, e)| e.exited.map(|(_, at)| (at, *pid)))
                .min()
                .map(|(_, pid)| pid);
            match oldest {
                Some(pid) => forget(inner, pid),
                None => {
                    return Err(Error::Full(format!(
                        "{MAX_DETACHED} detached commands are running, the most silkd keeps"
                    )))
                }
            }
        }
    }

    /// Refuses a spawn when every entry runs; else forgets the oldest exited entries
    /// until one more fits.
    fn make_room(&self, inner: &mut Inner) -> Result<()> {
        let running = inner
            .entries
            .values()
            .filter(|e| e.exited.is_none())
            .count();
        if running >= self.max {
            return Err(Error::Full(format!(
                "{running} commands are running, the most this silkd runs at once (--max-procs {})",
                self.max
            )));
        }
        while inner.entries.len() >= self.max {
            let oldest = inner
                .entries
                .iter()
                .filter_map(|(pid, e)| e.exited.map(|(_, at)| (at, *pid)))
                .min()
                .map(|(_, pid)| pid)
                .expect("fewer running than max, so one is exited");
            forget(inner, oldest);
        }
        Ok(())
    }

    /// Signals `pid`'s command. SIGKILL goes to its whole cgroup when it has one (every
    /// process it started, `setsid` or not, even after its leader exited: no pid is named,
    /// so none can be a recycled one), and to its process group while the leader runs.
    /// Other signals go to the process group of a running leader only.
    pub fn kill(&self, pid: u32, signal: Signal) -> Result<KillOutcome> {
        let inner = self.lock();
        let Some(e) = inner.entries.get(&pid) else {
            return Ok(KillOutcome::NotFound);
        };
        if signal == Signal::SIGKILL {
            if let (Some(cgroups), Some(path)) = (&self.cgroups, &e.cgroup) {
                cgroups.kill(path)?;
            }
        }
        if e.exited.is_some() {
            return Ok(KillOutcome::Done);
        }
        match killpg(Pid::from_raw(pid as i32), signal) {
            // The leader is running or a zombie not yet reaped: the group id is ours.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(KillOutcome::Done),
            Err(e) => Err(Error::io(
                format!("killpg({pid}, {signal})"),
                std::io::Error::from(e),
            )),
        }
    }

    /// SIGKILLs every running group and every command's cgroup (shutdown).
    pub fn kill_all(&self) {
        let inner = self.lock();
        for (pid, e) in inner.entries.iter() {
            if let (Some(cgroups), Some(path)) = (&self.cgroups, &e.cgroup) {
                let _ = cgroups.kill(path);
            }
            if e.exited.is_none() {
                let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
            }
        }
        if let Some(cgroups) = &self.cgroups {
            for path in &inner.leftovers {
                let _ = cgroups.kill(path);
            }
        }
    }

    /// Live and recently exited commands, by pid.
    pub fn list(&self) -> Vec<ProcInfo> {
        let mut inner = self.lock();
        gc(&mut inner);
        let mut out: Vec<ProcInfo> = inner
            .entries
            .iter()
            .map(|(pid, e)| {
                let (state, code, signal) = match e.exited {
                    None => (ProcState::Running, None, None),
                    Some((ExitStatus::Code(c), _)) => (ProcState::Exited, Some(c), None),
                    Some((ExitStatus::Signal(s), _)) => (ProcState::Exited, None, Some(s)),
                };
                ProcInfo {
                    pid: *pid,
                    argv: e.argv.clone(),
                    state,
                    code,
                    signal,
                    started_ms: e
                        .started
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .ok()
                        .map(|d| d.as_millis() as u64),
                    detached: e.detach,
                    dropped: e.detached.as_ref().map(|d| d.dropped()),
                }
            })
            .collect();
        out.sort_by_key(|p| p.pid);
        out
    }

    /// Number of commands still running.
    pub fn running(&self) -> u32 {
        self.lock()
            .entries
            .values()
            .filter(|e| e.exited.is_none())
            .count() as u32
    }

    /// Records an exit the reaper collected; unknown pids (orphans) are ignored. The
    /// command's cgroup goes now if nothing else of it runs.
    fn mark_exited(inner: &mut Inner, pid: u32, status: ExitStatus) {
        if let Some(e) = inner.entries.get_mut(&pid) {
            e.exited = Some((status, Instant::now()));
            e.status_tx.send_replace(Some(status));
            if e.cgroup.as_deref().is_some_and(cgroup::ExecCgroups::remove) {
                e.cgroup = None;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (single inserts/updates).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the table keeps of an argv: the first [`PS_ARGS`] arguments, each cut to
/// [`PS_ARG_BYTES`] at a character boundary.
pub fn summary(argv: &[String]) -> Vec<String> {
    argv.iter()
        .take(PS_ARGS)
        .map(|a| {
            let mut end = a.len().min(PS_ARG_BYTES);
            while !a.is_char_boundary(end) {
                end -= 1;
            }
            a[..end].to_string()
        })
        .collect()
}

/// Forgets expired exited entries, and removes the cgroups that have emptied since.
fn gc(inner: &mut Inner) {
    let expired: Vec<u32> = inner
        .entries
        .iter()
        .filter(|(_, e)| e.exited.is_some_and(|(_, at)| at.elapsed() >= KEEP_EXITED))
        .map(|(pid, _)| *pid)
        .collect();
    for pid in expired {
        forget(inner, pid);
    }
    for e in inner.entries.values_mut() {
        if e.exited.is_some() && e.cgroup.as_deref().is_some_and(cgroup::ExecCgroups::remove) {
            e.cgroup = None;
        }
    }
    inner.leftovers.retain(|p| !cgroup::ExecCgroups::remove(p));
}

/// Drops an exited entry; a cgroup it still holds waits in `leftovers`.
fn forget(inner: &mut Inner, pid: u32) {
    if let Some(e) = inner.entries.remove(&pid) {
        if let Some(path) = e.cgroup {
            if !cgroup::ExecCgroups::remove(&path) {
                inner.leftovers.push(path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::{ProcState, Response};

    #[test]
    fn the_largest_procs_answer_fits_the_wire_caps() {
        let long: Vec<String> = (0..PS_ARGS + 4).map(|_| "é".repeat(PS_ARG_BYTES)).collect();
        let row = ProcInfo {
            pid: u32::MAX,
            argv: summary(&long),
            state: ProcState::Exited,
            code: Some(i32::MIN),
            signal: None,
            started_ms: Some(u64::MAX),
            detached: false,
            dropped: None,
        };
        assert_eq!(row.argv.len(), PS_ARGS);
        assert!(row.argv.iter().all(|a| a.len() <= PS_ARG_BYTES));
        let mut procs = vec![row; MAX_MAX_PROCS as usize];
        for p in procs.iter_mut().take(MAX_DETACHED) {
            p.detached = true;
            p.dropped = Some(u64::MAX);
        }
        let frame = wire::encode_frame(Response::Procs { procs }).expect("within the byte cap");
        wire::shape::check(&frame[4..]).expect("within the shape caps");
    }

    #[test]
    fn summaries_cut_at_character_boundaries() {
        let cut = summary(&["ab".repeat(100), "€".repeat(100)]);
        assert_eq!(cut[0].len(), PS_ARG_BYTES);
        assert_eq!(cut[1], "€".repeat(PS_ARG_BYTES / 3));
    }
}
