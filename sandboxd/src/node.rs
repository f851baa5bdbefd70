//! The node: the shared state every request sees (config, engine, pools, claims, exec
//! limits, metrics) and the lifecycle operations that span them: claim, release, the TTL
//! reaper, and shutdown that destroys every sandbox.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::auth::Auth;
use crate::claims::{now_ms, Claims, Sandbox};
use crate::config::{Config, EngineKind};
use crate::engine::process::ProcessEngine;
use crate::engine::qemu::QemuEngine;
use crate::engine::{Engine, Guest};
use crate::error::{Error, Result};
use crate::exec::Execs;
use crate::metrics::{Metrics, SourceLabel};
use crate::pool::{PoolKey, Pools};

/// How often the TTL reaper looks for expired sandboxes.
const REAP_EVERY: Duration = Duration::from_millis(200);

/// Everything a request handler needs.
pub struct Node {
    /// The validated config.
    pub config: Arc<Config>,
    /// The engine.
    pub engine: Arc<dyn Engine>,
    /// Warm pools and goldens.
    pub pools: Arc<Pools>,
    /// Claimed sandboxes.
    pub claims: Claims,
    /// Tokens.
    pub auth: Auth,
    /// Buffered exec limits.
    pub execs: Arc<Execs>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    shutdown: CancellationToken,
}

/// A served claim and how long it took.
pub struct Claimed {
    /// The answer.
    pub response: api::ClaimResponse,
    /// Server time spent.
    pub elapsed: Duration,
}

impl Node {
    /// Builds the engine, pools (their workers start now) and the TTL reaper.
    pub fn start(config: Config) -> Result<Arc<Node>> {
        let config = Arc::new(config);
        let data_dir = &config.data_dir;
        let spill_dir = data_dir.join("spill");
        std::fs::create_dir_all(&spill_dir)
            .map_err(Error::io(format!("creating {}", spill_dir.display())))?;
        let engine: Arc<dyn Engine> = match config.engine {
            EngineKind::Process => Arc::new(ProcessEngine::new(
                config.process.bwrap.clone(),
                config.silkd_path(),
                data_dir,
                &config.process.cgroup_root,
                Duration::from_secs(config.boot_timeout_seconds),
            )?),
            EngineKind::Qemu => Arc::new(QemuEngine::new(
                &config.qemu,
                data_dir,
                &config.process.cgroup_root,
                Duration::from_secs(config.boot_timeout_seconds),
                config.templates.values().find_map(|t| t.image.clone()),
            )?),
        };
        let metrics = Arc::new(Metrics::new());
        let shutdown = CancellationToken::new();
        let pools = Pools::start(
            config.clone(),
            engine.clone(),
            metrics.clone(),
            shutdown.child_token(),
        )?;
        let tenant_max = config
            .tenants
            .iter()
            .map(|t| (t.name.clone(), t.max_claims))
            .collect();
        let node = Arc::new(Node {
            claims: Claims::new(config.max_claims, tenant_max),
            auth: Auth::new(&config),
            execs: Arc::new(Execs::new(&config.exec, spill_dir, metrics.clone())),
            config,
            engine,
            pools,
            metrics,
            shutdown,
        });
        tokio::spawn(node.clone().reaper());
        Ok(node)
    }

    /// Claims a sandbox: reserve a slot (429), take a warm guest whose engine has not
    /// recorded its death (no round trip: it answered `Info` when it joined the pool),
    /// else start one on demand.
    pub async fn claim(&self, tenant: Option<&str>, req: api::ClaimRequest) -> Result<Claimed> {
        let started = Instant::now();
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        let (default_template, default_size) = self.config.default_key();
        let key = PoolKey {
            template: req.template.unwrap_or(default_template),
            size: req.size.unwrap_or(default_size),
        };
        let spec = self.pools.spec(&key)?;
        let ttl = req.ttl_seconds.unwrap_or(self.config.default_ttl_seconds);
        if ttl == 0 {
            return Err(Error::BadRequest("ttl_seconds must be positive".into()));
        }
        let ttl = ttl.min(self.config.max_ttl_seconds);
        let slot = self.claims.reserve(tenant)?;
        let mut source = "warm";
        // A warm guest answered `Info` when it joined the pool; its fate reports a death
        // since then without a round trip, which keeps this path well under a millisecond.
        let guest: Arc<dyn Guest> = loop {
            match self.pools.take_warm(&key) {
                Some(g) => match g.failure() {
                    None => break g,
                    Some(e) => {
                        tracing::warn!(guest = g.id(), "warm guest died while idle: {e}");
                        g.destroy().await;
                    }
                },
                None => {
                    let g = self.pools.start_ready(&spec).await?;
                    source = g.origin();
                    break g;
                }
            }
        };
        if self.shutdown.is_cancelled() {
            guest.destroy().await;
            return Err(Error::ShuttingDown);
        }
        let (sandbox, token) =
            self.claims
                .insert(slot, key.template, key.size, now_ms() + ttl * 1000, guest);
        self.metrics.sandboxes.set(self.claims.active() as i64);
        let label = SourceLabel { source };
        self.metrics.claims.get_or_create(&label).inc();
        let elapsed = started.elapsed();
        self.metrics
            .claim_seconds
            .get_or_create(&label)
            .observe(elapsed.as_secs_f64());
        tracing::info!(id = %sandbox.id, source, ?elapsed, "claimed");
        Ok(Claimed {
            response: api::ClaimResponse {
                id: sandbox.id.clone(),
                token,
                deadline: sandbox.deadline(),
            },
            elapsed,
        })
    }

    /// Releases a sandbox: unregisters it and destroys its guest. 404 when unknown.
    pub async fn release(&self, id: &str) -> Result<()> {
        let sandbox = self.claims.remove(id).ok_or(Error::NotFound)?;
        self.metrics.sandboxes.set(self.claims.active() as i64);
        sandbox.guest.destroy().await;
        tracing::info!(id, "released");
        Ok(())
    }

    /// A claimed sandbox, or 404.
    pub fn sandbox(&self, id: &str) -> Result<Arc<Sandbox>> {
        self.claims.get(id).ok_or(Error::NotFound)
    }

    /// Moves a deadline to now + `ttl_seconds` (clamped); returns it.
    pub fn renew(&self, sandbox: &Sandbox, ttl_seconds: u64) -> Result<u64> {
        if ttl_seconds == 0 {
            return Err(Error::BadRequest("ttl_seconds must be positive".into()));
        }
        let ttl = ttl_seconds.min(self.config.max_ttl_seconds);
        Ok(self.claims.renew(sandbox, ttl * 1000))
    }

    /// `/v1/info`.
    pub fn info(&self) -> api::InfoResponse {
        let c = &self.config;
        api::InfoResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            engine: self.engine.info(),
            claims: api::ClaimsInfo {
                active: self.claims.active(),
                max: c.max_claims,
            },
            limits: api::LimitsInfo {
                default_ttl_seconds: c.default_ttl_seconds,
                max_ttl_seconds: c.max_ttl_seconds,
                max_output_bytes: c.exec.max_output_bytes,
                memory_budget_bytes: c.exec.memory_budget_bytes,
                max_in_flight: c.exec.max_in_flight,
            },
            pools: self.pools.info(),
            warnings: self.pools.warnings().to_vec(),
        }
    }

    /// Destroys sandboxes past their deadline (their running commands die with them).
    async fn reaper(self: Arc<Self>) {
        let mut tick = tokio::time::interval(REAP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.shutdown.cancelled() => return,
            }
            for id in self.claims.expired(now_ms()) {
                if let Some(sandbox) = self.claims.remove(&id) {
                    tracing::info!(%id, "deadline passed; destroying");
                    self.metrics.expired.inc();
                    self.metrics.sandboxes.set(self.claims.active() as i64);
                    sandbox.guest.destroy().await;
                }
            }
        }
    }

    /// Stops pools and the reaper, then destroys every sandbox, idle or claimed.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.pools.shutdown().await;
        let claimed: Vec<_> = self
            .claims
            .list(None)
            .into_iter()
            .filter_map(|s| self.claims.remove(&s.id))
            .collect();
        futures::future::join_all(claimed.iter().map(|s| s.guest.destroy())).await;
        self.metrics.sandboxes.set(0);
        self.engine.shutdown();
        tracing::info!(destroyed = claimed.len(), "all sandboxes destroyed");
    }
}
