//! Warm targets and where they persist: the config file's `[[pools]]` merged with what
//! `PUT /v1/pools` saved in `data_dir/pools.json` (the config wins when its own pool list
//! changed since), and the atomic writes that save them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::PoolKey;
use crate::config::Config;
use crate::error::{Error, Result};

/// What `pools.json` holds.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedTargets {
    config_hash: String,
    pools: Vec<api::PoolTarget>,
}

/// The targets to start with, and what the node should say about them.
pub(super) struct Loaded {
    /// Every pool's target, by key.
    pub targets: BTreeMap<PoolKey, api::PoolTarget>,
    /// Node-level warnings for `/v1/info`.
    pub warnings: Vec<String>,
    /// True when `pools.json` must be rewritten (discarded or unreadable).
    pub rewrite: bool,
}

/// The file under `data_dir`.
pub(super) fn path(config: &Config) -> PathBuf {
    config.data_dir.join("pools.json")
}

/// The hash of the config file's own pool list, leaving out config-owned fields.
pub(super) fn config_hash(config: &Config) -> String {
    hex::encode(Sha256::digest(
        serde_json::to_vec(&config.pool_targets()).unwrap_or_default(),
    ))
}

/// The config's targets, replaced by the saved ones when the config's pool list is the
/// one they were saved against.
pub(super) fn load(config: &Config) -> Result<Loaded> {
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
    let saved_path = path(config);
    match std::fs::read(&saved_path) {
        Ok(bytes) => match serde_json::from_slice::<SavedTargets>(&bytes) {
            Ok(saved) if saved.config_hash == config_hash(config) => {
                // Pools the saved list left out were drained; keep them at zero.
                for t in targets.values_mut() {
                    t.warm = 0;
                }
                for s in saved.pools {
                    if config.check_pool_key(&s.template, &s.size).is_ok() {
                        targets.insert(PoolKey::of(&s), s);
                    }
                }
            }
            Ok(_) => {
                let w = "the config file's pool list changed since the last PUT /v1/pools; \
                         the config file wins and the saved targets were discarded";
                tracing::warn!("{w}");
                loaded.warnings.push(w.to_string());
                loaded.rewrite = true;
            }
            Err(e) => {
                let w = format!("ignoring unreadable {}: {e}", saved_path.display());
                tracing::warn!("{w}");
                loaded.warnings.push(w);
                loaded.rewrite = true;
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("reading {}", saved_path.display()))(e)),
    }
    loaded.targets = targets;
    Ok(loaded)
}

/// Saves the targets in effect against the config's pool list.
pub(super) fn save(config: &Config, config_hash: &str, pools: Vec<api::PoolTarget>) -> Result<()> {
    let saved = SavedTargets {
        config_hash: config_hash.to_string(),
        pools,
    };
    write_atomic(
        &path(config),
        &serde_json::to_vec_pretty(&saved).unwrap_or_default(),
    )
}

/// Writes a file through a temporary sibling and a rename, so readers never see half.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(Error::io(format!("writing {}", path.display())))
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
