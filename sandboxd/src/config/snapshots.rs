//! `[snapshots]`: how long snapshots live, how many and how large one tenant's may be,
//! and the disk headroom a snapshot or hibernation must leave free.

use serde::{Deserialize, Serialize};

/// `[snapshots]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsConfig {
    /// Lifetime of a snapshot that names none.
    #[serde(default = "default_ttl")]
    pub default_ttl_seconds: u64,
    /// Largest lifetime a snapshot is granted.
    #[serde(default = "max_ttl")]
    pub max_ttl_seconds: u64,
    /// Snapshots one tenant (or root) may hold at once (429 beyond).
    #[serde(default = "max_per_tenant")]
    pub max_per_tenant: u32,
    /// Bytes of snapshots one tenant (or root) may hold on disk (429 beyond); a new
    /// snapshot is counted at its sandbox's memory size until it is written.
    #[serde(default = "max_bytes_per_tenant")]
    pub max_bytes_per_tenant: u64,
    /// Free bytes `data_dir` must keep after a snapshot or hibernation is written (507
    /// when it would not).
    #[serde(default = "min_free_bytes")]
    pub min_free_bytes: u64,
}

impl Default for SnapshotsConfig {
    fn default() -> Self {
        SnapshotsConfig {
            default_ttl_seconds: default_ttl(),
            max_ttl_seconds: max_ttl(),
            max_per_tenant: max_per_tenant(),
            max_bytes_per_tenant: max_bytes_per_tenant(),
            min_free_bytes: min_free_bytes(),
        }
    }
}

fn default_ttl() -> u64 {
    24 * 3600
}
fn max_ttl() -> u64 {
    7 * 24 * 3600
}
fn max_per_tenant() -> u32 {
    32
}
fn max_bytes_per_tenant() -> u64 {
    16 << 30
}
fn min_free_bytes() -> u64 {
    1 << 30
}
