//! Snapshots of live sandboxes and forks of them: the node-level rules (who owns one,
//! its TTL, the per-tenant quota of count and bytes, disk headroom checked before
//! writing, a failed snapshot leaving nothing behind) around the engine's
//! [`Engine::snapshot`](crate::engine::Engine::snapshot) and
//! [`Engine::restore`](crate::engine::Engine::restore). Files live in
//! `data_dir/snapshots/ID`; rows in the state database (`store.rs`), so both survive a
//! restart. A snapshot belongs to its sandbox's tenant: any other caller gets 404.

pub mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rand::RngCore;

use self::store::SnapshotRecord;
use crate::claims::{now_ms, Sandbox};
use crate::error::{Error, Result};
use crate::node::{Claimed, Node};
use crate::pool::PoolKey;

/// Creates `dir` (and its parent) readable by sandboxd only.
pub(crate) fn private_dir_at(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(Error::io(format!("creating {}", parent.display())))?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(Error::io(format!("creating {}", dir.display())))
}

/// `snap-` and 24 hex digits: the only ids ever looked up (anything else is 404, and
/// never reaches a path).
fn valid_id(id: &str) -> bool {
    id.strip_prefix("snap-")
        .is_some_and(|h| h.len() == 24 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn check_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::BadRequest(
            "name must be 1-64 characters of A-Z a-z 0-9 . _ -".into(),
        ))
    }
}

/// Bytes a directory's files take on disk (allocated blocks: memory files are sparse).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

impl Node {
    /// A snapshot's directory; `id` has [`valid_id`]'s shape (checked by every caller:
    /// ids from requests and from the database alike are data, never paths).
    fn snapshot_dir(&self, id: &str) -> PathBuf {
        debug_assert!(valid_id(id), "{id}");
        self.config.data_dir.join("snapshots").join(id)
    }

    /// Snapshots a live sandbox (woken first if it is hibernated); it runs on.
    pub async fn snapshot(
        &self,
        sandbox: &Arc<Sandbox>,
        req: api::snapshots::SnapshotRequest,
    ) -> Result<api::snapshots::SnapshotResponse> {
        if let Some(name) = &req.name {
            check_name(name)?;
        }
        let cfg = &self.config.snapshots;
        let ttl = req.ttl_seconds.unwrap_or(cfg.default_ttl_seconds);
        if ttl == 0 {
            return Err(Error::BadRequest("ttl_seconds must be positive".into()));
        }
        let ttl = ttl.min(cfg.max_ttl_seconds);
        self.wake(sandbox).await?;
        if let Some(e) = sandbox.failed_error() {
            return Err(e);
        }
        let key = PoolKey {
            template: sandbox.template.clone(),
            size: sandbox.size.clone(),
        };
        let spec = self.pools.spec(&key)?;
        let inputs = self.engine.golden_inputs(&spec)?;
        // One snapshot at a time per node: the quota check and the write are one step.
        let _writing = self.snapshot_lock.lock().await;
        // At most its memory (a VM, whose writable layer is inside it) or its writable
        // layer (a process sandbox): both, to be safe for either engine.
        let expected = (spec.size_config.memory_mib + spec.size_config.disk_mib) << 20;
        self.check_quota(sandbox.tenant.as_deref(), expected)?;
        // The stream and the memory file exist together for a moment.
        self.check_disk(expected * 2)?;
        let _power = sandbox.power.lock().await;
        if sandbox.is_hibernated() {
            return Err(Error::Conflict(format!(
                "sandbox {} was hibernated meanwhile; wake it and retry",
                sandbox.id
            )));
        }
        let mut raw = [0u8; 12];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let id = format!("snap-{}", hex::encode(raw));
        let dir = self.snapshot_dir(&id);
        private_dir_at(&dir)?;
        let started = Instant::now();
        let written = async {
            let guest = sandbox.guest();
            let captured = self.engine.snapshot(&spec, &*guest, &dir, true).await?;
            let now = now_ms();
            let rec = SnapshotRecord {
                id: id.clone(),
                tenant: sandbox.tenant.clone(),
                name: req.name.clone(),
                source: sandbox.id.clone(),
                template: key.template.clone(),
                size: key.size.clone(),
                inputs,
                memory: captured.memory,
                bytes: disk_bytes(&dir),
                created_ms: now,
                expires_ms: now + ttl * 1000,
            };
            self.store.put_snapshot(&rec)?;
            Ok::<_, Error>(captured)
        }
        .await;
        match written {
            Ok(captured) => {
                tracing::info!(id, sandbox = %sandbox.id, elapsed = ?started.elapsed(), "snapshot taken");
                Ok(api::snapshots::SnapshotResponse {
                    snapshot_id: id,
                    memory: captured.memory,
                })
            }
            Err(e) => {
                // Nothing of a failed snapshot stays: no row (the insert is last), no file.
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// 429 when `tenant` already holds `[snapshots] max_per_tenant` snapshots, or
    /// `adding` more bytes would pass `max_bytes_per_tenant`.
    fn check_quota(&self, tenant: Option<&str>, adding: u64) -> Result<()> {
        let cfg = &self.config.snapshots;
        let who = tenant.map_or("root".to_string(), |t| format!("tenant {t:?}"));
        let mine: Vec<_> = self
            .store
            .snapshots()?
            .into_iter()
            .filter(|s| s.tenant.as_deref() == tenant)
            .collect();
        if mine.len() as u64 >= cfg.max_per_tenant as u64 {
            return Err(Error::Quota(format!(
                "{who} holds {} snapshots, the most allowed ([snapshots] max_per_tenant = {}); \
                 delete one first",
                mine.len(),
                cfg.max_per_tenant
            )));
        }
        let used: u64 = mine.iter().map(|s| s.bytes).sum();
        if used.saturating_add(adding) > cfg.max_bytes_per_tenant {
            return Err(Error::Quota(format!(
                "{who}'s snapshots take {} MiB and this one needs up to {} MiB more, past \
                 [snapshots] max_bytes_per_tenant ({} MiB); delete one first",
                used >> 20,
                adding >> 20,
                cfg.max_bytes_per_tenant >> 20
            )));
        }
        Ok(())
    }

    /// The snapshot `id` if `tenant` may see it (root sees all), else 404.
    fn owned_snapshot(&self, tenant: Option<&str>, id: &str) -> Result<SnapshotRecord> {
        if !valid_id(id) {
            return Err(Error::NotFound);
        }
        let rec = self.store.snapshot(id)?.ok_or(Error::NotFound)?;
        if tenant.is_some() && rec.tenant.as_deref() != tenant || rec.expires_ms <= now_ms() {
            return Err(Error::NotFound);
        }
        Ok(rec)
    }

    /// `POST /v1/claim {"snapshot": ID}`: a new sandbox restored from the snapshot.
    pub(crate) async fn fork(
        &self,
        tenant: Option<&str>,
        id: &str,
        req: api::ClaimRequest,
        started: Instant,
    ) -> Result<Claimed> {
        let rec = self.owned_snapshot(tenant, id)?;
        for (asked, theirs, what) in [
            (&req.template, &rec.template, "template"),
            (&req.size, &rec.size, "size"),
        ] {
            if asked.as_ref().is_some_and(|a| a != theirs) {
                return Err(Error::BadRequest(format!(
                    "snapshot {id} is of {what} {theirs:?}; leave {what} out or name that one"
                )));
            }
        }
        let key = PoolKey {
            template: rec.template.clone(),
            size: rec.size.clone(),
        };
        let spec = self.pools.spec(&key)?;
        if self.engine.golden_inputs(&spec)? != rec.inputs {
            return Err(Error::Conflict(format!(
                "snapshot {id} was taken with another image or engine setting of template \
                 {:?} than the node runs now; it cannot be restored",
                rec.template
            )));
        }
        let ttl = self.claim_ttl(req.ttl_seconds)?;
        let slot = self.claims.reserve(tenant)?;
        let guest = self
            .engine
            .restore(&spec, &self.snapshot_dir(id), None)
            .await?;
        self.register(slot, key, ttl, guest, "snapshot", started)
            .await
    }

    /// `GET /v1/snapshots`: the caller's (root: all) unexpired snapshots.
    pub fn list_snapshots(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<api::snapshots::SnapshotInfo>> {
        let now = now_ms();
        Ok(self
            .store
            .snapshots()?
            .into_iter()
            .filter(|s| s.expires_ms > now && (tenant.is_none() || s.tenant.as_deref() == tenant))
            .map(|s| s.info())
            .collect())
    }

    /// `DELETE /v1/snapshots/{id}`: its row, then its files (forks running from it keep
    /// their mapping of the memory file until they end).
    pub fn delete_snapshot(&self, tenant: Option<&str>, id: &str) -> Result<()> {
        let rec = self.owned_snapshot(tenant, id)?;
        self.store.delete_snapshot(&rec.id)?;
        let _ = std::fs::remove_dir_all(self.snapshot_dir(&rec.id));
        tracing::info!(id, "snapshot deleted");
        Ok(())
    }

    /// Deletes expired snapshots, and files no row owns (a crash mid-snapshot).
    pub(crate) fn expire_snapshots(&self) {
        let now = now_ms();
        let Ok(all) = self.store.snapshots() else {
            return;
        };
        for s in all.iter().filter(|s| s.expires_ms <= now) {
            tracing::info!(id = %s.id, "snapshot expired; deleting it");
            if self.store.delete_snapshot(&s.id).is_ok() && valid_id(&s.id) {
                let _ = std::fs::remove_dir_all(self.snapshot_dir(&s.id));
            }
        }
    }

    /// At start: deletes every snapshot directory without a row and every hibernation
    /// directory without a hibernated claim (what a crash mid-write leaves).
    pub(crate) fn sweep_orphan_files(&self) {
        let Ok(all) = self.store.snapshots() else {
            return;
        };
        let owned = |dir: &str, name: &str| match dir {
            "snapshots" => all.iter().any(|s| s.id == name),
            _ => self.claims.get(name).is_some_and(|s| s.is_hibernated()),
        };
        for dir in ["snapshots", "hibernated"] {
            let Ok(entries) = std::fs::read_dir(self.config.data_dir.join(dir)) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !owned(dir, &name) {
                    tracing::info!(name, "deleting {dir} files no record owns");
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_are_checked_before_any_path_is_made() {
        assert!(valid_id("snap-0123456789abcdef01234567"));
        for hostile in [
            "",
            "snap-",
            "../snapshots",
            "snap-0123456789abcdef0123456/",
            "snap-../../../../etc/passwd00",
            "snap-0123456789abcdef0123456g",
            "sb-0123456789abcdef",
        ] {
            assert!(!valid_id(hostile), "{hostile:?}");
        }
        check_name("before-refactor_2.1").unwrap();
        for bad in ["", "a/b", "..", "x y", &"n".repeat(65), "é"] {
            if bad == ".." {
                // Dots are allowed; a name is a label, never a path.
                check_name(bad).unwrap();
                continue;
            }
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
