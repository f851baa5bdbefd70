//! The node: the shared state every request sees (config, engine, pools, claims, the
//! state database, exec limits, metrics) and the lifecycle operations that span them:
//! start (re-adopting what the database records), claim, release, renew, the TTL reaper,
//! and shutdown (`on_stop`: keep claimed sandboxes for the next start, or destroy them).
//! Every change a response reports is committed to the database before it is answered.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::Auth;
use crate::claims::{now_ms, Claims, Sandbox};
use crate::config::{Config, EngineKind, OnStop};
use crate::engine::process::ProcessEngine;
use crate::engine::qemu::QemuEngine;
use crate::engine::{Engine, Guest};
use crate::error::{Error, Result};
use crate::exec::Execs;
use crate::metrics::{Metrics, SourceLabel};
use crate::pool::{Miss, PoolKey, Pools};
use crate::relay::Relays;
use crate::store::{ClaimRecord, Store};

/// How often the TTL reaper looks for expired sandboxes.
const REAP_EVERY: Duration = Duration::from_millis(200);
/// Expired snapshots are looked for every this many reaper ticks (a database query).
const SNAPSHOT_EXPIRY_TICKS: u64 = 25;

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
    /// Open relays per sandbox.
    pub relays: Arc<Relays>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The state database.
    pub store: Arc<Store>,
    /// How long start-up reconciliation took and what it found (for logs and benches).
    pub reconciled: crate::reconcile::Reconciled,
    /// One snapshot written at a time (its quota check and write are one step).
    pub(crate) snapshot_lock: tokio::sync::Mutex<()>,
    /// `[cluster]`: set once, right after start, when configured.
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    shutdown: CancellationToken,
    reaper: Mutex<Option<JoinHandle<()>>>,
    /// Released sandboxes' teardowns (reap, cgroup, files), off the answer's path;
    /// `shutdown` waits for them.
    teardowns: TaskTracker,
}

/// A served claim and how long it took.
pub struct Claimed {
    /// The answer.
    pub response: api::ClaimResponse,
    /// Server time spent.
    pub elapsed: Duration,
}

impl Node {
    /// Opens the state database, builds the engine, re-adopts the recorded sandboxes and
    /// sweeps the rest, then starts pools (their workers start now) and the TTL reaper.
    pub async fn start(config: Config) -> Result<Arc<Node>> {
        let config = Arc::new(config);
        let data_dir = &config.data_dir;
        // The API's own socket may live there too.
        let socket = match config.listen_addr()? {
            crate::config::ListenAddr::Unix(path) if path.parent() == Some(data_dir) => {
                path.file_name().map(|n| n.to_string_lossy().into_owned())
            }
            _ => None,
        };
        private_data_dir(data_dir, socket.as_deref())?;
        let store = Arc::new(Store::open(data_dir)?);
        let spill_dir = data_dir.join("spill");
        std::fs::create_dir_all(&spill_dir)
            .map_err(Error::io(format!("creating {}", spill_dir.display())))?;
        let engine: Arc<dyn Engine> = match config.engine {
            EngineKind::Process => Arc::new(ProcessEngine::new(
                &config.process,
                config.silkd_path(),
                data_dir,
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
        let mut reconciled =
            crate::reconcile::reconcile(&*engine, &store, &data_dir.join("hibernated")).await?;
        let metrics = Arc::new(Metrics::new());
        let shutdown = CancellationToken::new();
        let pools = Pools::start(
            config.clone(),
            engine.clone(),
            metrics.clone(),
            store.clone(),
            shutdown.child_token(),
        )?;
        let tenant_max = config
            .tenants
            .iter()
            .map(|t| (t.name.clone(), t.max_claims))
            .collect();
        let claims = Claims::new(config.max_claims, tenant_max);
        for (rec, guest) in std::mem::take(&mut reconciled.adopted) {
            let sandbox = claims.adopt(&rec, guest);
            sandbox.set_power(rec.hibernated, None);
        }
        metrics.sandboxes.set(claims.active() as i64);
        let node = Arc::new(Node {
            claims,
            auth: Auth::new(&config),
            execs: Arc::new(Execs::new(&config.exec, spill_dir, metrics.clone())),
            relays: Relays::new(config.http.max_relays_per_sandbox, metrics.clone()),
            config,
            engine,
            pools,
            metrics,
            store,
            reconciled,
            snapshot_lock: tokio::sync::Mutex::new(()),
            cluster: std::sync::OnceLock::new(),
            shutdown,
            reaper: Mutex::new(None),
            teardowns: TaskTracker::new(),
        });
        node.sweep_orphan_files();
        let reaper = tokio::spawn(node.clone().reaper());
        *node.reaper.lock().expect("reaper lock") = Some(reaper);
        Ok(node)
    }

    /// Claims a sandbox: reserve a slot (429), take a warm guest whose engine has not
    /// recorded its death (no round trip: it answered `Info` when it joined the pool),
    /// else start one on demand.
    pub async fn claim(&self, tenant: Option<&str>, mut req: api::ClaimRequest) -> Result<Claimed> {
        let started = Instant::now();
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        if let Some(snapshot) = req.snapshot.take() {
            return self.fork(tenant, &snapshot, req, started).await;
        }
        let (default_template, default_size) = self.config.default_key();
        let key = PoolKey {
            template: req.template.unwrap_or(default_template),
            size: req.size.unwrap_or(default_size),
        };
        let spec = self.pools.spec(&key)?;
        let ttl = self.claim_ttl(req.ttl_seconds)?;
        let slot = self.claims.reserve(tenant)?;
        let mut source = "warm";
        // A warm guest answered `Info` when it joined the pool; its fate reports a death
        // since then without a round trip, which keeps this path well under a millisecond.
        let guest: Arc<dyn Guest> = loop {
            let warm = match self.pools.take_warm(&key) {
                Some(g) => g,
                None => match self.pools.miss(&key).await {
                    Miss::Warm(g) => g,
                    Miss::Start(_slot) => {
                        let g = self.pools.start_ready(&spec).await?;
                        source = g.origin();
                        break g;
                    }
                },
            };
            match warm.failure() {
                None => break warm,
                Some(e) => {
                    tracing::warn!(guest = warm.id(), "warm guest died while idle: {e}");
                    warm.destroy().await;
                }
            }
        };
        self.register(slot, key, ttl, guest, source, started).await
    }

    /// Records a claimed guest in `slot` (committed before the answer) and answers it.
    pub(crate) async fn register(
        &self,
        slot: crate::claims::Slot<'_>,
        key: PoolKey,
        ttl: u64,
        guest: Arc<dyn Guest>,
        source: &'static str,
        started: Instant,
    ) -> Result<Claimed> {
        if self.shutdown.is_cancelled() {
            guest.destroy().await;
            return Err(Error::ShuttingDown);
        }
        let (sandbox, token) =
            self.claims
                .insert(slot, key.template, key.size, now_ms() + ttl * 1000, guest);
        let record = ClaimRecord {
            id: sandbox.id.clone(),
            token_sha256: sandbox.token_sha256,
            tenant: sandbox.tenant.clone(),
            template: sandbox.template.clone(),
            size: sandbox.size.clone(),
            deadline_ms: sandbox
                .deadline_ms
                .load(std::sync::atomic::Ordering::SeqCst),
            handle: sandbox.guest().handle(),
            hibernated: false,
        };
        if let Err(e) = self.store.put_claim(&record) {
            // Unrecorded, the claim would not survive a restart: refuse it whole.
            self.claims.remove(&sandbox.id);
            sandbox.guest().destroy().await;
            return Err(e);
        }
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

    /// A claim's lifetime: `default_ttl_seconds` when absent, clamped; 0 is refused.
    pub(crate) fn claim_ttl(&self, asked: Option<u64>) -> Result<u64> {
        let ttl = asked.unwrap_or(self.config.default_ttl_seconds);
        if ttl == 0 {
            return Err(Error::BadRequest("ttl_seconds must be positive".into()));
        }
        Ok(ttl.min(self.config.max_ttl_seconds))
    }

    /// Releases a sandbox: deletes its record, unregisters it and kills its guest, then
    /// answers; the teardown (waiting for the kernel to reap the guest, which took 3–20 ms
    /// of a 15 ms time-to-interactive here, then its cgroup, files and any hibernation
    /// files) runs in the background, and `shutdown` waits for it. 404 when unknown.
    pub async fn release(&self, id: &str) -> Result<()> {
        self.claims.get(id).ok_or(Error::NotFound)?;
        self.store.delete_claim(id)?;
        let sandbox = self.claims.remove(id).ok_or(Error::NotFound)?;
        self.metrics.sandboxes.set(self.claims.active() as i64);
        sandbox.guest().kill();
        let hibernated = self.hibernation_of(id);
        let id = id.to_string();
        self.teardowns.spawn(async move {
            sandbox.guest().destroy().await;
            if let Some(dir) = hibernated {
                crate::hibernate::remove_hibernation(&id, &dir);
            }
            tracing::info!(id, "released");
        });
        Ok(())
    }

    /// A claimed sandbox, or 404.
    pub fn sandbox(&self, id: &str) -> Result<Arc<Sandbox>> {
        self.claims.get(id).ok_or(Error::NotFound)
    }

    /// Moves a deadline to now + `ttl_seconds` (clamped); returns it. 404 when the
    /// sandbox was released or reaped meanwhile.
    pub fn renew(&self, sandbox: &Sandbox, ttl_seconds: u64) -> Result<u64> {
        if ttl_seconds == 0 {
            return Err(Error::BadRequest("ttl_seconds must be positive".into()));
        }
        let ttl = ttl_seconds.min(self.config.max_ttl_seconds);
        let deadline = self
            .claims
            .renew(sandbox, ttl * 1000)
            .ok_or(Error::NotFound)?;
        self.store.set_deadline(&sandbox.id, || {
            sandbox
                .deadline_ms
                .load(std::sync::atomic::Ordering::SeqCst)
        })?;
        Ok(deadline)
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

    /// Destroys sandboxes past their deadline (their running commands die with them), each
    /// in its own task on `teardowns`, as a release does: one slow destroy delays no other,
    /// nor the next look at the clock, and `shutdown` waits for the ones under way.
    async fn reaper(self: Arc<Self>) {
        let mut tick = tokio::time::interval(REAP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks = 0u64;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.shutdown.cancelled() => break,
            }
            ticks += 1;
            if ticks.is_multiple_of(SNAPSHOT_EXPIRY_TICKS) {
                self.expire_snapshots();
            }
            for sandbox in self.claims.take_expired(now_ms()) {
                tracing::info!(id = %sandbox.id, "deadline passed; destroying");
                self.metrics.expired.inc();
                if let Err(e) = self.store.delete_claim(&sandbox.id) {
                    // Left in the database, the next start reaps it as expired.
                    tracing::warn!(id = %sandbox.id, "cannot delete the expired claim: {e}");
                }
                self.drop_hibernation(&sandbox.id);
                self.teardowns
                    .spawn(async move { sandbox.guest().destroy().await });
            }
            self.metrics.sandboxes.set(self.claims.active() as i64);
        }
    }

    /// Stops pools and the reaper and destroys every idle guest; then, by `on_stop`,
    /// leaves every claimed sandbox that can be re-adopted running (`keep`) or destroys
    /// them all and deletes their records (`destroy`); last, waits for the teardowns of
    /// released and expired sandboxes under way, so none is cut short.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let reaper = self.reaper.lock().expect("reaper lock").take();
        if let Some(reaper) = reaper {
            let _ = reaper.await;
        }
        self.pools.shutdown().await;
        let claimed: Vec<_> = self
            .claims
            .list(None)
            .into_iter()
            .filter_map(|s| self.claims.remove(&s.id))
            .collect();
        let keep = self.config.on_stop == OnStop::Keep;
        let (kept, doomed): (Vec<_>, Vec<_>) = claimed.into_iter().partition(|s| {
            // A hibernated sandbox's files and record are all it is: kept as they are.
            keep && (s.is_hibernated() || s.guest().handle().is_some() && s.failure().is_none())
        });
        for s in &kept {
            s.guest().leave_running();
        }
        for s in &doomed {
            if let Err(e) = self.store.delete_claim(&s.id) {
                tracing::warn!(id = %s.id, "cannot delete the claim's record: {e}");
            }
            self.drop_hibernation(&s.id);
        }
        futures::future::join_all(
            doomed
                .iter()
                .map(|s| async move { s.guest().destroy().await }),
        )
        .await;
        self.teardowns.close();
        self.teardowns.wait().await;
        self.metrics.sandboxes.set(0);
        self.engine.shutdown(!kept.is_empty());
        tracing::info!(
            kept = kept.len(),
            destroyed = doomed.len(),
            "claimed sandboxes kept running for the next start, or destroyed"
        );
    }
}

/// Creates `data_dir` readable by sandboxd's user only (0700): it holds every sandbox's
/// socket and files, the goldens and the spill files. One that exists with a wider mode
/// is tightened, with a warning, when it is ours (owned by our user and holding only what
/// sandboxd puts there, `socket` being the API's own socket); anything else is refused rather than chmod-ed, so that a
/// mistaken `data_dir = "/var"` or `"/tmp"` never changes a directory others rely on.
fn private_data_dir(dir: &Path, socket: Option<&str>) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    /// What sandboxd and its engines create directly in `data_dir`.
    const OURS: &[&str] = &[
        "spill",
        "snapshots",
        "hibernated",
        "goldens",
        "sandboxes",
        "qemu",
        "pools.json",
        "pools.tmp",
        "state.db",
        "state.db-wal",
        "state.db-shm",
    ];
    let io = |what: &str| Error::io(format!("{what} {}", dir.display()));
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io("creating"))?;
    }
    let meta = std::fs::metadata(dir).map_err(io("reading"))?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let owner_is_us = meta.uid() == nix::unistd::geteuid().as_raw();
    let foreign: Vec<String> = std::fs::read_dir(dir)
        .map_err(io("listing"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !OURS.contains(&name.as_str()) && Some(name.as_str()) != socket)
        .collect();
    if !owner_is_us || !foreign.is_empty() || mode & 0o1000 != 0 {
        return Err(Error::Config(format!(
            "data_dir {} has mode {mode:04o} and is not sandboxd's own directory (owner uid \
             {}, other entries: {foreign:?}); use a dedicated directory, or `chmod 700` it",
            dir.display(),
            meta.uid()
        )));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io("tightening"))?;
    tracing::warn!(
        "data_dir {} had mode {mode:04o}; tightened to 0700 (it holds sandboxes' sockets \
         and files)",
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn data_dir_is_created_private_and_ours_is_tightened() {
        let tmp = tempfile::tempdir().unwrap();
        let fresh = tmp.path().join("a/data");
        private_data_dir(&fresh, None).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        // An old, open data dir of ours (with the API's socket) is tightened.
        std::fs::create_dir(fresh.join("spill")).unwrap();
        std::fs::write(fresh.join("api.sock"), b"").unwrap();
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_data_dir(&fresh, Some("api.sock")).unwrap();
        assert_eq!(mode(&fresh), 0o700);
    }

    #[test]
    fn a_shared_open_directory_is_refused_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::write(shared.join("someone-elses"), b"").unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = private_data_dir(&shared, None).unwrap_err();
        assert!(e.to_string().contains("someone-elses"), "{e}");
        assert_eq!(mode(&shared), 0o755);
        let sticky = tmp.path().join("tmp");
        std::fs::create_dir(&sticky).unwrap();
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(private_data_dir(&sticky, None).is_err());
        assert_eq!(mode(&sticky), 0o1777);
    }
}
