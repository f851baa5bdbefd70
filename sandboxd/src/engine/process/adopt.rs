//! Re-adopting a sandbox an earlier sandboxd started: its record is trusted only as far
//! as it is provably ours (a run dir of our own by its exact path, cgroups of our own by
//! their exact paths, bwrap alive with the recorded start time and inside that cgroup, a
//! uid from our range that no other guest holds). Anything short of that is an error;
//! the caller drops the claim and the sweep then destroys what is left.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::guest::ProcessGuest;
use super::jail::SOCK_NAME;
use super::ProcessEngine;
use crate::engine::handle::PidFd;
use crate::engine::{Fate, GuestHandle};
use crate::error::{Error, Result};

impl ProcessEngine {
    pub(super) fn adopt_guest(&self, h: &GuestHandle) -> Result<Arc<ProcessGuest>> {
        let not_ours = |why: String| Error::Engine(format!("sandbox {}: {why}", h.guest_id));
        if h.engine != "process" {
            return Err(not_ours(format!("recorded by the {} engine", h.engine)));
        }
        let id_ok = !h.guest_id.is_empty() && h.guest_id.bytes().all(|b| b.is_ascii_hexdigit());
        let dir = self.sandboxes_dir.join(&h.guest_id);
        if !id_ok || h.run_dir != dir {
            return Err(not_ours(format!(
                "run dir {} is not one of ours",
                h.run_dir.display()
            )));
        }
        if !dir.is_dir() {
            return Err(not_ours(format!("run dir {} is gone", dir.display())));
        }
        let cgroup = self
            .cgroups
            .reopen(&h.guest_id, &h.cgroups)
            .ok_or_else(|| not_ours(format!("cgroups {:?} are not ours", h.cgroups)))?;
        let bwrap = PidFd::open(h.pid, h.start_time).ok_or_else(|| {
            not_ours(format!(
                "its guest is gone (no process {} started at {})",
                h.pid, h.start_time
            ))
        })?;
        // Where cgroups exist, bwrap must be in the sandbox's own: a pid and start time
        // alone are not proof enough to signal a process.
        if !cgroup.dirs().is_empty() && !cgroup.pids().contains(&h.pid) {
            return Err(not_ours(format!("process {} is not in its cgroup", h.pid)));
        }
        let init = match h.init {
            Some((pid, start)) => Some(
                PidFd::open(pid, start)
                    .ok_or_else(|| not_ours(format!("its namespace init {pid} is gone")))?,
            ),
            None => None,
        };
        let identity = match (&self.identities, h.uid) {
            (Some(ids), Some(uid)) => Some(ids.reserve(uid)?),
            (None, None) => None,
            _ => {
                return Err(not_ours(
                    "its uid does not match this node's identities".into(),
                ))
            }
        };
        let (exited_tx, exited) = watch::channel(false);
        let guest = Arc::new(ProcessGuest {
            id: h.guest_id.clone(),
            socket: dir.join("sock").join(SOCK_NAME),
            dir,
            cgroup: Mutex::new(Some(cgroup)),
            pids: Mutex::new((None, init)),
            handle: Mutex::new(Some(h.clone())),
            kept: AtomicBool::new(false),
            fate: Fate::new(),
            exited,
            supervised: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
            _identity: identity,
        });
        let watch = PidFd::open(h.pid, h.start_time)
            .ok_or_else(|| not_ours("its guest exited while being adopted".into()))?;
        guest.pids.lock().expect("pids lock").0 = Some(bwrap);
        guest.supervise_pidfd(watch, exited_tx);
        Ok(guest)
    }
}
