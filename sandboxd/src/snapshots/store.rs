//! The snapshot rows of the state database and the hibernated flag of claims: each call
//! is one committed transaction, like the rest of [`Store`].

use rusqlite::{params, OptionalExtension};

use crate::engine::GuestHandle;
use crate::error::Result;
use crate::store::Store;

/// One snapshot as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    /// `snap-` and 24 hex digits (also its directory's name).
    pub id: String,
    /// The tenant that owns it (root when `None`).
    pub tenant: Option<String>,
    /// Its label.
    pub name: Option<String>,
    /// The sandbox it was taken from.
    pub source: String,
    /// Template of the source (and of every fork).
    pub template: String,
    /// Size of the source (and of every fork).
    pub size: String,
    /// The engine's golden inputs when it was taken: a fork needs the same image.
    pub inputs: String,
    /// Memory and device state are in it.
    pub memory: bool,
    /// Bytes on disk.
    pub bytes: u64,
    /// When it was taken, ms since the Unix epoch.
    pub created_ms: u64,
    /// When it expires, ms since the Unix epoch.
    pub expires_ms: u64,
}

impl SnapshotRecord {
    /// The API's row.
    pub fn info(&self) -> api::snapshots::SnapshotInfo {
        api::snapshots::SnapshotInfo {
            id: self.id.clone(),
            name: self.name.clone(),
            source: self.source.clone(),
            template: self.template.clone(),
            size: self.size.clone(),
            memory: self.memory,
            bytes: self.bytes,
            created: self.created_ms / 1000,
            expires: self.expires_ms / 1000,
        }
    }
}

const COLUMNS: &str = "id, tenant, name, source, template, size, inputs, memory, bytes, \
                       created_ms, expires_ms";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SnapshotRecord> {
    Ok(SnapshotRecord {
        id: r.get(0)?,
        tenant: r.get(1)?,
        name: r.get(2)?,
        source: r.get(3)?,
        template: r.get(4)?,
        size: r.get(5)?,
        inputs: r.get(6)?,
        memory: r.get(7)?,
        bytes: r.get::<_, i64>(8)?.max(0) as u64,
        created_ms: r.get::<_, i64>(9)?.max(0) as u64,
        expires_ms: r.get::<_, i64>(10)?.max(0) as u64,
    })
}

impl Store {
    /// Records a written snapshot.
    pub fn put_snapshot(&self, s: &SnapshotRecord) -> Result<()> {
        self.with(|c| {
            c.execute(
                &format!("INSERT INTO snapshots ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"),
                params![
                    s.id,
                    s.tenant,
                    s.name,
                    s.source,
                    s.template,
                    s.size,
                    s.inputs,
                    s.memory,
                    s.bytes as i64,
                    s.created_ms as i64,
                    s.expires_ms as i64
                ],
            )
        })
        .map(drop)
    }

    /// Every snapshot, oldest first.
    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>> {
        self.with(|c| {
            let mut q = c.prepare(&format!(
                "SELECT {COLUMNS} FROM snapshots ORDER BY created_ms, id"
            ))?;
            let rows = q.query_map([], row)?;
            rows.collect()
        })
    }

    /// One snapshot by id.
    pub fn snapshot(&self, id: &str) -> Result<Option<SnapshotRecord>> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1"),
                [id],
                row,
            )
            .optional()
        })
    }

    /// Deletes a snapshot's row; deleting one that is not there is fine.
    pub fn delete_snapshot(&self, id: &str) -> Result<()> {
        self.with(|c| c.execute("DELETE FROM snapshots WHERE id = ?1", [id]))
            .map(drop)
    }

    /// Records a claim as hibernated (no guest) or awake with `handle`.
    pub fn set_hibernated(
        &self,
        id: &str,
        hibernated: bool,
        handle: Option<&GuestHandle>,
    ) -> Result<()> {
        let handle = handle.map(|h| serde_json::to_string(h).unwrap_or_default());
        self.with(|c| {
            c.execute(
                "UPDATE claims SET hibernated = ?2, handle = ?3 WHERE id = ?1",
                params![id, hibernated, handle],
            )
        })
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_survive_reopening_and_delete_once() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Store::open(tmp.path()).unwrap();
        let rec = SnapshotRecord {
            id: "snap-000000000000000000000001".into(),
            tenant: Some("a".into()),
            name: Some("before-change".into()),
            source: "sb-1".into(),
            template: "base".into(),
            size: "small".into(),
            inputs: "qemu=10".into(),
            memory: true,
            bytes: 5 << 20,
            created_ms: 1_000,
            expires_ms: 9_000,
        };
        s.put_snapshot(&rec).unwrap();
        assert!(s.put_snapshot(&rec).is_err(), "ids are unique");
        drop(s);
        let s = Store::open(tmp.path()).unwrap();
        assert_eq!(s.snapshots().unwrap(), vec![rec.clone()]);
        assert_eq!(s.snapshot(&rec.id).unwrap(), Some(rec.clone()));
        s.delete_snapshot(&rec.id).unwrap();
        s.delete_snapshot(&rec.id).unwrap();
        assert_eq!(s.snapshot(&rec.id).unwrap(), None);
    }
}
