//! Warm pools and their goldens, engine-neutral. A pool per (template, size) keeps `warm`
//! idle guests; a worker per pool builds the golden (boot, `Info`, warmup, seal, stamp),
//! then refills with bounded concurrency and backs off after failures. Targets changed by
//! `PUT /v1/pools` persist in `data_dir/pools.json`; the config wins when its own pool
//! list changed since.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::{Engine, Guest, GuestSpec};
use crate::error::{Error, Result};
use crate::guest;
use crate::metrics::{Metrics, PoolLabel};

/// A pool's identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    /// Template name.
    pub template: String,
    /// Size name.
    pub size: String,
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.template, self.size)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GoldenState {
    Missing,
    Building,
    Ready,
    Failed,
}

impl GoldenState {
    fn as_str(self) -> &'static str {
        match self {
            GoldenState::Missing => "missing",
            GoldenState::Building => "building",
            GoldenState::Ready => "ready",
            GoldenState::Failed => "failed",
        }
    }
}

struct Pool {
    spec: GuestSpec,
    warmup: Option<Vec<String>>,
    target: u32,
    warm_max: u32,
    idle: VecDeque<Arc<dyn Guest>>,
    golden: GoldenState,
    stamp: Option<String>,
    golden_error: Option<String>,
    builds: u64,
    refill_error: Option<String>,
    wake: Arc<Notify>,
}

/// What `pools.json` holds.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedTargets {
    config_hash: String,
    pools: Vec<api::PoolTarget>,
}

/// Every pool of the node.
pub struct Pools {
    engine: Arc<dyn Engine>,
    metrics: Arc<Metrics>,
    config: Arc<Config>,
    pools: Mutex<BTreeMap<PoolKey, Pool>>,
    refill: Arc<Semaphore>,
    shutdown: CancellationToken,
    workers: Mutex<Vec<JoinHandle<()>>>,
    warnings: Vec<String>,
    config_hash: String,
}

/// Exponential backoff after `failures` consecutive failures: 0.5 s doubling to 60 s.
/// How often a full pool looks for idle guests that died on their own.
const IDLE_CHECK: Duration = Duration::from_secs(1);

fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(7);
    Duration::from_millis(500 << exp).min(Duration::from_secs(60))
}

/// How long shutdown waits for a pool worker before aborting it.
const WORKER_STOP: Duration = Duration::from_secs(2);

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The config file's own pool list as warm targets (config-owned fields left out).
fn config_targets(config: &Config) -> Vec<api::PoolTarget> {
    config
        .pools
        .iter()
        .map(|p| api::PoolTarget {
            template: p.template.clone(),
            size: p.size.clone(),
            warm: p.warm,
            warm_max: p.warm_max,
        })
        .collect()
}

/// The hash of the config file's own pool list, leaving out config-owned fields.
fn config_pools_hash(config: &Config) -> String {
    sha256_hex(&serde_json::to_vec(&config_targets(config)).unwrap_or_default())
}

impl Pools {
    /// Creates every pool (config plus persisted targets), reuses goldens whose stamp
    /// matches, and starts a worker per pool.
    pub fn start(
        config: Arc<Config>,
        engine: Arc<dyn Engine>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Result<Arc<Pools>> {
        std::fs::create_dir_all(config.data_dir.join("goldens"))
            .map_err(Error::io("creating goldens dir"))?;
        let config_hash = config_pools_hash(&config);
        let mut warnings = Vec::new();
        let mut targets = config_targets(&config);
        let saved_path = config.data_dir.join("pools.json");
        let mut persist = false;
        match std::fs::read(&saved_path) {
            Ok(bytes) => match serde_json::from_slice::<SavedTargets>(&bytes) {
                Ok(saved) if saved.config_hash == config_hash => {
                    // Pools the saved list left out were drained; keep them at zero.
                    for t in &mut targets {
                        t.warm = 0;
                    }
                    for s in saved.pools {
                        if config.check_pool_key(&s.template, &s.size).is_err() {
                            continue;
                        }
                        match targets
                            .iter_mut()
                            .find(|t| t.template == s.template && t.size == s.size)
                        {
                            Some(t) => *t = s,
                            None => targets.push(s),
                        }
                    }
                }
                Ok(_) => {
                    let w = "the config file's pool list changed since the last PUT /v1/pools; \
                             the config file wins and the saved targets were discarded";
                    tracing::warn!("{w}");
                    warnings.push(w.to_string());
                    persist = true;
                }
                Err(e) => {
                    let w = format!("ignoring unreadable {}: {e}", saved_path.display());
                    tracing::warn!("{w}");
                    warnings.push(w);
                    persist = true;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("reading {}", saved_path.display()))(e)),
        }
        let pools = Arc::new(Pools {
            engine,
            metrics,
            config: config.clone(),
            pools: Mutex::new(BTreeMap::new()),
            refill: Arc::new(Semaphore::new(config.refill_concurrency as usize)),
            shutdown,
            workers: Mutex::new(Vec::new()),
            warnings,
            config_hash,
        });
        for t in &targets {
            pools.add_pool(t);
        }
        if persist {
            pools.save()?;
        }
        Ok(pools)
    }

    /// Node-level warnings (config vs saved targets) for `/v1/info`.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The spec an engine needs for a key (any configured template and size).
    pub fn spec(&self, key: &PoolKey) -> Result<GuestSpec> {
        let c = &self.config;
        c.check_pool_key(&key.template, &key.size)
            .map_err(|e| Error::BadRequest(e.to_string().trim_start_matches("config: ").into()))?;
        let no_balloon = c
            .pools
            .iter()
            .find(|p| p.template == key.template && p.size == key.size)
            .is_some_and(|p| p.no_balloon);
        Ok(GuestSpec {
            template: key.template.clone(),
            size: key.size.clone(),
            template_config: c.templates[&key.template].clone(),
            size_config: c.sizes[&key.size].clone(),
            no_balloon,
            golden_dir: c
                .data_dir
                .join("goldens")
                .join(format!("{}.{}", key.template, key.size)),
        })
    }

    fn stamp_path(&self, key: &PoolKey) -> PathBuf {
        self.config
            .data_dir
            .join("goldens")
            .join(format!("{}.{}.stamp", key.template, key.size))
    }

    /// The hash of everything the golden depends on.
    fn stamp(&self, spec: &GuestSpec, warmup: &Option<Vec<String>>) -> Result<String> {
        let inputs = serde_json::json!({
            "engine": self.engine.info().name,
            "engine_inputs": self.engine.golden_inputs(spec)?,
            "template": spec.template,
            "size": spec.size,
            "cpus": spec.size_config.cpus,
            "memory_mib": spec.size_config.memory_mib,
            "max_pids": spec.size_config.max_pids,
            "warmup": warmup,
            "no_balloon": spec.no_balloon,
        });
        Ok(sha256_hex(inputs.to_string().as_bytes()))
    }

    fn add_pool(self: &Arc<Self>, t: &api::PoolTarget) {
        let key = PoolKey {
            template: t.template.clone(),
            size: t.size.clone(),
        };
        let Ok(spec) = self.spec(&key) else {
            return;
        };
        let warmup = self
            .config
            .pools
            .iter()
            .find(|p| p.template == key.template && p.size == key.size)
            .and_then(|p| p.warmup.clone());
        // A matching stamp (and artifacts) means the golden is still good: no rebuild.
        let expected = self.stamp(&spec, &warmup).ok();
        let on_disk = std::fs::read_to_string(self.stamp_path(&key)).ok();
        let reusable = expected.is_some()
            && on_disk.as_deref().map(str::trim) == expected.as_deref()
            && self.engine.golden_present(&spec);
        let pool = Pool {
            spec,
            warmup,
            target: t.warm,
            warm_max: t.warm_max,
            idle: VecDeque::new(),
            golden: if reusable {
                GoldenState::Ready
            } else {
                GoldenState::Missing
            },
            stamp: if reusable { expected } else { None },
            golden_error: None,
            builds: 0,
            refill_error: None,
            wake: Arc::new(Notify::new()),
        };
        self.pools
            .lock()
            .expect("pools lock")
            .insert(key.clone(), pool);
        let worker = tokio::spawn(self.clone().worker(key));
        self.workers.lock().expect("workers lock").push(worker);
    }

    fn save(&self) -> Result<()> {
        let saved = SavedTargets {
            config_hash: self.config_hash.clone(),
            pools: self.targets(),
        };
        let path = self.config.data_dir.join("pools.json");
        write_atomic(
            &path,
            &serde_json::to_vec_pretty(&saved).unwrap_or_default(),
        )
    }

    /// The current targets of pools with a non-zero target.
    pub fn targets(&self) -> Vec<api::PoolTarget> {
        let pools = self.pools.lock().expect("pools lock");
        pools
            .iter()
            .filter(|(_, p)| p.target > 0)
            .map(|(k, p)| api::PoolTarget {
                template: k.template.clone(),
                size: k.size.clone(),
                warm: p.target,
                warm_max: p.warm_max,
            })
            .collect()
    }

    /// Applies `PUT /v1/pools`: validates the whole list first, then sets targets; pools
    /// absent from the list are drained. Persists the result.
    pub fn update(self: &Arc<Self>, update: api::PoolsUpdate) -> Result<Vec<api::PoolTarget>> {
        let mut seen = std::collections::HashSet::new();
        for t in &update.pools {
            self.config
                .check_pool_key(&t.template, &t.size)
                .map_err(|e| Error::BadRequest(e.to_string().replace("config: ", "")))?;
            if t.warm > t.warm_max {
                return Err(Error::BadRequest(format!(
                    "pool {}/{}: warm {} exceeds warm_max {}",
                    t.template, t.size, t.warm, t.warm_max
                )));
            }
            if !seen.insert((t.template.clone(), t.size.clone())) {
                return Err(Error::BadRequest(format!(
                    "pool {}/{} appears twice",
                    t.template, t.size
                )));
            }
        }
        let mut new = Vec::new();
        {
            let mut pools = self.pools.lock().expect("pools lock");
            for (key, pool) in pools.iter_mut() {
                match update
                    .pools
                    .iter()
                    .find(|t| t.template == key.template && t.size == key.size)
                {
                    Some(t) => {
                        pool.target = t.warm;
                        pool.warm_max = t.warm_max;
                    }
                    None => pool.target = 0,
                }
                pool.wake.notify_one();
            }
            for t in &update.pools {
                let key = PoolKey {
                    template: t.template.clone(),
                    size: t.size.clone(),
                };
                if !pools.contains_key(&key) {
                    new.push(t.clone());
                }
            }
        }
        for t in &new {
            self.add_pool(t);
        }
        self.save()?;
        Ok(self.targets())
    }

    /// Takes an idle guest, if the pool has one, and wakes its refill.
    pub fn take_warm(&self, key: &PoolKey) -> Option<Arc<dyn Guest>> {
        let mut pools = self.pools.lock().expect("pools lock");
        let pool = pools.get_mut(key)?;
        let guest = pool.idle.pop_front()?;
        self.metrics
            .pool_warm
            .get_or_create(&PoolLabel {
                pool: key.to_string(),
            })
            .set(pool.idle.len() as i64);
        pool.wake.notify_one();
        Some(guest)
    }

    /// Starts a guest and waits for silkd's `Info`.
    pub async fn start_ready(&self, spec: &GuestSpec) -> Result<Arc<dyn Guest>> {
        let guest = self.engine.start(spec).await?;
        let bound = Duration::from_secs(self.config.boot_timeout_seconds);
        if let Err(e) = guest::info(&*guest, bound).await {
            guest.destroy().await;
            return Err(e);
        }
        Ok(guest)
    }

    /// `/v1/info` rows.
    pub fn info(&self) -> Vec<api::PoolInfo> {
        let pools = self.pools.lock().expect("pools lock");
        pools
            .iter()
            .map(|(k, p)| api::PoolInfo {
                template: k.template.clone(),
                size: k.size.clone(),
                warm: p.idle.len() as u32,
                target: p.target,
                warm_max: p.warm_max,
                golden: api::GoldenInfo {
                    state: p.golden.as_str().into(),
                    stamp: p.stamp.clone(),
                    last_error: p.golden_error.clone(),
                    builds: p.builds,
                },
                last_refill_error: p.refill_error.clone(),
            })
            .collect()
    }

    /// Stops the workers and destroys every idle guest.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let workers: Vec<_> = std::mem::take(&mut *self.workers.lock().expect("workers lock"));
        for mut w in workers {
            // A worker may be mid-build (a golden's warmup may take minutes): give it a
            // moment, then abort it; dropping its futures drops the guests it was making,
            // and a dropped guest kills its processes.
            if tokio::time::timeout(WORKER_STOP, &mut w).await.is_err() {
                w.abort();
                let _ = w.await;
            }
        }
        let idle: Vec<Arc<dyn Guest>> = {
            let mut pools = self.pools.lock().expect("pools lock");
            pools.values_mut().flat_map(|p| p.idle.drain(..)).collect()
        };
        futures::future::join_all(idle.iter().map(|g| g.destroy())).await;
    }

    fn with_pool<T>(&self, key: &PoolKey, f: impl FnOnce(&mut Pool) -> T) -> Option<T> {
        self.pools.lock().expect("pools lock").get_mut(key).map(f)
    }

    async fn pause(&self, wait: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.shutdown.cancelled() => {}
        }
    }

    /// One pool's loop: golden first, then keep `target` idle guests.
    async fn worker(self: Arc<Self>, key: PoolKey) {
        let Some(wake) = self.with_pool(&key, |p| p.wake.clone()) else {
            return;
        };
        let label = PoolLabel {
            pool: key.to_string(),
        };
        let mut failures = 0u32;
        while !self.shutdown.is_cancelled() {
            let Some((golden, want, surplus)) = self.with_pool(&key, |p| {
                // Idle guests that died on their own are dropped, and replaced below.
                let (mut dead, alive): (Vec<_>, Vec<_>) =
                    p.idle.drain(..).partition(|g| g.failure().is_some());
                p.idle.extend(alive);
                let have = p.idle.len() as u32;
                dead.extend((p.target..have).filter_map(|_| p.idle.pop_back()));
                (p.golden, p.target.saturating_sub(have), dead)
            }) else {
                return;
            };
            self.metrics
                .pool_warm
                .get_or_create(&label)
                .set(self.with_pool(&key, |p| p.idle.len() as i64).unwrap_or(0));
            if !surplus.is_empty() {
                futures::future::join_all(surplus.iter().map(|g| g.destroy())).await;
                continue;
            }
            if want > 0 && golden != GoldenState::Ready {
                match self.build_golden(&key).await {
                    Ok(()) => failures = 0,
                    Err(_) => {
                        failures += 1;
                        self.pause(backoff(failures)).await;
                    }
                }
                continue;
            }
            if want == 0 {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = self.shutdown.cancelled() => {}
                    // Re-check now and then for idle guests that died.
                    () = tokio::time::sleep(IDLE_CHECK) => {}
                }
                continue;
            }
            let Some(spec) = self.with_pool(&key, |p| p.spec.clone()) else {
                return;
            };
            let mut starts = JoinSet::new();
            for _ in 0..want {
                let this = self.clone();
                let spec = spec.clone();
                starts.spawn(async move {
                    let _permit = this.refill.clone().acquire_owned().await;
                    this.start_ready(&spec).await
                });
            }
            let mut failed = None;
            while let Some(joined) = starts.join_next().await {
                match joined {
                    Ok(Ok(g)) => self.add_idle(&key, g).await,
                    Ok(Err(e)) => failed = Some(e.to_string()),
                    Err(e) => failed = Some(format!("refill task failed: {e}")),
                }
            }
            self.with_pool(&key, |p| p.refill_error = failed.clone());
            if let Some(e) = failed {
                tracing::warn!(pool = %key, "refill failed: {e}");
                failures += 1;
                self.pause(backoff(failures)).await;
            } else {
                failures = 0;
            }
        }
    }

    async fn add_idle(&self, key: &PoolKey, guest: Arc<dyn Guest>) {
        let rejected = if self.shutdown.is_cancelled() {
            Some(guest)
        } else {
            self.with_pool(key, |p| {
                if (p.idle.len() as u32) < p.target {
                    p.idle.push_back(guest);
                    None
                } else {
                    Some(guest)
                }
            })
            .flatten()
        };
        if let Some(g) = rejected {
            g.destroy().await;
        }
    }

    /// Builds a pool's golden: boot, `Info`, warmup (bounded), seal, then the stamp. The
    /// outcome is recorded for `/v1/info`; a failure also removes any old stamp.
    async fn build_golden(&self, key: &PoolKey) -> Result<()> {
        let Some((spec, warmup)) = self.with_pool(key, |p| {
            p.golden = GoldenState::Building;
            p.builds += 1;
            (p.spec.clone(), p.warmup.clone())
        }) else {
            return Ok(());
        };
        self.metrics
            .golden_builds
            .get_or_create(&PoolLabel {
                pool: key.to_string(),
            })
            .inc();
        let stamp_path = self.stamp_path(key);
        let outcome = async {
            let stamp = self.stamp(&spec, &warmup)?;
            let _ = std::fs::remove_file(&stamp_path);
            let golden = self.engine.boot_golden(&spec).await?;
            let boot = Duration::from_secs(self.config.boot_timeout_seconds);
            let warm = Duration::from_secs(self.config.warmup_timeout_seconds);
            let warmed = async {
                guest::info(&*golden, boot).await?;
                if let Some(argv) = &warmup {
                    guest::run_checked(&*golden, argv, warm)
                        .await
                        .map_err(|e| Error::Engine(format!("warmup {e}")))?;
                }
                Ok::<_, Error>(())
            }
            .await;
            if let Err(e) = warmed {
                golden.destroy().await;
                return Err(e);
            }
            self.engine.seal_golden(&spec, golden).await?;
            write_atomic(&stamp_path, stamp.as_bytes())?;
            Ok(stamp)
        }
        .await;
        self.with_pool(key, |p| match &outcome {
            Ok(stamp) => {
                p.golden = GoldenState::Ready;
                p.stamp = Some(stamp.clone());
                p.golden_error = None;
            }
            Err(e) => {
                p.golden = GoldenState::Failed;
                p.stamp = None;
                p.golden_error = Some(e.to_string());
            }
        });
        match outcome {
            Ok(stamp) => {
                tracing::info!(pool = %key, %stamp, "golden built");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(pool = %key, "golden build failed: {e}");
                Err(e)
            }
        }
    }
}

/// Writes a file through a temporary sibling and a rename, so readers never see half.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(Error::io(format!("writing {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(8), Duration::from_secs(60));
        assert_eq!(backoff(100), Duration::from_secs(60));
    }

    #[test]
    fn config_hash_ignores_config_owned_fields() {
        let base = r#"
            listen = "127.0.0.1:0"
            data_dir = "/tmp/x"
            [templates.host]
            rootfs = "/"
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
        assert_eq!(config_pools_hash(&a), config_pools_hash(&b));
        assert_ne!(config_pools_hash(&a), config_pools_hash(&c));
    }
}
