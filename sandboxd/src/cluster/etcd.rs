//! What the cluster keeps in etcd, and the only code that talks to it: the key layout,
//! node records under each node's lease, ownership records, and tenant claim slots
//! counted in a transaction. Every call is bounded by the client's request timeout, and
//! every failure becomes one 503 with `Retry-After` (the detail goes to the log).
//!
//! Keys, under `[cluster] prefix` (`P`):
//! - `P/nodes/NAME`: the node's [`NodeRecord`] (JSON), attached to its lease.
//! - `P/sandboxes/ID`: an [`OwnerRecord`], no lease: it outlives its node, so a dead
//!   node's sandboxes answer "lost" rather than "unknown".
//! - `P/tenants/TENANT/SLOT`: one claimed sandbox of the tenant, on its owner's lease
//!   (a dead node's slots free themselves); counted under `P/quota/TENANT`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use api::cluster::NodeRecord;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp,
};
use serde::{Deserialize, Serialize};

use super::config::ClusterConfig;
use crate::error::{Error, Result};

/// Bound on one etcd call: past it etcd counts as unreachable (quorum lost or no member
/// answering) and the call answers 503.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Quota transactions retried when another claim for the same tenant won the race.
const QUOTA_TRIES: usize = 16;

/// Who owns a sandbox, recorded at claim time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    /// The owner's node name.
    pub node: String,
    /// The tenant that claimed it, if not root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Its tenant slot key's last segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
}

/// One client per etcd endpoint, the one that answered last, and the key prefix. The
/// client's own balancing keeps sending to a member that refuses connections, so a call
/// that finds its member unavailable moves on to the next (one member down must change
/// nothing).
pub struct Etcd {
    clients: Vec<Client>,
    current: AtomicUsize,
    prefix: String,
}

/// Whether another member may answer where this one did not: it refused or dropped the
/// connection, or has no leader at the moment. Not a timeout: a member that is up but
/// without quorum times out, and so would the others.
fn try_another(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(s) => s.code() == tonic::Code::Unavailable,
        _ => false,
    }
}

/// An etcd failure with its causes (`transport error: ...: invalid peer certificate:
/// UnknownIssuer`): tonic's own text says only "transport error", leaving an operator
/// guessing at a TLS misconfiguration.
pub fn detail(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::TransportError(t) => format!("transport error: {}", chain(t)),
        etcd_client::Error::GRpcStatus(s) => {
            let mut text = format!("{:?}: {}", s.code(), s.message());
            let mut source = std::error::Error::source(s);
            while let Some(e) = source {
                append(&mut text, e);
                source = e.source();
            }
            text
        }
        e => e.to_string(),
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        append(&mut text, s);
        source = s.source();
    }
    text
}

/// Appends a cause's text unless it is already there (tonic repeats its causes).
fn append(text: &mut String, cause: &dyn std::error::Error) {
    let more = cause.to_string();
    if !text.contains(&more) {
        text.push_str(": ");
        text.push_str(&more);
    }
}

/// An etcd failure as the API answers it.
pub fn unreachable(what: &str, e: impl std::fmt::Display) -> Error {
    tracing::warn!("etcd: {what}: {e}");
    Error::Busy {
        reason: format!("the cluster's store (etcd) is unreachable ({what}); retry shortly"),
        retry_after: 2,
    }
}

impl Etcd {
    /// A client per endpoint; connections are made lazily, on the first call.
    pub async fn connect(config: &ClusterConfig) -> Result<Etcd> {
        let mut options = ConnectOptions::new()
            .with_timeout(CALL_TIMEOUT)
            .with_connect_timeout(CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), CALL_TIMEOUT);
        if let (Some(u), Some(p)) = (&config.etcd_user, &config.etcd_password) {
            options = options.with_user(u.clone(), p.clone());
        }
        if let Some(tls) = super::tls::options(config)? {
            options = options.with_tls(tls);
        }
        let mut clients = Vec::new();
        for endpoint in &config.etcd {
            let client = Client::connect([endpoint], Some(options.clone()))
                .await
                .map_err(|e| Error::Config(format!("[cluster] etcd endpoint {endpoint:?}: {e}")))?;
            clients.push(client);
        }
        if config.etcd_ca.is_some() {
            super::tls::check(config, &clients).await?;
        }
        Ok(Etcd {
            clients,
            current: AtomicUsize::new(0),
            prefix: config.prefix.clone(),
        })
    }

    /// Runs `op` on the member that answered last, moving on to the next one while a
    /// member is unavailable.
    async fn call<T, F, Fut>(&self, what: &str, op: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let n = self.clients.len();
        let first = self.current.load(Ordering::Relaxed);
        let mut last = None;
        for k in 0..n {
            let i = (first + k) % n;
            match op(self.clients[i].clone()).await {
                Ok(v) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(e) if try_another(&e) => last = Some(e),
                Err(e) => return Err(unreachable(what, detail(&e))),
            }
        }
        Err(unreachable(
            what,
            last.map_or("no endpoint".to_string(), |e| detail(&e)),
        ))
    }

    fn node_key(&self, name: &str) -> String {
        format!("{}/nodes/{name}", self.prefix)
    }

    fn owner_key(&self, id: &str) -> String {
        format!("{}/sandboxes/{id}", self.prefix)
    }

    fn tenant_prefix(&self, tenant: &str) -> String {
        format!("{}/tenants/{tenant}/", self.prefix)
    }

    fn guard_key(&self, tenant: &str) -> String {
        format!("{}/quota/{tenant}", self.prefix)
    }

    /// A new lease of `ttl` seconds.
    pub async fn grant(&self, ttl: u64) -> Result<i64> {
        let r = self
            .call("granting a lease", async |mut c| {
                c.lease_grant(ttl as i64, None).await
            })
            .await?;
        Ok(r.id())
    }

    /// Revokes a lease: its node record and tenant slots go at once.
    pub async fn revoke(&self, lease: i64) {
        let _ = self
            .call("revoking the lease", async |mut c| {
                c.lease_revoke(lease).await
            })
            .await;
    }

    /// Keeps `lease` alive once; the TTL left (0: the lease is gone).
    pub async fn keep_alive(&self, lease: i64) -> Result<i64> {
        let answer = self
            .call("keep-alive", async |mut c| {
                let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                match tokio::time::timeout(CALL_TIMEOUT, stream.message()).await {
                    Ok(answer) => answer,
                    Err(_) => Err(etcd_client::Error::LeaseKeepAliveError("no answer".into())),
                }
            })
            .await?;
        Ok(answer.map_or(0, |a| a.ttl()))
    }

    /// Writes this node's record under its lease.
    pub async fn put_node(&self, record: &NodeRecord, lease: i64) -> Result<()> {
        let value = serde_json::to_vec(record).expect("records serialize");
        let key = self.node_key(&record.name);
        self.call("writing the node record", async |mut c| {
            let lease = PutOptions::new().with_lease(lease);
            c.put(key.clone(), value.clone(), Some(lease)).await
        })
        .await?;
        Ok(())
    }

    /// Every live member's record; records that do not parse are skipped.
    pub async fn members(&self) -> Result<Vec<NodeRecord>> {
        let key = self.node_key("");
        let r = self
            .call("reading members", async |mut c| {
                c.get(key.clone(), Some(GetOptions::new().with_prefix()))
                    .await
            })
            .await?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| match serde_json::from_slice(kv.value()) {
                Ok(rec) => Some(rec),
                Err(e) => {
                    tracing::warn!(key = ?kv.key_str(), "etcd: a node record that does not parse: {e}");
                    None
                }
            })
            .collect())
    }

    /// The owner record of `id`, if any.
    pub async fn owner(&self, id: &str) -> Result<Option<OwnerRecord>> {
        let key = self.owner_key(id);
        let r = self
            .call("reading an owner", async |mut c| {
                c.get(key.clone(), None).await
            })
            .await?;
        Ok(r.kvs()
            .first()
            .and_then(|kv| serde_json::from_slice(kv.value()).ok()))
    }

    /// Every owner record, by sandbox id.
    pub async fn owners(&self) -> Result<Vec<(String, OwnerRecord)>> {
        let start = self.owner_key("");
        let r = self
            .call("reading owners", async |mut c| {
                c.get(start.clone(), Some(GetOptions::new().with_prefix()))
                    .await
            })
            .await?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| {
                let id = kv.key_str().ok()?.strip_prefix(&start)?.to_string();
                Some((id, serde_json::from_slice(kv.value()).ok()?))
            })
            .collect())
    }

    fn owner_ops(&self, id: &str, rec: &OwnerRecord, lease: i64) -> Vec<TxnOp> {
        let value = serde_json::to_vec(rec).expect("records serialize");
        let mut ops = vec![TxnOp::put(self.owner_key(id), value, None)];
        if let (Some(t), Some(slot)) = (&rec.tenant, &rec.slot) {
            ops.push(self.slot_put(t, slot, &rec.node, lease));
        }
        ops
    }

    /// Records `id`'s owner, and (again) its tenant slot under `lease`.
    pub async fn put_owner(&self, id: &str, rec: &OwnerRecord, lease: i64) -> Result<()> {
        let ops = self.owner_ops(id, rec, lease);
        self.call("recording an owner", async |mut c| {
            c.txn(Txn::new().and_then(ops.clone())).await
        })
        .await?;
        Ok(())
    }

    /// [`Etcd::put_owner`] unless `id` has a record already.
    pub async fn put_owner_if_absent(&self, id: &str, rec: &OwnerRecord, lease: i64) -> Result<()> {
        let ops = self.owner_ops(id, rec, lease);
        let absent = Compare::create_revision(self.owner_key(id), CompareOp::Equal, 0);
        self.call("recording an owner", async |mut c| {
            let txn = Txn::new().when([absent.clone()]).and_then(ops.clone());
            c.txn(txn).await
        })
        .await?;
        Ok(())
    }

    fn slot_put(&self, tenant: &str, slot: &str, node: &str, lease: i64) -> TxnOp {
        let key = format!("{}{slot}", self.tenant_prefix(tenant));
        TxnOp::put(key, node, Some(PutOptions::new().with_lease(lease)))
    }

    /// Deletes `id`'s owner record and its tenant slot.
    pub async fn delete_owner(&self, id: &str, rec: &OwnerRecord) -> Result<()> {
        let mut ops = vec![TxnOp::delete(self.owner_key(id), None)];
        if let (Some(t), Some(slot)) = (&rec.tenant, &rec.slot) {
            ops.push(TxnOp::delete(
                format!("{}{slot}", self.tenant_prefix(t)),
                None,
            ));
        }
        self.call("deleting an owner", async |mut c| {
            c.txn(Txn::new().and_then(ops.clone())).await
        })
        .await?;
        Ok(())
    }

    /// Frees a slot taken by [`Etcd::reserve_slot`] for a claim that then failed. On
    /// failure its lease frees it when this node goes; until then the tenant is one short.
    pub async fn free_slot(&self, tenant: &str, slot: &str) {
        let key = format!("{}{slot}", self.tenant_prefix(tenant));
        let _ = self
            .call("freeing a tenant slot", async |mut c| {
                c.delete(key.clone(), None::<DeleteOptions>).await
            })
            .await;
    }

    /// Takes one of `tenant`'s `max` slots cluster-wide, or answers 429. The count and the
    /// write are one transaction guarded by the tenant's quota key: every slot taken
    /// rewrites that key, so two claims that counted the same slots cannot both commit
    /// (the loser counts again). Freed slots only lower the count, so they need no guard.
    pub async fn reserve_slot(
        &self,
        tenant: &str,
        max: u32,
        slot: &str,
        node: &str,
        lease: i64,
    ) -> Result<()> {
        let guard = self.guard_key(tenant);
        let slots = self.tenant_prefix(tenant);
        for _ in 0..QUOTA_TRIES {
            let seen = self
                .call("reading a quota", async |mut c| {
                    c.get(guard.clone(), None).await
                })
                .await?;
            let revision = seen.kvs().first().map_or(0, |kv| kv.mod_revision());
            let held = self
                .call("counting a quota", async |mut c| {
                    let count = GetOptions::new().with_prefix().with_count_only();
                    c.get(slots.clone(), Some(count)).await
                })
                .await?
                .count();
            if held >= i64::from(max) {
                return Err(Error::TooManyClaims(format!(
                    "tenant {tenant:?} max_claims ({max}) reached across the cluster"
                )));
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    guard.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([
                    TxnOp::put(guard.clone(), slot, None),
                    self.slot_put(tenant, slot, node, lease),
                ]);
            let r = self
                .call("taking a quota slot", async |mut c| {
                    c.txn(txn.clone()).await
                })
                .await?;
            if r.succeeded() {
                return Ok(());
            }
        }
        Err(Error::Busy {
            reason: format!("too many concurrent claims for tenant {tenant:?}; retry"),
            retry_after: 1,
        })
    }
}
