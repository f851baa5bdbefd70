//! Hibernate and wake: a sandbox's guest is snapshotted into `data_dir/hibernated/ID`
//! and destroyed (its host memory freed) while its claim, id and token stay recorded;
//! the next exec, relay, file or port call (or `POST .../wake`) restores it from there,
//! with its own hostname, within `boot_timeout_seconds`. The TTL keeps running meanwhile.
//! [`Dormant`] stands in for the guest of a sandbox that was hibernated when sandboxd
//! started.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::claims::Sandbox;
use crate::engine::{Fate, Guest, GuestStream};
use crate::error::{Error, Result};
use crate::node::Node;
use crate::pool::PoolKey;

/// The hostname a hibernated guest had, kept beside its files.
const HOSTNAME: &str = "hostname";

/// `sb-` and 16 hex digits, the shape `Claims` gives ids: the only names ever joined to
/// `data_dir/hibernated` (a record's id is data, never a path).
pub fn is_sandbox_id(id: &str) -> bool {
    id.strip_prefix("sb-")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Deletes `dir`, the hibernation files of sandbox `id`.
pub(crate) fn remove_hibernation(id: &str, dir: &std::path::Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(id, "cannot delete {}: {e}", dir.display());
    }
}

impl Node {
    fn hibernation_dir(&self, id: &str) -> PathBuf {
        debug_assert!(is_sandbox_id(id), "{id}");
        self.config.data_dir.join("hibernated").join(id)
    }

    /// The directory of a sandbox's hibernation files, when it has one.
    pub(crate) fn hibernation_of(&self, id: &str) -> Option<PathBuf> {
        is_sandbox_id(id)
            .then(|| self.hibernation_dir(id))
            .filter(|d| d.exists())
    }

    /// Deletes a sandbox's hibernation files, if it has any.
    pub(crate) fn drop_hibernation(&self, id: &str) {
        if let Some(dir) = self.hibernation_of(id) {
            remove_hibernation(id, &dir);
        }
    }

    /// Writes the sandbox's guest out and destroys it. Idempotent.
    pub async fn hibernate(&self, sandbox: &Arc<Sandbox>) -> Result<()> {
        let _power = sandbox.power.lock().await;
        if sandbox.is_hibernated() {
            return Ok(());
        }
        if let Some(e) = sandbox.failed_error() {
            return Err(e);
        }
        let spec = self.pools.spec(&PoolKey {
            template: sandbox.template.clone(),
            size: sandbox.size.clone(),
        })?;
        if !is_sandbox_id(&sandbox.id) {
            return Err(Error::Conflict(format!(
                "sandbox {} has an id from before hibernation existed",
                sandbox.id
            )));
        }
        self.check_disk(spec.size_config.memory_mib << 20)?;
        let dir = self.hibernation_dir(&sandbox.id);
        let _ = std::fs::remove_dir_all(&dir);
        crate::snapshots::private_dir_at(&dir)?;
        let guest = sandbox.guest();
        let written = async {
            self.engine.snapshot(&spec, &*guest, &dir, false).await?;
            if let Some(h) = guest.hostname() {
                std::fs::write(dir.join(HOSTNAME), h)
                    .map_err(Error::io(format!("writing {}", dir.display())))?;
            }
            self.store.set_hibernated(&sandbox.id, true, None)
        }
        .await;
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        sandbox.set_power(true, None);
        guest.destroy().await;
        tracing::info!(id = %sandbox.id, "hibernated");
        Ok(())
    }

    /// Restores a hibernated sandbox (nothing to do for an awake one); callers that find
    /// it mid-hibernation wait for that first. Bounded by twice `boot_timeout_seconds`.
    pub async fn wake(&self, sandbox: &Arc<Sandbox>) -> Result<()> {
        if !sandbox.is_hibernated() {
            return Ok(());
        }
        let bound = Duration::from_secs(self.config.boot_timeout_seconds * 2);
        match tokio::time::timeout(bound, self.wake_now(sandbox)).await {
            Err(_) => Err(Error::Busy {
                reason: format!("sandbox {} is still waking", sandbox.id),
                retry_after: 2,
            }),
            // Not restored: to the caller, a guest that cannot be reached (502); the
            // sandbox stays hibernated and the next call tries again.
            Ok(Err(e @ (Error::Guest(_) | Error::Busy { .. } | Error::Store { .. }))) => Err(e),
            Ok(Err(e)) => Err(Error::Guest(format!("waking the sandbox: {e}"))),
            Ok(Ok(())) => Ok(()),
        }
    }

    async fn wake_now(&self, sandbox: &Arc<Sandbox>) -> Result<()> {
        let _power = sandbox.power.lock().await;
        if !sandbox.is_hibernated() {
            return Ok(());
        }
        let spec = self.pools.spec(&PoolKey {
            template: sandbox.template.clone(),
            size: sandbox.size.clone(),
        })?;
        let dir = self.hibernation_dir(&sandbox.id);
        let hostname = std::fs::read_to_string(dir.join(HOSTNAME)).ok();
        let guest = self
            .engine
            .restore(&spec, &dir, hostname.as_deref())
            .await?;
        if let Err(e) = self
            .store
            .set_hibernated(&sandbox.id, false, guest.handle().as_ref())
        {
            guest.destroy().await;
            return Err(e);
        }
        sandbox.set_power(false, Some(guest));
        // The woken guest maps its memory file privately: deleting the name frees the
        // disk once the guest ends, and nothing can map it again.
        self.drop_hibernation(&sandbox.id);
        tracing::info!(id = %sandbox.id, "woken");
        Ok(())
    }

    /// 507 unless `data_dir` keeps `[snapshots] min_free_bytes` after writing `bytes`.
    pub(crate) fn check_disk(&self, bytes: u64) -> Result<()> {
        let dir = &self.config.data_dir;
        let st = nix::sys::statvfs::statvfs(dir)
            .map_err(|e| Error::io(format!("statvfs {}", dir.display()))(e.into()))?;
        let free = st.blocks_available() as u64 * st.fragment_size() as u64;
        let need = bytes.saturating_add(self.config.snapshots.min_free_bytes);
        if free < need {
            return Err(Error::NoSpace(format!(
                "the node's disk has {} MiB free; writing this needs {} MiB plus the {} MiB \
                 kept free ([snapshots] min_free_bytes)",
                free >> 20,
                bytes >> 20,
                self.config.snapshots.min_free_bytes >> 20
            )));
        }
        Ok(())
    }
}

/// The guest of a sandbox found hibernated at start: nothing runs; waking replaces it.
pub struct Dormant {
    id: String,
    fate: Fate,
}

impl Dormant {
    /// The placeholder for sandbox `id`.
    pub fn new(id: &str) -> Dormant {
        Dormant {
            id: format!("hibernated-{id}"),
            fate: Fate::new(),
        }
    }
}

impl Guest for Dormant {
    fn id(&self) -> &str {
        &self.id
    }

    fn dial(&self) -> BoxFuture<'_, Result<GuestStream>> {
        Box::pin(async { Err(Error::Conflict("the sandbox is hibernated".into())) })
    }

    fn destroy(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn fate(&self) -> &Fate {
        &self.fate
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_claim_shaped_ids_name_hibernation_files() {
        assert!(super::is_sandbox_id("sb-0123456789abcdef"));
        for hostile in [
            "",
            "sb-",
            "..",
            "sb-../../../etc/x",
            "sb-0123456789abcdeg",
            "sb-0123456789abcdef/",
        ] {
            assert!(!super::is_sandbox_id(hostile), "{hostile:?}");
        }
    }
}
