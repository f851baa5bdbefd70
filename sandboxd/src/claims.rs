//! Claimed sandboxes: the registry by id and by token digest, node and tenant `max_claims`
//! accounting (a slot is reserved before a guest is taken and freed if the claim fails),
//! deadlines, and the expired sandboxes the TTL reaper takes out. Renew and the reaper
//! decide under the one lock, so a renew that answered is never undone by a check made
//! before it.

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
        free_locked(&mut self.inner.lock().expect("claims lock"), tenant);
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
            digest(&token),
            template,
            size,
            slot.tenant.take(),
            deadline_ms,
            guest,
        ));
        slot.armed = false;
        let mut inner = self.inner.lock().expect("claims lock");
        inner
            .by_token
            .insert(sandbox.token_sha256, sandbox.id.clone());
        inner.by_id.insert(sandbox.id.clone(), sandbox.clone());
        (sandbox, token)
    }

    /// Registers a sandbox re-adopted from its record after a restart: same id, same
    /// token (by digest), counted against the node and its tenant like any claim but never
    /// refused (it is running already; the limits may have shrunk since).
    pub fn adopt(&self, rec: &crate::store::ClaimRecord, guest: Arc<dyn Guest>) -> Arc<Sandbox> {
        let sandbox = Arc::new(Sandbox::new(
            rec.id.clone(),
            rec.token_sha256,
            rec.template.clone(),
            rec.size.clone(),
            rec.tenant.clone(),
            rec.deadline_ms,
            guest,
        ));
        let mut inner = self.inner.lock().expect("claims lock");
        inner.node_held += 1;
        if let Some(t) = &rec.tenant {
            *inner.tenant_held.entry(t.clone()).or_default() += 1;
        }
        inner
            .by_token
            .insert(sandbox.token_sha256, sandbox.id.clone());
        inner.by_id.insert(sandbox.id.clone(), sandbox.clone());
        sandbox
    }

    /// The sandbox whose token this is. The map is keyed by SHA-256 of the token (the
    /// token itself is kept nowhere, so it survives restarts by digest alone), and the
    /// final comparison runs in constant time.
    pub fn id_for_token(&self, token: &str) -> Option<String> {
        let inner = self.inner.lock().expect("claims lock");
        let presented = digest(token);
        let id = inner.by_token.get(&presented)?;
        match inner.by_id.get(id) {
            Some(sandbox) => bool::from(sandbox.token_sha256.ct_eq(&presented)).then(|| id.clone()),
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
        remove_locked(&mut self.inner.lock().expect("claims lock"), id)
    }

    /// Moves a deadline to now + `ttl_ms` and returns it in Unix seconds; `None` when the
    /// sandbox is no longer registered (released, or taken by the reaper first).
    pub fn renew(&self, sandbox: &Sandbox, ttl_ms: u64) -> Option<u64> {
        let inner = self.inner.lock().expect("claims lock");
        let ours = inner
            .by_id
            .get(&sandbox.id)
            .is_some_and(|s| std::ptr::eq(Arc::as_ptr(s), sandbox));
        if !ours {
            return None;
        }
        sandbox
            .deadline_ms
            .store(now_ms() + ttl_ms, Ordering::SeqCst);
        Some(sandbox.deadline())
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

    /// Unregisters every sandbox past its deadline at `now_ms` and returns them (the
    /// caller destroys their guests). Deadlines are read and entries removed under the
    /// lock renew takes, so each sandbox is either renewed or taken, never both.
    pub fn take_expired(&self, now_ms: u64) -> Vec<Arc<Sandbox>> {
        let mut inner = self.inner.lock().expect("claims lock");
        let ids: Vec<String> = inner
            .by_id
            .values()
            .filter(|s| s.deadline_ms.load(Ordering::SeqCst) <= now_ms)
            .map(|s| s.id.clone())
            .collect();
        ids.iter()
            .filter_map(|id| remove_locked(&mut inner, id))
            .collect()
    }

    /// Claimed sandboxes now.
    pub fn active(&self) -> u32 {
        self.inner.lock().expect("claims lock").by_id.len() as u32
    }
}

/// SHA-256 of a token: what is kept of it, in memory and in the state database.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn free_locked(inner: &mut Inner, tenant: Option<&str>) {
    inner.node_held = inner.node_held.saturating_sub(1);
    if let Some(t) = tenant {
        if let Some(h) = inner.tenant_held.get_mut(t) {
            *h = h.saturating_sub(1);
        }
    }
}

fn remove_locked(inner: &mut Inner, id: &str) -> Option<Arc<Sandbox>> {
    let sandbox = inner.by_id.remove(id)?;
    inner.released.push_back(sandbox.token_sha256);
    if inner.released.len() > RELEASED_TOKENS_KEPT {
        if let Some(old) = inner.released.pop_front() {
            inner.by_token.remove(&old);
        }
    }
    free_locked(inner, sandbox.tenant.as_deref());
    Some(sandbox)
}

#[cfg(test)]
mod tests {
    use futures::future::BoxFuture;

    use super::*;
    use crate::engine::{Fate, GuestStream};

    /// A guest nothing ever dials; the registry only holds it.
    struct Idle(Fate);

    impl Guest for Idle {
        fn id(&self) -> &str {
            "idle"
        }
        fn dial(&self) -> BoxFuture<'_, Result<GuestStream>> {
            Box::pin(async { Err(Error::Guest("not dialable".into())) })
        }
        fn destroy(&self) -> BoxFuture<'_, ()> {
            Box::pin(async {})
        }
        fn fate(&self) -> &Fate {
            &self.0
        }
    }

    fn claimed(claims: &Claims, deadline_ms: u64) -> Arc<Sandbox> {
        claimed_with_token(claims, deadline_ms).0
    }

    fn claimed_with_token(claims: &Claims, deadline_ms: u64) -> (Arc<Sandbox>, String) {
        let slot = claims.reserve(Some("t")).unwrap();
        let guest = Arc::new(Idle(Fate::new()));
        claims.insert(slot, "tp".into(), "sz".into(), deadline_ms, guest)
    }

    #[test]
    fn a_renew_that_answered_is_never_reaped_by_an_earlier_check() {
        let claims = Claims::new(4, [("t".to_string(), 4)].into());
        let now = now_ms();
        let s = claimed(&claims, now - 1);
        // The renew lands between a reaper's look at the clock and its decision: the
        // decision is made under the lock, on the renewed deadline.
        let checked_at = now_ms();
        assert!(claims.renew(&s, 60_000).is_some());
        assert!(claims.take_expired(checked_at).is_empty());
        assert_eq!(claims.active(), 1);
        // The other order: the reaper takes it first, and the renew then answers None
        // (404), never a deadline for a sandbox about to be destroyed.
        let claims = Claims::new(4, [("t".to_string(), 4)].into());
        let s = claimed(&claims, now - 1);
        let taken = claims.take_expired(now_ms());
        assert_eq!(taken.len(), 1);
        assert!(claims.renew(&s, 60_000).is_none());
        // Its slot is free again, for the node and the tenant.
        assert_eq!(claims.active(), 0);
        let _again: Vec<_> = (0..4).map(|_| claimed(&claims, now + 60_000)).collect();
        assert!(claims.reserve(Some("t")).is_err());
    }

    #[test]
    fn take_expired_takes_only_the_expired() {
        let claims = Claims::new(4, [("t".to_string(), 4)].into());
        let now = now_ms();
        let (old, old_token) = claimed_with_token(&claims, now - 10);
        let _fresh = claimed(&claims, now + 60_000);
        let taken = claims.take_expired(now);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].id, old.id);
        assert!(claims.get(&old.id).is_none());
        // Its token stays known (404, not 401) after it is gone.
        assert_eq!(claims.id_for_token(&old_token), Some(old.id.clone()));
        assert_eq!(claims.active(), 1);
    }
}
