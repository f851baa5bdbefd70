//! Bodies of the snapshot routes: `POST /v1/sandboxes/{id}/snapshot`, `GET
//! /v1/snapshots`, and the answers of hibernate and wake.

use serde::{Deserialize, Serialize};

/// `POST /v1/sandboxes/{id}/snapshot` body; every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// A label (1–64 of `A-Z a-z 0-9 . _ -`), shown in listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Lifetime; `[snapshots] default_ttl_seconds` when absent, clamped to
    /// `[snapshots] max_ttl_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

/// `POST /v1/sandboxes/{id}/snapshot` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotResponse {
    /// The snapshot's id, for `POST /v1/claim {"snapshot": ...}`.
    pub snapshot_id: String,
    /// True when memory and device state are in it (a VM); false when only the
    /// writable layer is.
    pub memory: bool,
}

/// One row of `GET /v1/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// Snapshot id.
    pub id: String,
    /// Its label, if it was given one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The sandbox it was taken from.
    pub source: String,
    /// Template of that sandbox (and of its forks).
    pub template: String,
    /// Size of that sandbox (and of its forks).
    pub size: String,
    /// Whether memory is in it.
    pub memory: bool,
    /// Bytes it takes on the node's disk (counted against the tenant's quota).
    pub bytes: u64,
    /// When it was taken (Unix seconds).
    pub created: u64,
    /// When it will be deleted (Unix seconds).
    pub expires: u64,
}

/// `GET /v1/snapshots` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotList {
    /// The caller's snapshots (root: all), oldest first.
    pub snapshots: Vec<SnapshotInfo>,
}
