//! Claimed sandboxes: the registry by id and by token digest, node and tenant `max_claims`
//! accounting (a slot is reserved before a guest is taken and freed if the claim fails),
//! deadlines, and the list of expired sandboxes the TTL reaper destroys.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::engine::Guest;
use crate::error::{Error, Result};
pub use crate::sandbox::Sandbox;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Tokens of released sandboxes stay known (answering 404, not 401) for this many releases,
/// so a client releasing twice, or racing the TTL reaper, gets the documented 404.
const RELEASED_TOKENS_KEPT: usize = 65_536;

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Arc<Sandbox>>,
    /// Token digest → id, for live sandboxes and the most recently released ones.
    by_token: HashMap<[u8; 32], String>,
    released: std::collections::VecDeque<[u8; 32]>,
    node_held: u32,
    tenant_held: HashMap<String, u32>,
}

/// The registry.
pub struct Claims {
    inner: Mutex<Inner>,
    max: u32,
    tenant_max: HashMap<String, u32>,
}

/// A reserved claim slot; freed on drop unless [`Claims::insert`] consumed it.
pub struct Slot<'a> {
    claims: &'a Claims,
    tenant: Option<String>,
    armed: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.claims.free(self.tenant.as_deref());
        }
    }
}

impl Claims {
    /// An empty registry with these limits.
    pub fn new(max: u32, tenant_max: HashMap<String, u32>) -> Claims {
        Claims {
            inner: Mutex::new(Inner::default()),
            max,
            tenant_max,
        }
    }

    /// Reserves a slot for `tenant` (root when `None`); 429 at the node or tenant limit.
    pub fn reserve(&self, tenant: Option<&str>) -> Result<Slot<'_>> {
        let mut inner = self.inner.lock().expect("claims lock");
        if inner.node_held >= self.max {
            return Err(Error::TooManyClaims(format!(
                "node max_claims ({}) reached",
                self.max
            )));
        }
        if let Some(t) = tenant {
            let max = self.tenant_max.get(t).copied().unwrap_or(0);
            let held = inner.tenant_held.entry(t.to_string()).or_default();
            if *held >= max {
                return Err(Error::TooManyClaims(format!(
                    "tenant {t:?} max_claims ({max}) reached"
                )));
            }
            *held += 1;
        }
        inner.node_held += 1;
        Ok(Slot {
            claims: self,
            tenant: tenant.map(str::to_string),
            armed: true,
        })
    }

    fn free(&self, tenant: Option<&str>) {
        let mut inner = self.inner.lock().expect("claims lock");
        inner.node_held = inner.node_held.saturating_sub(1);
        if let Some(t) = tenant {
            if let Some(h) = inner.tenant_held.get_mut(t) {
                *h = h.saturating_sub(1);
            }
        }
    }

    /// Registers a sandbox in a reserved slot and returns it with its new token.
    pub fn insert(
        &self,
        mut slot: Slot<'_>,
        template: String,
        size: String,
        deadline_ms: u64,
        guest: Arc<dyn Guest>,
    ) -> (Arc<Sandbox>, String) {
        let mut raw = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let token = hex::encode(raw);
        let mut id_raw = [0u8; 8];
        rand::rngs::OsRng.fill_bytes(&mut id_raw);
        let sandbox = Arc::new(Sandbox::new(
            format!("sb-{}", hex::encode(id_raw)),
            token.clone(),
            template,
            size,
            slot.tenant.take(),
            deadline_ms,
            guest,
        ));
        slot.armed = false;
        let mut inner = self.inner.lock().expect("claims lock");
        inner.by_token.insert(digest(&token), sandbox.id.clone());
        inner.by_id.insert(sandbox.id.clone(), sandbox.clone());
        (sandbox, token)
    }

    /// The sandbox whose token this is. The map is keyed by SHA-256 of the token, and the
    /// final comparison runs in constant time.
    pub fn id_for_token(&self, token: &str) -> Option<String> {
        let inner = self.inner.lock().expect("claims lock");
        let id = inner.by_token.get(&digest(token))?;
        match inner.by_id.get(id) {
            Some(sandbox) => {
                bool::from(sandbox.token.as_bytes().ct_eq(token.as_bytes())).then(|| id.clone())
            }
            // Released: the digest matched, which is all we kept.
            None => Some(id.clone()),
        }
    }

    /// A sandbox by id.
    pub fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.inner
            .lock()
            .expect("claims lock")
            .by_id
            .get(id)
            .cloned()
    }

    /// Unregisters a sandbox and frees its slot; the caller destroys its guest.
    pub fn remove(&self, id: &str) -> Option<Arc<Sandbox>> {
        let sandbox = {
            let mut inner = self.inner.lock().expect("claims lock");
            let sandbox = inner.by_id.remove(id)?;
            inner.released.push_back(digest(&sandbox.token));
            if inner.released.len() > RELEASED_TOKENS_KEPT {
                if let Some(old) = inner.released.pop_front() {
                    inner.by_token.remove(&old);
                }
            }
            sandbox
        };
        self.free(sandbox.tenant.as_deref());
        Some(sandbox)
    }

    /// Moves a deadline to now + `ttl_ms` and returns it in Unix seconds.
    pub fn renew(&self, sandbox: &Sandbox, ttl_ms: u64) -> u64 {
        sandbox
            .deadline_ms
            .store(now_ms() + ttl_ms, Ordering::SeqCst);
        sandbox.deadline()
    }

    /// Every sandbox, or one tenant's.
    pub fn list(&self, tenant: Option<&str>) -> Vec<Arc<Sandbox>> {
        let inner = self.inner.lock().expect("claims lock");
        let mut all: Vec<_> = inner
            .by_id
            .values()
            .filter(|s| tenant.is_none() || s.tenant.as_deref() == tenant)
            .cloned()
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Ids past their deadline at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> Vec<String> {
        let inner = self.inner.lock().expect("claims lock");
        inner
            .by_id
            .values()
            .filter(|s| s.deadline_ms.load(Ordering::SeqCst) <= now_ms)
            .map(|s| s.id.clone())
            .collect()
    }

    /// Claimed sandboxes now.
    pub fn active(&self) -> u32 {
        self.inner.lock().expect("claims lock").by_id.len() as u32
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}
