//! One claimed sandbox: its identity, owner, deadline and guest, and what the API says
//! about it. Whether it has failed is its guest's [`Fate`](crate::engine::Fate), written by
//! the engine's supervisor; this type only reads it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::engine::Guest;
use crate::error::Error;

/// How long a channel error waits for the guest's supervisor to confirm that the guest
/// died, so the answer says what happened instead of "connection closed".
const CONFIRM_FAILURE: Duration = Duration::from_millis(500);

/// One claimed sandbox.
pub struct Sandbox {
    /// Public id.
    pub id: String,
    /// SHA-256 of its token (the token itself is never kept).
    pub(crate) token_sha256: [u8; 32],
    /// Template name.
    pub template: String,
    /// Size name.
    pub size: String,
    /// Tenant that claimed it.
    pub tenant: Option<String>,
    pub(crate) deadline_ms: AtomicU64,
    /// The running guest (a hibernated sandbox's is the destroyed one, or a dormant
    /// placeholder after a restart).
    guest: RwLock<Arc<dyn Guest>>,
    /// Its guest is written out under `data_dir/hibernated/ID`.
    hibernated: AtomicBool,
    /// Held across hibernate, wake and snapshot: one change of the guest at a time.
    pub(crate) power: tokio::sync::Mutex<()>,
}

impl Sandbox {
    pub(crate) fn new(
        id: String,
        token_sha256: [u8; 32],
        template: String,
        size: String,
        tenant: Option<String>,
        deadline_ms: u64,
        guest: Arc<dyn Guest>,
    ) -> Sandbox {
        Sandbox {
            id,
            token_sha256,
            template,
            size,
            tenant,
            deadline_ms: AtomicU64::new(deadline_ms),
            guest: RwLock::new(guest),
            hibernated: AtomicBool::new(false),
            power: tokio::sync::Mutex::new(()),
        }
    }

    /// The current guest.
    pub fn guest(&self) -> Arc<dyn Guest> {
        self.guest.read().expect("guest lock").clone()
    }

    /// True while its guest is written out.
    pub fn is_hibernated(&self) -> bool {
        self.hibernated.load(Ordering::SeqCst)
    }

    /// Marks it hibernated (its guest destroyed) or awake with `guest`.
    pub(crate) fn set_power(&self, hibernated: bool, guest: Option<Arc<dyn Guest>>) {
        if let Some(g) = guest {
            *self.guest.write().expect("guest lock") = g;
        }
        self.hibernated.store(hibernated, Ordering::SeqCst);
    }

    /// Deadline in Unix seconds.
    pub fn deadline(&self) -> u64 {
        self.deadline_ms.load(Ordering::SeqCst) / 1000
    }

    /// Why the sandbox is unusable: its guest died on its own.
    pub fn failure(&self) -> Option<String> {
        if self.is_hibernated() {
            return None;
        }
        self.guest().failure()
    }

    /// Turns a channel error into the sandbox's failure when the guest turns out to have
    /// died (its supervisor gets 500 ms to say so). Any other error, or a
    /// channel error from a guest that is still alive, is returned as it is.
    pub async fn explain(&self, e: Error) -> Error {
        if !matches!(e, Error::Guest(_) | Error::Wire(_)) {
            return e;
        }
        match self.guest().fate().failure_within(CONFIRM_FAILURE).await {
            Some(f) => self.failed(f),
            None => e,
        }
    }

    /// The error exec and relay answer with once the sandbox has failed.
    pub fn failed_error(&self) -> Option<Error> {
        self.failure().map(|f| self.failed(f))
    }

    fn failed(&self, why: String) -> Error {
        Error::SandboxFailed {
            id: self.id.clone(),
            why,
        }
    }

    /// The list row (never the token).
    pub fn summary(&self) -> api::SandboxSummary {
        let error = self.failure();
        api::SandboxSummary {
            id: self.id.clone(),
            template: self.template.clone(),
            size: self.size.clone(),
            deadline: self.deadline(),
            state: if error.is_some() {
                api::SandboxState::Failed
            } else if self.is_hibernated() {
                api::SandboxState::Hibernated
            } else {
                api::SandboxState::Ready
            },
            tenant: self.tenant.clone(),
            error,
        }
    }
}
