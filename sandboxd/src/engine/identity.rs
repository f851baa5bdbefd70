//! Host identities for guests: when sandboxd runs as root, every guest (a process-engine
//! sandbox's bwrap tree, or a VM's QEMU) runs under unprivileged uids/gids of its own
//! taken from a configured range, so it owns nothing on the host and two guests cannot
//! touch each other's files or processes even if a mount or a process leaks. As any other
//! user, sandboxd cannot switch identities and every guest runs as sandboxd's own user.
//!
//! The range is cut into blocks of equal length, one per guest: a QEMU needs one uid
//! (blocks of 1); a process-engine sandbox maps a whole block into its user namespace
//! (its uid 0 is the block's first id) so commands can run as root or any user of the
//! template. Blocks are handed out round-robin, so a released one is reused as late as
//! possible.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// A range of host uids (each with the same number as its gid) to run guests under, cut
/// into blocks of `block` ids.
pub struct Identities {
    base: u32,
    /// How many blocks the range holds.
    blocks: u32,
    block: u32,
    /// Indexes of the blocks in use, and the next to try.
    state: Mutex<State>,
    switching: bool,
}

struct State {
    used: BTreeSet<u32>,
    next: u32,
}

/// One guest's identity: the block `uid .. uid + len` (gids the same); it returns to the
/// range when this is dropped.
pub struct Identity {
    uid: u32,
    gid: u32,
    len: u32,
    from: Option<Arc<Identities>>,
}

impl Identities {
    /// The range `base .. base + count`, one uid per guest; used only when sandboxd runs
    /// as root.
    pub fn new(base: u32, count: u32) -> Arc<Identities> {
        Self::blocks(base, count, 1)
    }

    /// The range `base .. base + count` in blocks of `block` ids (a partial block at the
    /// end is never handed out).
    pub fn blocks(base: u32, count: u32, block: u32) -> Arc<Identities> {
        Arc::new(Self::with(
            base,
            count,
            block,
            nix::unistd::geteuid().is_root(),
        ))
    }

    fn with(base: u32, count: u32, block: u32, switching: bool) -> Identities {
        let block = block.max(1);
        Identities {
            base,
            blocks: count / block,
            block,
            state: Mutex::new(State {
                used: BTreeSet::new(),
                next: 0,
            }),
            switching,
        }
    }

    /// True when guests get identities of their own (sandboxd runs as root).
    pub fn switching(&self) -> bool {
        self.switching
    }

    /// A free block from the range, or sandboxd's own identity (one id) when it cannot
    /// switch.
    pub fn take(self: &Arc<Self>) -> Result<Identity> {
        if !self.switching {
            return Ok(Identity {
                uid: nix::unistd::geteuid().as_raw(),
                gid: nix::unistd::getegid().as_raw(),
                len: 1,
                from: None,
            });
        }
        let mut state = self.state.lock().expect("identities lock");
        for i in 0..self.blocks {
            let index = (state.next + i) % self.blocks;
            if state.used.insert(index) {
                state.next = (index + 1) % self.blocks;
                return Ok(self.identity(index));
            }
        }
        Err(Error::Busy {
            reason: format!(
                "all {} guest uid blocks of {} from {} are in use",
                self.blocks, self.block, self.base
            ),
            retry_after: 1,
        })
    }

    /// Re-reserves the block a re-adopted guest runs under (`uid` is its first id); an
    /// error when it is not the start of a block of the range, or is taken (the record is
    /// then not trusted).
    pub fn reserve(self: &Arc<Self>, uid: u32) -> Result<Identity> {
        let offset = uid.checked_sub(self.base);
        let index = match offset {
            Some(o) if self.switching && o % self.block == 0 && o / self.block < self.blocks => {
                o / self.block
            }
            _ => {
                return Err(Error::Engine(format!(
                    "uid {uid} does not start one of the {} guest uid blocks of {} from {}",
                    self.blocks, self.block, self.base
                )))
            }
        };
        if !self
            .state
            .lock()
            .expect("identities lock")
            .used
            .insert(index)
        {
            return Err(Error::Engine(format!(
                "uid {uid} is in use by another guest"
            )));
        }
        Ok(self.identity(index))
    }

    fn identity(self: &Arc<Self>, index: u32) -> Identity {
        let uid = self.base + index * self.block;
        Identity {
            uid,
            gid: uid,
            len: self.block,
            from: Some(self.clone()),
        }
    }
}

impl Identity {
    /// The host uid the guest runs as: the first of its block.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The host gid the guest runs as: the first of its block.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// How many ids the block holds (`uid .. uid + len`, the same for gids).
    pub fn block_len(&self) -> u32 {
        self.len
    }
}

impl Drop for Identity {
    fn drop(&mut self) {
        if let Some(from) = &self.from {
            let index = (self.uid - from.base) / from.block;
            from.state
                .lock()
                .expect("identities lock")
                .used
                .remove(&index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(count: u32, block: u32) -> Arc<Identities> {
        Arc::new(Identities::with(1_000_000, count, block, true))
    }

    #[test]
    fn unique_round_robin_and_released_on_drop() {
        let ids = range(3, 1);
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

    #[test]
    fn blocks_never_overlap_nor_leave_the_range() {
        // 10 ids in blocks of 4: two blocks; the partial third is never given.
        let ids = range(10, 4);
        let a = ids.take().unwrap();
        let b = ids.take().unwrap();
        assert!(matches!(ids.take(), Err(Error::Busy { .. })));
        let (a_ids, b_ids) = (
            a.uid()..a.uid() + a.block_len(),
            b.uid()..b.uid() + b.block_len(),
        );
        assert_eq!((a.block_len(), b.block_len()), (4, 4));
        assert!(a_ids.end <= b_ids.start || b_ids.end <= a_ids.start);
        for r in [a_ids, b_ids] {
            assert!(r.start >= 1_000_000 && r.end <= 1_000_010, "{r:?}");
        }
        let freed = a.uid();
        drop(a);
        assert_eq!(ids.take().unwrap().uid(), freed);
        // Re-adoption holds a block again by its first uid; an id inside a block is no
        // block's start and is refused.
        let b_uid = b.uid();
        drop(b);
        assert!(ids.reserve(b_uid + 1).is_err());
        let again = ids.reserve(b_uid).unwrap();
        assert_eq!((again.uid(), again.block_len()), (b_uid, 4));
        assert!(ids.reserve(b_uid).is_err());
    }
}
