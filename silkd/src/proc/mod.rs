//! The process table: every command silkd started, live or recently exited.
//!
//! One table, one reaper. The table lock is held across spawn-and-insert and across
//! reap-and-mark, so the reaper never reaps a pid the table has not heard of, and `Kill`
//! checks liveness and signals under the same lock: an exited entry answers `Done`
//! without signalling, so a recycled pid is never hit.

pub mod reaper;
pub mod spawn;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;
use wire::{ProcInfo, ProcState};

use crate::{Error, Result};

/// How long an exited command stays in the table, so a late `Kill` answers `Done`.
pub const KEEP_EXITED: Duration = Duration::from_secs(5 * 60);

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
    argv: Vec<String>,
    exited: Option<(ExitStatus, Instant)>,
    status_tx: watch::Sender<Option<ExitStatus>>,
}

/// Every command silkd started, keyed by pid (= process group id).
#[derive(Default)]
pub struct ProcessTable {
    entries: Mutex<HashMap<u32, Entry>>,
}

impl ProcessTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Spawns `cmd` under the table lock and records it. The returned receiver sees the
    /// exit status once the reaper collects it.
    pub fn spawn(
        &self,
        spec: &spawn::Spec,
    ) -> Result<(spawn::Spawned, watch::Receiver<Option<ExitStatus>>)> {
        let mut entries = self.lock();
        gc(&mut entries);
        let spawned = spawn::spawn(spec)?;
        let (status_tx, status_rx) = watch::channel(None);
        entries.insert(
            spawned.pid,
            Entry {
                argv: spec.argv.clone(),
                exited: None,
                status_tx,
            },
        );
        Ok((spawned, status_rx))
    }

    /// Signals the whole process group of `pid` if it still runs.
    pub fn kill(&self, pid: u32, signal: Signal) -> Result<KillOutcome> {
        let entries = self.lock();
        match entries.get(&pid) {
            None => Ok(KillOutcome::NotFound),
            Some(e) if e.exited.is_some() => Ok(KillOutcome::Done),
            Some(_) => match killpg(Pid::from_raw(pid as i32), signal) {
                // The leader is running or a zombie not yet reaped: the group id is ours.
                Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(KillOutcome::Done),
                Err(e) => Err(Error::io(
                    format!("killpg({pid}, {signal})"),
                    std::io::Error::from(e),
                )),
            },
        }
    }

    /// SIGKILLs every running group (shutdown).
    pub fn kill_all(&self) {
        let entries = self.lock();
        for (pid, e) in entries.iter() {
            if e.exited.is_none() {
                let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
            }
        }
    }

    /// Live and recently exited commands, by pid.
    pub fn list(&self) -> Vec<ProcInfo> {
        let mut entries = self.lock();
        gc(&mut entries);
        let mut out: Vec<ProcInfo> = entries
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
                }
            })
            .collect();
        out.sort_by_key(|p| p.pid);
        out
    }

    /// Number of commands still running.
    pub fn running(&self) -> u32 {
        self.lock().values().filter(|e| e.exited.is_none()).count() as u32
    }

    /// Records an exit the reaper collected; unknown pids (orphans) are ignored.
    fn mark_exited(entries: &mut HashMap<u32, Entry>, pid: u32, status: ExitStatus) {
        if let Some(e) = entries.get_mut(&pid) {
            e.exited = Some((status, Instant::now()));
            e.status_tx.send_replace(Some(status));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Entry>> {
        // A panic while holding the lock leaves consistent data (single inserts/updates).
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn gc(entries: &mut HashMap<u32, Entry>) {
    entries.retain(|_, e| match e.exited {
        Some((_, at)) => at.elapsed() < KEEP_EXITED,
        None => true,
    });
}
