//! The node's durable state, `data_dir/state.db`: claims (id, token digest — never the
//! token —, tenant, template, size, deadline, engine handle), the pool targets `PUT
//! /v1/pools` set, and a table for snapshots. SQLite in WAL mode with `synchronous =
//! FULL`: a call returns once its transaction is on disk, so whatever a response reports
//! is committed before the response is sent. The schema has a version
//! (`PRAGMA user_version`) and every change to it is a numbered migration below.
//!
//! Why SQLite (rusqlite, bundled) over redb: one file operators can read, check and back
//! up with the stock `sqlite3` CLI (`.backup`), schema migrations in plain SQL, and the
//! library compiled in, so no system version to match.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use crate::engine::GuestHandle;
use crate::error::{Error, Result};

/// The database file under `data_dir`.
pub const FILE: &str = "state.db";

/// Schema migrations, in order; `user_version` counts those applied.
const MIGRATIONS: &[&str] = &[
    // 1: claims, pool targets, snapshots (kept for later; nothing writes it yet).
    "CREATE TABLE claims (
        id TEXT PRIMARY KEY,
        token_sha256 BLOB NOT NULL CHECK (length(token_sha256) = 32),
        tenant TEXT,
        template TEXT NOT NULL,
        size TEXT NOT NULL,
        deadline_ms INTEGER NOT NULL,
        handle TEXT
     );
     CREATE TABLE pool_targets (
        template TEXT NOT NULL,
        size TEXT NOT NULL,
        warm INTEGER NOT NULL,
        warm_max INTEGER NOT NULL,
        PRIMARY KEY (template, size)
     );
     CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
     CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,
        claim_id TEXT,
        template TEXT NOT NULL,
        size TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        path TEXT NOT NULL
     );",
    // 2: what the E2B surface keeps with a claim (`e2b/record.rs`): metadata, env vars,
    // the E2B template name and the start time. Deleted with the claim.
    "CREATE TABLE e2b_sandboxes (
        id TEXT PRIMARY KEY,
        template_id TEXT NOT NULL,
        metadata TEXT NOT NULL,
        env_vars TEXT NOT NULL,
        started_ms INTEGER NOT NULL
     );",
    // 3: snapshots as sandboxd writes them (the placeholder held no rows), and
    // hibernated claims (their guest is on disk under `data_dir/hibernated/ID`).
    "DROP TABLE snapshots;
     CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,
        tenant TEXT,
        name TEXT,
        source TEXT NOT NULL,
        template TEXT NOT NULL,
        size TEXT NOT NULL,
        inputs TEXT NOT NULL,
        memory INTEGER NOT NULL,
        bytes INTEGER NOT NULL,
        created_ms INTEGER NOT NULL,
        expires_ms INTEGER NOT NULL
     );
     ALTER TABLE claims ADD COLUMN hibernated INTEGER NOT NULL DEFAULT 0;",
];

/// One claim as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    /// Public id.
    pub id: String,
    /// SHA-256 of its token.
    pub token_sha256: [u8; 32],
    /// The tenant that claimed it (root when `None`).
    pub tenant: Option<String>,
    /// Template name.
    pub template: String,
    /// Size name.
    pub size: String,
    /// Deadline, ms since the Unix epoch.
    pub deadline_ms: u64,
    /// How to find its guest again; `None` when its engine cannot re-adopt.
    pub handle: Option<GuestHandle>,
    /// Its guest is written out (hibernated), not running.
    pub hibernated: bool,
}

/// Pool targets saved by `PUT /v1/pools`, with the hash of the config's own pool list they
/// were saved against.
pub struct SavedTargets {
    /// The config's pool list hash at the time.
    pub config_hash: String,
    /// The targets.
    pub pools: Vec<api::PoolTarget>,
}

/// The open database.
pub struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
}

impl Store {
    /// Opens (or creates) `data_dir/state.db` and brings its schema up to date. A file
    /// that is not a database, or one from a newer sandboxd, is a clear error.
    pub fn open(data_dir: &Path) -> Result<Store> {
        let path = data_dir.join(FILE);
        let fail = |e: rusqlite::Error| store_error(&path, e);
        let conn = Connection::open(&path).map_err(fail)?;
        // WAL: readers never block the writer; FULL: a commit survives power loss.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(fail)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Store {
                path: path.display().to_string(),
                message: format!("cannot switch to WAL (journal mode {mode})"),
            });
        }
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
            .map_err(fail)?;
        let store = Store {
            conn: Mutex::new(conn),
            path,
        };
        store.migrate()?;
        // A torn or tampered file can open and still be damaged: check it now, not on
        // the first claim.
        let check: String = store.with(|c| c.query_row("PRAGMA quick_check", [], |r| r.get(0)))?;
        if check != "ok" {
            return Err(Error::Store {
                path: store.path.display().to_string(),
                message: format!("integrity check failed: {check}"),
            });
        }
        Ok(store)
    }

    fn migrate(&self) -> Result<()> {
        let latest = MIGRATIONS.len() as i64;
        let path = self.path.display().to_string();
        self.with(|c| {
            let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            if version > latest {
                return Ok(Err(Error::Store {
                    path,
                    message: format!(
                        "schema version {version} is newer than this sandboxd knows \
                         ({latest}); run the newer sandboxd, or restore a backup"
                    ),
                }));
            }
            for (i, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
                let tx = c.transaction()?;
                tx.execute_batch(sql)?;
                tx.pragma_update(None, "user_version", i as i64 + 1)?;
                tx.commit()?;
                tracing::info!(version = i + 1, "state database migrated");
            }
            Ok(Ok(()))
        })?
    }

    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T> {
        let mut conn = self.conn.lock().expect("store lock");
        f(&mut conn).map_err(|e| store_error(&self.path, e))
    }

    /// Every recorded claim. A handle that does not decode is `None` (logged): its
    /// claim is then dropped like one whose guest is gone.
    pub fn claims(&self) -> Result<Vec<ClaimRecord>> {
        let rows = self.with(|c| {
            let mut q = c.prepare(
                "SELECT id, token_sha256, tenant, template, size, deadline_ms, handle, hibernated
                 FROM claims ORDER BY id",
            )?;
            let rows = q.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, Option<String>>(6)?,
                    r.get::<_, bool>(7)?,
                ))
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        let mut out = Vec::new();
        for (id, digest, tenant, template, size, deadline, handle, hibernated) in rows {
            let Ok(token_sha256) = <[u8; 32]>::try_from(digest.as_slice()) else {
                tracing::warn!(
                    id,
                    "claim record with a malformed token digest; dropping it"
                );
                continue;
            };
            let handle = handle.and_then(|h| match serde_json::from_str(&h) {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!(id, "claim record with an unreadable engine handle: {e}");
                    None
                }
            });
            out.push(ClaimRecord {
                id,
                token_sha256,
                tenant,
                template,
                size,
                deadline_ms: deadline.max(0) as u64,
                handle,
                hibernated,
            });
        }
        Ok(out)
    }

    /// Records a new claim (committed when this returns).
    pub fn put_claim(&self, rec: &ClaimRecord) -> Result<()> {
        let handle = rec
            .handle
            .as_ref()
            .map(|h| serde_json::to_string(h).unwrap_or_default());
        self.with(|c| {
            c.execute(
                "INSERT INTO claims (id, token_sha256, tenant, template, size, deadline_ms, handle,
                                     hibernated)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    rec.id,
                    rec.token_sha256.as_slice(),
                    rec.tenant,
                    rec.template,
                    rec.size,
                    rec.deadline_ms as i64,
                    handle,
                    rec.hibernated
                ],
            )
        })
        .map(drop)
    }

    /// Deletes a claim's record; deleting one that is not there is fine.
    pub fn delete_claim(&self, id: &str) -> Result<()> {
        self.with(|c| {
            c.execute("DELETE FROM e2b_sandboxes WHERE id = ?1", [id])?;
            c.execute("DELETE FROM claims WHERE id = ?1", [id])
        })
        .map(drop)
    }

    /// Writes a claim's deadline as `current()` reads it under the store's lock, so
    /// concurrent renews leave the latest deadline on disk, never an older one.
    pub fn set_deadline(&self, id: &str, current: impl FnOnce() -> u64) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE claims SET deadline_ms = ?2 WHERE id = ?1",
                params![id, current() as i64],
            )
        })
        .map(drop)
    }

    /// The saved pool targets, if `PUT /v1/pools` (or a migrated `pools.json`) set any.
    pub fn pool_targets(&self) -> Result<Option<SavedTargets>> {
        self.with(|c| {
            let hash: Option<String> = c
                .query_row(
                    "SELECT value FROM settings WHERE key = 'pools_config_hash'",
                    [],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(config_hash) = hash else {
                return Ok(None);
            };
            let mut q = c.prepare(
                "SELECT template, size, warm, warm_max FROM pool_targets ORDER BY template, size",
            )?;
            let pools = q
                .query_map([], |r| {
                    Ok(api::PoolTarget {
                        template: r.get(0)?,
                        size: r.get(1)?,
                        warm: r.get(2)?,
                        warm_max: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Some(SavedTargets { config_hash, pools }))
        })
    }

    /// Replaces the saved pool targets in one transaction.
    pub fn save_pool_targets(&self, config_hash: &str, pools: &[api::PoolTarget]) -> Result<()> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM pool_targets", [])?;
            for p in pools {
                tx.execute(
                    "INSERT INTO pool_targets (template, size, warm, warm_max)
                     VALUES (?1, ?2, ?3, ?4)",
                    params![p.template, p.size, p.warm, p.warm_max],
                )?;
            }
            tx.execute(
                "INSERT INTO settings (key, value) VALUES ('pools_config_hash', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [config_hash],
            )?;
            tx.commit()
        })
    }
}

fn store_error(path: &Path, e: rusqlite::Error) -> Error {
    // A full data_dir is the node out of a resource for now (503, retry later), not an
    // internal error: the change was not recorded, so it is refused whole.
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
        return Error::Busy {
            reason: "data_dir is full: the change cannot be recorded".into(),
            retry_after: 5,
        };
    }
    Error::Store {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> ClaimRecord {
        ClaimRecord {
            id: id.into(),
            token_sha256: [7; 32],
            tenant: Some("a".into()),
            template: "base".into(),
            size: "small".into(),
            deadline_ms: 1_000,
            handle: None,
            hibernated: false,
        }
    }

    #[test]
    fn claims_and_targets_survive_reopening() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Store::open(tmp.path()).unwrap();
        s.put_claim(&record("sb-1")).unwrap();
        s.put_claim(&record("sb-2")).unwrap();
        assert!(s.put_claim(&record("sb-2")).is_err(), "ids are unique");
        s.set_deadline("sb-1", || 5_000).unwrap();
        s.delete_claim("sb-2").unwrap();
        s.delete_claim("sb-2").unwrap();
        let t = api::PoolTarget {
            template: "base".into(),
            size: "small".into(),
            warm: 3,
            warm_max: 4,
        };
        s.save_pool_targets("h", std::slice::from_ref(&t)).unwrap();
        drop(s);
        let s = Store::open(tmp.path()).unwrap();
        let claims = s.claims().unwrap();
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].deadline_ms, 5_000);
        let saved = s.pool_targets().unwrap().unwrap();
        assert_eq!((saved.config_hash.as_str(), saved.pools), ("h", vec![t]));
    }

    #[test]
    fn a_damaged_or_newer_file_is_a_clear_error() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(FILE), vec![0x5a; 8192]).unwrap();
        let e = Store::open(tmp.path()).err().expect("garbage refused");
        assert!(e.to_string().contains("state.db"), "{e}");
        let tmp = tempfile::tempdir().unwrap();
        drop(Store::open(tmp.path()).unwrap());
        let c = Connection::open(tmp.path().join(FILE)).unwrap();
        c.pragma_update(None, "user_version", 99).unwrap();
        drop(c);
        let e = Store::open(tmp.path()).err().expect("newer schema refused");
        assert!(e.to_string().contains("schema version 99"), "{e}");
    }
}
