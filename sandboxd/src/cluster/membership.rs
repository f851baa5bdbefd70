//! The loops that keep this node in the cluster: the lease (granted, kept alive at a
//! third of its TTL, granted anew if etcd let it expire), this node's record (written
//! when it changes, checked every [`TICK`], so a burst of claims is one write), the
//! member list (read every tick), and a reconcile pass that makes the ownership records
//! match what this node really holds (releases, TTL expiry, re-adoption after a restart,
//! writes missed while etcd was unreachable).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use api::cluster::{NodePool, NodeRecord};

use super::etcd::OwnerRecord;
use super::Cluster;
use crate::claims::now_ms;
use crate::node::Node;

/// How often this node's record is compared with what was published, and members read.
const TICK: Duration = Duration::from_millis(100);

/// This node's record now.
pub fn record(cluster: &Cluster, node: &Node) -> NodeRecord {
    let config = &node.config;
    NodeRecord {
        name: cluster.name().to_string(),
        url: cluster.url.clone(),
        engine: config.engine.as_str().to_string(),
        templates: config.templates.keys().cloned().collect(),
        sizes: config.sizes.keys().cloned().collect(),
        pools: node
            .pools
            .info()
            .into_iter()
            .map(|p| NodePool {
                template: p.template,
                size: p.size,
                warm: p.warm,
            })
            .collect(),
        claims: node.claims.active(),
        max_claims: config.max_claims,
        draining: cluster.draining(),
    }
}

/// Starts the loops; they end with [`Cluster::leave`].
pub fn spawn(cluster: Arc<Cluster>, node: Arc<Node>) {
    tokio::spawn(keep_lease(cluster.clone()));
    tokio::spawn(publish_and_watch(cluster, node));
}

async fn keep_lease(cluster: Arc<Cluster>) {
    let ttl = cluster.config.lease_ttl_seconds;
    let every = Duration::from_millis(ttl * 1000 / 3);
    loop {
        let lease = cluster.lease.load(Ordering::SeqCst);
        let next = if lease == 0 {
            cluster.etcd.grant(ttl).await.ok()
        } else {
            match cluster.etcd.keep_alive(lease).await {
                // etcd let it lapse (it was unreachable longer than the TTL): this node
                // left; a new lease brings it and its slots back (see `reconcile`).
                Ok(0) => {
                    tracing::warn!(lease, "cluster lease expired; taking a new one");
                    cluster.etcd.grant(ttl).await.ok()
                }
                Ok(_) | Err(_) => Some(lease),
            }
        };
        if let Some(l) = next {
            // `leave` zeroes the lease; never bring it back after that.
            let _ = cluster
                .lease
                .compare_exchange(lease, l, Ordering::SeqCst, Ordering::SeqCst);
        }
        let wait = if cluster.lease.load(Ordering::SeqCst) == 0 {
            TICK * 5
        } else {
            every
        };
        tokio::select! {
            () = cluster.shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

async fn publish_and_watch(cluster: Arc<Cluster>, node: Arc<Node>) {
    let mut published: Option<(i64, NodeRecord)> = None;
    let mut reconciled_lease = 0;
    let mut last_reconcile = 0;
    let reconcile_every = cluster.config.lease_ttl_seconds * 1000 / 2;
    loop {
        let lease = cluster.lease.load(Ordering::SeqCst);
        if lease != 0 {
            let now = record(&cluster, &node);
            if published.as_ref() != Some(&(lease, now.clone()))
                && cluster.etcd.put_node(&now, lease).await.is_ok()
            {
                published = Some((lease, now));
            }
        }
        if let Ok(members) = cluster.etcd.members().await {
            let by_name: BTreeMap<_, _> =
                members.into_iter().map(|m| (m.name.clone(), m)).collect();
            *cluster.members.write().expect("members lock") = by_name;
            cluster.members_read_ms.store(now_ms(), Ordering::SeqCst);
        }
        let due = now_ms().saturating_sub(last_reconcile) >= reconcile_every;
        if lease != 0 && (due || reconciled_lease != lease) {
            if reconcile(&cluster, &node, lease, reconciled_lease != lease).await {
                reconciled_lease = lease;
            }
            last_reconcile = now_ms();
        }
        tokio::select! {
            () = cluster.shutdown.cancelled() => return,
            () = tokio::time::sleep(TICK) => {}
        }
    }
}

/// Makes etcd's ownership records for this node match its claims: records of sandboxes
/// gone from here are deleted, sandboxes without a record get one (put only if still
/// absent, so a claim's own record, with its slot, always wins), and after a new lease
/// every tenant slot is written again under it. Returns whether it completed.
async fn reconcile(cluster: &Cluster, node: &Node, lease: i64, new_lease: bool) -> bool {
    let Ok(recorded) = cluster.etcd.owners().await else {
        return false;
    };
    // Every node learns every owner: forwarding keeps working while etcd is unreachable.
    cluster.learn_owners(&recorded);
    // Read after the records: a sandbox claimed in between is local and simply gets its
    // record checked next time.
    let local: HashSet<String> = node
        .claims
        .list(None)
        .into_iter()
        .map(|s| s.id.clone())
        .collect();
    let mut ours = HashSet::new();
    let mut ok = true;
    for (id, rec) in recorded.iter().filter(|(_, r)| r.node == cluster.name()) {
        ours.insert(id.clone());
        let result = if !local.contains(id) {
            cluster.forget(id);
            cluster.etcd.delete_owner(id, rec).await
        } else if new_lease {
            cluster.etcd.put_owner(id, rec, lease).await
        } else {
            Ok(())
        };
        ok &= result.is_ok();
    }
    for sandbox in node.claims.list(None) {
        if ours.contains(&sandbox.id) {
            continue;
        }
        let rec = OwnerRecord {
            node: cluster.name().to_string(),
            tenant: sandbox.tenant.clone(),
            slot: sandbox.tenant.as_ref().map(|_| sandbox.id.clone()),
        };
        ok &= cluster
            .etcd
            .put_owner_if_absent(&sandbox.id, &rec, lease)
            .await
            .is_ok();
    }
    ok
}
