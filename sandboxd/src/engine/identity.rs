//! Host identities for guests: when sandboxd runs as root, every guest (a process-engine
//! sandbox's bwrap tree, or a VM's QEMU) runs under its own unprivileged uid/gid taken
//! from a configured range, so it owns nothing on the host and two guests cannot touch
//! each other's files or processes even if a mount or a process leaks. As any other user,
//! sandboxd cannot switch identities and every guest runs as sandboxd's own user.
//!
//! Uids are handed out round-robin, so a released uid is reused as late as possible.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// A range of host uids (each with the same number as its gid) to run guests under.
pub struct Identities {
    base: u32,
    count: u32,
    state: Mutex<State>,
    switching: bool,
}

struct State {
    used: BTreeSet<u32>,
    next: u32,
}

/// One guest's identity; its uid returns to the range when this is dropped.
pub struct Identity {
    uid: u32,
    gid: u32,
    from: Option<Arc<Identities>>,
}

impl Identities {
    /// The range `base .. base + count`; used only when sandboxd runs as root.
    pub fn new(base: u32, count: u32) -> Arc<Identities> {
        Arc::new(Identities {
            base,
            count,
            state: Mutex::new(State {
                used: BTreeSet::new(),
                next: 0,
            }),
            switching: nix::unistd::geteuid().is_root(),
        })
    }

    /// True when guests get identities of their own (sandboxd runs as root).
    pub fn switching(&self) -> bool {
        self.switching
    }

    /// A free identity from the range, or sandboxd's own when it cannot switch.
    pub fn take(self: &Arc<Self>) -> Result<Identity> {
        if !self.switching {
            return Ok(Identity {
                uid: nix::unistd::geteuid().as_raw(),
                gid: nix::unistd::getegid().as_raw(),
                from: None,
            });
        }
        let mut state = self.state.lock().expect("identities lock");
        for i in 0..self.count {
            let offset = (state.next + i) % self.count;
            let uid = self.base + offset;
            if state.used.insert(uid) {
                state.next = (offset + 1) % self.count;
                return Ok(Identity {
                    uid,
                    gid: uid,
                    from: Some(self.clone()),
                });
            }
        }
        Err(Error::Busy {
            reason: format!(
                "all {} guest uids from {} are in use",
                self.count, self.base
            ),
            retry_after: 1,
        })
    }

    /// Re-reserves the uid a re-adopted guest runs under; an error when it is outside the
    /// range or taken (the record is then not trusted).
    pub fn reserve(self: &Arc<Self>, uid: u32) -> Result<Identity> {
        if !self.switching || !(self.base..self.base + self.count).contains(&uid) {
            return Err(Error::Engine(format!(
                "uid {uid} is not one of the {} guest uids from {}",
                self.count, self.base
            )));
        }
        if !self.state.lock().expect("identities lock").used.insert(uid) {
            return Err(Error::Engine(format!(
                "uid {uid} is in use by another guest"
            )));
        }
        Ok(Identity {
            uid,
            gid: uid,
            from: Some(self.clone()),
        })
    }
}

impl Identity {
    /// The host uid the guest runs as.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The host gid the guest runs as.
    pub fn gid(&self) -> u32 {
        self.gid
    }
}

impl Drop for Identity {
    fn drop(&mut self) {
        if let Some(from) = &self.from {
            from.state
                .lock()
                .expect("identities lock")
                .used
                .remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(count: u32) -> Arc<Identities> {
        Arc::new(Identities {
            base: 1_000_000,
            count,
            state: Mutex::new(State {
                used: BTreeSet::new(),
                next: 0,
            }),
            switching: true,
        })
    }

    #[test]
    fn unique_round_robin_and_released_on_drop() {
        let ids = range(3);
        let a = ids.take().unwrap();
        let b = ids.take().unwrap();
        assert_ne!(a.uid(), b.uid());
        assert_eq!(a.uid(), a.gid());
        let c = ids.take().unwrap();
        assert!(matches!(ids.take(), Err(Error::Busy { .. })));
        let freed = b.uid();
        drop(b);
        // The freed uid is the only one left, so it comes back.
        assert_eq!(ids.take().unwrap().uid(), freed);
        drop((a, c));
        // Round robin: after the last given (freed), the next in line.
        let d = ids.take().unwrap();
        assert_ne!(d.uid(), freed);
        // A re-adopted guest's uid is held again; twice, or outside the range, is refused.
        drop(d);
        let kept = ids.reserve(1_000_001).unwrap();
        assert!(ids.reserve(1_000_001).is_err());
        assert!(ids.reserve(999).is_err());
        assert!((0..2).all(|_| ids.take().map(|i| i.uid() != kept.uid()).unwrap_or(true)));
    }
}
