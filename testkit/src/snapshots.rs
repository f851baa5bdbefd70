//! What the snapshot tests and bench read on the host: a directory's files by digest
//! (a snapshot must not change while forks run), and the host's available memory.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

/// Every file in `dir` (not recursive) by name, with its SHA-256.
pub fn digests(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap();
            let bytes = std::fs::read(e.path()).unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                hex::encode(Sha256::digest(&bytes)),
            )
        })
        .collect()
}

/// `MemAvailable` from `/proc/meminfo`, in KiB.
pub fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("MemAvailable in /proc/meminfo")
}
