//! The one reaper: on SIGCHLD, `waitpid(-1, WNOHANG)` until nothing is left to collect.
//!
//! It reaps every child, ours and orphans alike (silkd is PID 1 in a VM and a
//! subreaper elsewhere), so no zombie is left behind.

use std::sync::Arc;

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};

use super::{ExitStatus, ProcessTable};
use crate::{Error, Result};

/// Makes orphaned grandchildren re-parent to silkd so the reaper collects them.
pub fn become_subreaper() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes a plain integer argument.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::warn!(
            "PR_SET_CHILD_SUBREAPER failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Installs the SIGCHLD handler now (so no exit is missed) and returns the reaping loop.
pub fn run(table: Arc<ProcessTable>) -> Result<impl std::future::Future<Output = ()>> {
    let mut sigchld =
        signal(SignalKind::child()).map_err(|e| Error::io("installing SIGCHLD", e))?;
    Ok(async move {
        loop {
            reap_all(&table);
            if sigchld.recv().await.is_none() {
                return;
            }
        }
    })
}

/// Collects every exited child, under the table lock.
pub fn reap_all(table: &ProcessTable) {
    let mut inner = table.lock();
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => {
                ProcessTable::mark_exited(&mut inner, pid.as_raw() as u32, ExitStatus::Code(code))
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) => ProcessTable::mark_exited(
                &mut inner,
                pid.as_raw() as u32,
                ExitStatus::Signal(sig as i32),
            ),
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD) => return,
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::error!("waitpid: {e}");
                return;
            }
        }
    }
}
