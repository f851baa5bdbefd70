//! Warm pools, engine-neutral. A pool per (template, size) keeps `warm` idle guests; its
//! worker (`refill.rs`) builds the golden (`golden.rs`) and refills. Targets come from the
//! config and `PUT /v1/pools` and persist in the state database (`targets.rs`). Pools
//! are found by key, one map lookup.

mod golden;
mod pace;
mod refill;
mod targets;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::golden::GoldenState;
pub use self::pace::Busy;
use self::pace::Pace;
use crate::config::{Config, PoolConfig};
use crate::engine::{Engine, Guest, GuestSpec};
use crate::error::{Error, Result};
use crate::guest;
use crate::metrics::{Metrics, OriginLabel, PoolLabel};
use crate::store::Store;

/// A pool's identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    /// Template name.
    pub template: String,
    /// Size name.
    pub size: String,
}

impl PoolKey {
    /// The key a warm target is for.
    pub fn of(t: &api::PoolTarget) -> PoolKey {
        PoolKey {
            template: t.template.clone(),
            size: t.size.clone(),
        }
    }
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.template, self.size)
    }
}

/// One pool's state.
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
    /// Notified when a guest joins `idle`: a claim waiting for a start slot takes it.
    joined: Arc<Notify>,
}

/// What a claim that found its pool empty gets: a guest that joined the pool while it
/// waited, or a slot to start one of its own (held while it starts).
pub enum Miss {
    /// A warm guest.
    Warm(Arc<dyn Guest>),
    /// A start slot.
    Start(tokio::sync::OwnedSemaphorePermit),
}

/// Every pool of the node.
pub struct Pools {
    engine: Arc<dyn Engine>,
    metrics: Arc<Metrics>,
    config: Arc<Config>,
    /// The config file's `[[pools]]` entries (config-owned fields: warmup, no_balloon).
    configured: HashMap<PoolKey, PoolConfig>,
    pools: Mutex<BTreeMap<PoolKey, Pool>>,
    refill: Arc<Semaphore>,
    /// Claims' own starts at once (twice the cores): past that, a burst of misses queues
    /// in order, and the first ones are served early, instead of all sharing the cores
    /// and all finishing late.
    on_demand: Arc<Semaphore>,
    /// Requests in flight, which refill starts yield to.
    pace: Arc<Pace>,
    shutdown: CancellationToken,
    workers: Mutex<Vec<JoinHandle<()>>>,
    warnings: Vec<String>,
    config_hash: String,
    store: Arc<Store>,
}

/// How long shutdown waits for a pool worker before aborting it.
const WORKER_STOP: Duration = Duration::from_secs(2);

impl Pools {
    /// Creates every pool (config plus persisted targets), reuses goldens whose stamp
    /// matches, and starts a worker per pool.
    pub fn start(
        config: Arc<Config>,
        engine: Arc<dyn Engine>,
        metrics: Arc<Metrics>,
        store: Arc<Store>,
        shutdown: CancellationToken,
    ) -> Result<Arc<Pools>> {
        std::fs::create_dir_all(config.data_dir.join("goldens"))
            .map_err(Error::io("creating goldens dir"))?;
        let loaded = targets::load(&config, &store)?;
        let configured = config
            .pools
            .iter()
            .map(|p| {
                let key = PoolKey {
                    template: p.template.clone(),
                    size: p.size.clone(),
                };
                (key, p.clone())
            })
            .collect();
        let pools = Arc::new(Pools {
            engine,
            metrics,
            config_hash: targets::config_hash(&config),
            store,
            config: config.clone(),
            configured,
            pools: Mutex::new(BTreeMap::new()),
            refill: Arc::new(Semaphore::new(config.refill_concurrency as usize)),
            pace: Arc::default(),
            on_demand: Arc::new(Semaphore::new(
                2 * std::thread::available_parallelism().map_or(1, |n| n.get()),
            )),
            shutdown,
            workers: Mutex::new(Vec::new()),
            warnings: loaded.warnings,
        });
        for t in loaded.targets.values() {
            pools.add_pool(t)?;
        }
        if loaded.rewrite {
            pools.save()?;
        }
        Ok(pools)
    }

    /// Counts an API request in flight until dropped: refill starts wait (briefly) for
    /// the node to have none.
    pub fn busy(&self) -> Busy {
        self.pace.busy()
    }

    /// Node-level warnings (config vs saved targets) for `/v1/info`.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The spec an engine needs for a key (any configured template and size; an unknown
    /// name is [`Error::UnknownName`]).
    pub fn spec(&self, key: &PoolKey) -> Result<GuestSpec> {
        let c = &self.config;
        c.check_pool_key(&key.template, &key.size)?;
        Ok(GuestSpec {
            template: key.template.clone(),
            size: key.size.clone(),
            template_config: c.templates[&key.template].clone(),
            size_config: c.sizes[&key.size].clone(),
            no_balloon: self.configured.get(key).is_some_and(|p| p.no_balloon),
            golden_dir: c
                .data_dir
                .join("goldens")
                .join(format!("{}.{}", key.template, key.size)),
        })
    }

    fn add_pool(self: &Arc<Self>, t: &api::PoolTarget) -> Result<()> {
        let key = PoolKey::of(t);
        let spec = self.spec(&key)?;
        let warmup = self.configured.get(&key).and_then(|p| p.warmup.clone());
        // A matching stamp (and artifacts) means the golden is still good: no rebuild.
        let stamp = self.reusable_stamp(&key, &spec, &warmup);
        let pool = Pool {
            spec,
            warmup,
            target: t.warm,
            warm_max: t.warm_max,
            idle: VecDeque::new(),
            golden: if stamp.is_some() {
                GoldenState::Ready
            } else {
                GoldenState::Missing
            },
            stamp,
            golden_error: None,
            builds: 0,
            refill_error: None,
            joined: Arc::new(Notify::new()),
            wake: Arc::new(Notify::new()),
        };
        self.pools
            .lock()
            .expect("pools lock")
            .insert(key.clone(), pool);
        let worker = tokio::spawn(self.clone().worker(key));
        self.workers.lock().expect("workers lock").push(worker);
        Ok(())
    }

    fn save(&self) -> Result<()> {
        targets::save(&self.store, &self.config_hash, self.targets())
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

    /// Applies `PUT /v1/pools`: validates the whole list first (the same check as the
    /// config's), then sets targets; pools absent from the list are drained. Persists the
    /// result.
    pub fn update(self: &Arc<Self>, update: api::PoolsUpdate) -> Result<Vec<api::PoolTarget>> {
        self.config.check_targets(&update.pools)?;
        let mut wanted: BTreeMap<PoolKey, api::PoolTarget> = update
            .pools
            .into_iter()
            .map(|t| (PoolKey::of(&t), t))
            .collect();
        {
            let mut pools = self.pools.lock().expect("pools lock");
            for (key, pool) in pools.iter_mut() {
                match wanted.remove(key) {
                    Some(t) => {
                        pool.target = t.warm;
                        pool.warm_max = t.warm_max;
                    }
                    None => pool.target = 0,
                }
                pool.wake.notify_one();
            }
        }
        // What is left names pools that do not exist yet.
        for t in wanted.values() {
            self.add_pool(t)?;
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

    /// For a claim that found the pool empty: waits for a start slot, or takes a guest
    /// that joins the pool first (a refill finishing meanwhile).
    pub async fn miss(&self, key: &PoolKey) -> Miss {
        let asked = std::time::Instant::now();
        let Some(joined) = self.with_pool(key, |p| p.joined.clone()) else {
            return Miss::Start(
                self.on_demand
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("never closed"),
            );
        };
        let miss = loop {
            let notified = joined.notified();
            tokio::pin!(notified);
            // Registered before the look, so a guest joining in between is not missed.
            notified.as_mut().enable();
            if let Some(g) = self.take_warm(key) {
                break Miss::Warm(g);
            }
            tokio::select! {
                p = self.on_demand.clone().acquire_owned() => {
                    break Miss::Start(p.expect("never closed"));
                }
                () = notified => {}
            }
        };
        self.metrics
            .admission_wait_seconds
            .get_or_create(&crate::metrics::WaitLabel { kind: "claim" })
            .observe(asked.elapsed().as_secs_f64());
        miss
    }

    /// Starts a guest and waits for silkd's `Info`.
    pub async fn start_ready(&self, spec: &GuestSpec) -> Result<Arc<dyn Guest>> {
        let started = std::time::Instant::now();
        let guest = self.engine.start(spec).await?;
        let bound = Duration::from_secs(self.config.boot_timeout_seconds);
        if let Err(e) = guest::info(&*guest, bound).await {
            guest.destroy().await;
            return Err(e);
        }
        let origin = OriginLabel {
            origin: guest.origin(),
        };
        self.metrics
            .start_seconds
            .get_or_create(&origin)
            .observe(started.elapsed().as_secs_f64());
        Ok(guest)
    }

    /// [`Pools::start_ready`] for a warm pool: a clone also runs `true` once before it
    /// is handed out. A VM clone starts with an empty TCG translation cache (and, on KVM,
    /// none of the golden's pages faulted in), so its first exec paid for translating
    /// silkd's spawn path and the kernel's fork/exec/exit (85 ms against 8 ms after, on
    /// this machine); the refill pays that now, off the claim path.
    async fn start_primed(&self, spec: &GuestSpec) -> Result<Arc<dyn Guest>> {
        let guest = self.start_ready(spec).await?;
        if guest.origin() != "clone" {
            return Ok(guest);
        }
        let bound = Duration::from_secs(self.config.boot_timeout_seconds);
        if let Err(e) = guest::run_checked(&*guest, &["true".to_string()], bound).await {
            guest.destroy().await;
            return Err(Error::Guest(format!("priming a clone: {e}")));
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
}
