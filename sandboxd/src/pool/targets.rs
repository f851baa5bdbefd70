//! Warm targets and where they persist: the config file's `[[pools]]` merged with what
//! `PUT /v1/pools` saved in the state database (`store.rs`; the config wins when its own
//! pool list changed since), the one-time import of an older `data_dir/pools.json`, and
//! the atomic file writes golden stamps use.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::PoolKey;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::{SavedTargets, Store};

/// What `pools.json` held (before the state database), read once to import it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedFile {
    config_hash: String,
    pools: Vec<api::PoolTarget>,
}

/// The targets to start with, and what the node should say about them.
pub(super) struct Loaded {
    /// Every pool's target, by key.
    pub targets: BTreeMap<PoolKey, api::PoolTarget>,
    /// Node-level warnings for `/v1/info`.
    pub warnings: Vec<String>,
    /// True when the saved targets must be rewritten (discarded).
    pub rewrite: bool,
}

/// The file an older sandboxd kept the targets in.
fn legacy_path(config: &Config) -> PathBuf {
    config.data_dir.join("pools.json")
}

/// Imports `pools.json` into the database once (the database then owns the targets and
/// the file is removed). A file that does not decode is left, with a warning.
fn import_legacy(config: &Config, store: &Store, warnings: &mut Vec<String>) -> Result<()> {
    let path = legacy_path(config);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()))(e)),
    };
    match serde_json::from_slice::<SavedFile>(&bytes) {
        Ok(saved) => {
            if store.pool_targets()?.is_none() {
                store.save_pool_targets(&saved.config_hash, &saved.pools)?;
                tracing::info!("imported {} into the state database", path.display());
            }
            std::fs::remove_file(&path)
                .map_err(Error::io(format!("removing {}", path.display())))?;
        }
        Err(e) => {
            let w = format!("ignoring unreadable {}: {e}", path.display());
            tracing::warn!("{w}");
            warnings.push(w);
        }
    }
    Ok(())
}

/// The hash of the config file's own pool list, leaving out config-owned fields.
pub(super) fn config_hash(config: &Config) -> String {
    hex::encode(Sha256::digest(
        serde_json::to_vec(&config.pool_targets()).unwrap_or_default(),
    ))
}

/// The config's targets, replaced by the saved ones when the config's pool list is the
/// one they were saved against.
pub(super) fn load(config: &Config, store: &Store) -> Result<Loaded> {
    let mut targets: BTreeMap<PoolKey, api::PoolTarget> = config
        .pool_targets()
        .into_iter()
        .map(|t| (PoolKey::of(&t), t))
        .collect();
    let mut loaded = Loaded {
        targets: BTreeMap::new(),
        warnings: Vec::new(),
        rewrite: false,
    };
    import_legacy(config, store, &mut loaded.warnings)?;
    match store.pool_targets()? {
        Some(SavedTargets {
            config_hash: h,
            pools,
        }) if h == config_hash(config) => {
            // Pools the saved list left out were drained; keep them at zero.
            for t in targets.values_mut() {
                t.warm = 0;
            }
            for s in pools {
                if config.check_pool_key(&s.template, &s.size).is_ok() {
                    targets.insert(PoolKey::of(&s), s);
                }
            }
        }
        Some(_) => {
            let w = "the config file's pool list changed since the last PUT /v1/pools; \
                     the config file wins and the saved targets were discarded";
            tracing::warn!("{w}");
            loaded.warnings.push(w.to_string());
            loaded.rewrite = true;
        }
        None => {}
    }
    loaded.targets = targets;
    Ok(loaded)
}

/// Saves the targets in effect against the config's pool list (committed on return).
pub(super) fn save(store: &Store, config_hash: &str, pools: Vec<api::PoolTarget>) -> Result<()> {
    store.save_pool_targets(config_hash, &pools)
}

/// Writes a file through a temporary sibling and a rename, so readers never see half.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            // A write that failed part way (ENOSPC) must not leave its half behind.
            let _ = std::fs::remove_file(&tmp);
            Error::io(format!("writing {}", path.display()))(e)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_hash_ignores_config_owned_fields() {
        let base = r#"
            listen = "127.0.0.1:0"
            data_dir = "/tmp/x"
            [templates.host]
            rootfs = "/usr"
            [sizes.small]
            cpus = 1
            memory_mib = 64
            [[pools]]
            template = "host"
            size = "small"
            warm = 1
        "#;
        let a = Config::parse(base).unwrap();
        let b = Config::parse(&format!("{base}warmup = [\"true\"]\nno_balloon = true\n")).unwrap();
        let c = Config::parse(&base.replace("warm = 1", "warm = 2")).unwrap();
        assert_eq!(config_hash(&a), config_hash(&b));
        assert_ne!(config_hash(&a), config_hash(&c));
    }
}
