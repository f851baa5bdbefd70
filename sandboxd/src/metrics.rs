//! Prometheus metrics (prometheus-client): one registry, the handles other modules bump,
//! and the text encoding served at `GET /metrics`.

use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Label set naming where a claimed sandbox came from.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// The claim tier: `warm` (taken from the pool), `clone` (restored from a golden on
    /// demand) or `cold` (booted on demand).
    pub source: &'static str,
}

/// Label set of an HTTP status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    /// Numeric status.
    pub status: u16,
}

/// Label set of a pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// `template/size`.
    pub pool: String,
}

/// Label set of a connection timeout.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TimeoutLabel {
    /// `header`, `idle` or `write` (body timeouts are answered 408 and counted by route).
    pub kind: &'static str,
}

/// Label set of a guest start: how the guest was made.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OriginLabel {
    /// `clone` (restored from a golden) or `cold` (booted; every process-engine start).
    pub origin: &'static str,
}

/// Label set of an admission wait.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabel {
    /// What waited: `start` (a refill's guest start waiting for a moment without
    /// requests in flight, at most 250 ms, then for one of the node's refill permits), or
    /// `claim` (a claim that found its pool empty, waiting for one of the on-demand start
    /// slots, twice the cores, or for a guest to join the pool). Past their limits claims
    /// and buffered execs do not queue: they are refused at once (429, 503 with
    /// `Retry-After`).
    pub kind: &'static str,
}

/// Histogram buckets for request-scale latencies: 50 µs to about 6.5 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
}

/// Histogram buckets for golden builds: 0.25 s to about 34 min.
fn build_time() -> Histogram {
    Histogram::new(exponential_buckets(0.25, 2.0, 14))
}

/// Every metric sandboxd exports.
pub struct Metrics {
    registry: Registry,
    /// Claims served, by source.
    pub claims: Family<SourceLabel, Counter>,
    /// Server time of a claim, by source.
    pub claim_seconds: Family<SourceLabel, Histogram, fn() -> Histogram>,
    /// Claimed sandboxes now.
    pub sandboxes: Gauge,
    /// Sandboxes destroyed by the TTL reaper.
    pub expired: Counter,
    /// Buffered execs answered, by status.
    pub execs: Family<StatusLabel, Counter>,
    /// Server time of a buffered exec (admitted to answer head), by status.
    pub exec_seconds: Family<StatusLabel, Histogram, fn() -> Histogram>,
    /// Buffered execs in flight.
    pub exec_in_flight: Gauge,
    /// Bytes of buffered output held in memory now (bounded by `memory_budget_bytes`).
    pub exec_buffered_bytes: Gauge,
    /// Raw output bytes that went to spill files.
    pub exec_spilled_bytes: Counter,
    /// Idle sandboxes per pool.
    pub pool_warm: Family<PoolLabel, Gauge>,
    /// Golden builds per pool (successful or not).
    pub golden_builds: Family<PoolLabel, Counter>,
    /// Relays opened.
    pub relays: Counter,
    /// Relays open now.
    pub relays_open: Gauge,
    /// Relay setup: relay slot taken and the guest dialled, before the 101.
    pub relay_setup_seconds: Histogram,
    /// A guest started to answering `Info` (a clone, a cold boot, a process start), for
    /// claim misses and refills alike, by origin.
    pub start_seconds: Family<OriginLabel, Histogram, fn() -> Histogram>,
    /// Golden builds (boot, `Info`, warmup, seal, stamp), by pool, failed ones included.
    pub golden_build_seconds: Family<PoolLabel, Histogram, fn() -> Histogram>,
    /// Time spent waiting to be admitted, by kind.
    pub admission_wait_seconds: Family<WaitLabel, Histogram, fn() -> Histogram>,
    /// HTTP connections open now, relays included.
    pub http_connections: Gauge,
    /// Connections refused at `[http] max_connections`.
    pub http_refused: Counter,
    /// Connections closed by a timeout, by kind.
    pub http_timeouts: Family<TimeoutLabel, Counter>,
    /// Request bodies not complete within `body_timeout_seconds` (answered 408).
    pub http_body_timeouts: Counter,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("sandboxd");
        let claims = Family::<SourceLabel, Counter>::default();
        registry.register("claims", "Claims served", claims.clone());
        let claim_seconds =
            Family::<SourceLabel, Histogram>::new_with_constructor(latency as fn() -> Histogram);
        registry.register(
            "claim_seconds",
            "Server time of a claim",
            claim_seconds.clone(),
        );
        let sandboxes = Gauge::default();
        registry.register("sandboxes", "Claimed sandboxes", sandboxes.clone());
        let expired = Counter::default();
        registry.register(
            "expired",
            "Sandboxes destroyed at their deadline",
            expired.clone(),
        );
        let execs = Family::<StatusLabel, Counter>::default();
        registry.register("execs", "Buffered execs answered", execs.clone());
        let exec_seconds =
            Family::<StatusLabel, Histogram>::new_with_constructor(latency as fn() -> Histogram);
        registry.register(
            "exec_seconds",
            "Server time of a buffered exec, by status",
            exec_seconds.clone(),
        );
        let exec_in_flight = Gauge::default();
        registry.register(
            "exec_in_flight",
            "Buffered execs in flight",
            exec_in_flight.clone(),
        );
        let exec_buffered_bytes = Gauge::default();
        registry.register(
            "exec_buffered_bytes",
            "Buffered exec output held in memory",
            exec_buffered_bytes.clone(),
        );
        let exec_spilled_bytes = Counter::default();
        registry.register(
            "exec_spilled_bytes",
            "Buffered exec output written to spill files",
            exec_spilled_bytes.clone(),
        );
        let pool_warm = Family::<PoolLabel, Gauge>::default();
        registry.register("pool_warm", "Idle sandboxes per pool", pool_warm.clone());
        let golden_builds = Family::<PoolLabel, Counter>::default();
        registry.register(
            "golden_builds",
            "Golden builds per pool",
            golden_builds.clone(),
        );
        let relays = Counter::default();
        registry.register("relays", "Relays opened", relays.clone());
        let relays_open = Gauge::default();
        registry.register("relays_open", "Relays open now", relays_open.clone());
        let relay_setup_seconds = latency();
        registry.register(
            "relay_setup_seconds",
            "Relay setup: slot taken and guest dialled",
            relay_setup_seconds.clone(),
        );
        let start_seconds =
            Family::<OriginLabel, Histogram>::new_with_constructor(latency as fn() -> Histogram);
        registry.register(
            "start_seconds",
            "Guest start to Info answered, by origin",
            start_seconds.clone(),
        );
        let golden_build_seconds =
            Family::<PoolLabel, Histogram>::new_with_constructor(build_time as fn() -> Histogram);
        registry.register(
            "golden_build_seconds",
            "Golden builds, by pool",
            golden_build_seconds.clone(),
        );
        let admission_wait_seconds =
            Family::<WaitLabel, Histogram>::new_with_constructor(latency as fn() -> Histogram);
        registry.register(
            "admission_wait_seconds",
            "Time spent waiting to be admitted, by kind",
            admission_wait_seconds.clone(),
        );
        let http_connections = Gauge::default();
        registry.register(
            "http_connections",
            "HTTP connections open, relays included",
            http_connections.clone(),
        );
        let http_refused = Counter::default();
        registry.register(
            "http_refused",
            "Connections refused at max_connections",
            http_refused.clone(),
        );
        let http_timeouts = Family::<TimeoutLabel, Counter>::default();
        registry.register(
            "http_timeouts",
            "Connections closed by a timeout",
            http_timeouts.clone(),
        );
        let http_body_timeouts = Counter::default();
        registry.register(
            "http_body_timeouts",
            "Request bodies not complete in time (408)",
            http_body_timeouts.clone(),
        );
        Metrics {
            registry,
            claims,
            claim_seconds,
            sandboxes,
            expired,
            execs,
            exec_seconds,
            exec_in_flight,
            exec_buffered_bytes,
            exec_spilled_bytes,
            pool_warm,
            golden_builds,
            relays,
            relays_open,
            relay_setup_seconds,
            start_seconds,
            golden_build_seconds,
            admission_wait_seconds,
            http_connections,
            http_refused,
            http_timeouts,
            http_body_timeouts,
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
