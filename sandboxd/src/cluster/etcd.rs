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
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
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

/// The etcd client and the key prefix.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    prefix: String,
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
    /// Connects to the endpoints (a reachable member suffices; quorum is not needed yet).
    pub async fn connect(config: &ClusterConfig) -> Result<Etcd> {
        let mut options = ConnectOptions::new()
            .with_timeout(CALL_TIMEOUT)
            .with_connect_timeout(CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), CALL_TIMEOUT);
        if let (Some(u), Some(p)) = (&config.etcd_user, &config.etcd_password) {
            options = options.with_user(u.clone(), p.clone());
        }
        let client = Client::connect(&config.etcd, Some(options))
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "[cluster] connecting to etcd {:?}: {e}",
                    config.etcd
                ))
            })?;
        Ok(Etcd {
            client,
            prefix: config.prefix.clone(),
        })
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
            .client
            .clone()
            .lease_grant(ttl as i64, None)
            .await
            .map_err(|e| unreachable("granting a lease", e))?;
        Ok(r.id())
    }

    /// Revokes a lease: its node record and tenant slots go at once.
    pub async fn revoke(&self, lease: i64) {
        if let Err(e) = self.client.clone().lease_revoke(lease).await {
            tracing::warn!("etcd: revoking lease {lease:x}: {e}");
        }
    }

    /// Keeps `lease` alive once; the TTL left (0: the lease is gone).
    pub async fn keep_alive(&self, lease: i64) -> Result<i64> {
        let (mut keeper, mut stream) = self
            .client
            .clone()
            .lease_keep_alive(lease)
            .await
            .map_err(|e| unreachable("keep-alive", e))?;
        keeper
            .keep_alive()
            .await
            .map_err(|e| unreachable("keep-alive", e))?;
        let answer = tokio::time::timeout(CALL_TIMEOUT, stream.message())
            .await
            .map_err(|_| unreachable("keep-alive", "no answer"))?
            .map_err(|e| unreachable("keep-alive", e))?;
        Ok(answer.map_or(0, |a| a.ttl()))
    }

    /// Writes this node's record under its lease.
    pub async fn put_node(&self, record: &NodeRecord, lease: i64) -> Result<()> {
        let value = serde_json::to_vec(record).expect("records serialize");
        self.client
            .clone()
            .put(
                self.node_key(&record.name),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(|e| unreachable("writing the node record", e))?;
        Ok(())
    }

    /// Every live member's record; records that do not parse are skipped.
    pub async fn members(&self) -> Result<Vec<NodeRecord>> {
        let r = self
            .client
            .clone()
            .get(self.node_key(""), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| unreachable("reading members", e))?;
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
        let r = self
            .client
            .clone()
            .get(self.owner_key(id), None)
            .await
            .map_err(|e| unreachable("reading an owner", e))?;
        Ok(r.kvs()
            .first()
            .and_then(|kv| serde_json::from_slice(kv.value()).ok()))
    }

    /// Every owner record, by sandbox id.
    pub async fn owners(&self) -> Result<Vec<(String, OwnerRecord)>> {
        let start = self.owner_key("");
        let r = self
            .client
            .clone()
            .get(start.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| unreachable("reading owners", e))?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| {
                let id = kv.key_str().ok()?.strip_prefix(&start)?.to_string();
                Some((id, serde_json::from_slice(kv.value()).ok()?))
            })
            .collect())
    }

    /// Records `id`'s owner, and (again) its tenant slot under `lease`.
    pub async fn put_owner(&self, id: &str, rec: &OwnerRecord, lease: i64) -> Result<()> {
        let mut ops = vec![TxnOp::put(
            self.owner_key(id),
            serde_json::to_vec(rec).expect("records serialize"),
            None,
        )];
        if let (Some(t), Some(slot)) = (&rec.tenant, &rec.slot) {
            ops.push(self.slot_put(t, slot, &rec.node, lease));
        }
        self.client
            .clone()
            .txn(Txn::new().and_then(ops))
            .await
            .map_err(|e| unreachable("recording an owner", e))?;
        Ok(())
    }

    /// [`Etcd::put_owner`] unless `id` has a record already.
    pub async fn put_owner_if_absent(&self, id: &str, rec: &OwnerRecord, lease: i64) -> Result<()> {
        let key = self.owner_key(id);
        let mut ops = vec![TxnOp::put(
            key.clone(),
            serde_json::to_vec(rec).expect("records serialize"),
            None,
        )];
        if let (Some(t), Some(slot)) = (&rec.tenant, &rec.slot) {
            ops.push(self.slot_put(t, slot, &rec.node, lease));
        }
        self.client
            .clone()
            .txn(
                Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                    .and_then(ops),
            )
            .await
            .map_err(|e| unreachable("recording an owner", e))?;
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
        self.client
            .clone()
            .txn(Txn::new().and_then(ops))
            .await
            .map_err(|e| unreachable("deleting an owner", e))?;
        Ok(())
    }

    /// Frees a slot taken by [`Etcd::reserve_slot`] for a claim that then failed.
    pub async fn free_slot(&self, tenant: &str, slot: &str) {
        let key = format!("{}{slot}", self.tenant_prefix(tenant));
        if let Err(e) = self.client.clone().delete(key, None::<DeleteOptions>).await {
            // Its lease frees it when this node goes; until then the tenant is one short.
            tracing::warn!("etcd: freeing a tenant slot: {e}");
        }
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
        let mut client = self.client.clone();
        for _ in 0..QUOTA_TRIES {
            let seen = client
                .get(guard.clone(), None)
                .await
                .map_err(|e| unreachable("reading a quota", e))?;
            let revision = seen.kvs().first().map_or(0, |kv| kv.mod_revision());
            let held = client
                .get(
                    self.tenant_prefix(tenant),
                    Some(GetOptions::new().with_prefix().with_count_only()),
                )
                .await
                .map_err(|e| unreachable("counting a quota", e))?
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
            let r = client
                .txn(txn)
                .await
                .map_err(|e| unreachable("taking a quota slot", e))?;
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
