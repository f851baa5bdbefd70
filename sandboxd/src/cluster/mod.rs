//! Many nodes, one service, coordinated through etcd (`[cluster]`): membership under a
//! lease ([`membership`]), placement by warm capacity ([`placement`]), ownership recorded
//! at claim time and tenant slots counted cluster-wide ([`etcd`]), and any request for a
//! sandbox forwarded to its owner ([`forward`]), over mTLS when `peer_*` is set
//! ([`peer_tls`]). Each node stays the authority for its own sandboxes: owner-local calls
//! never touch etcd, so losing etcd's quorum stops new placements, not running work.
//! Without `[cluster]` none of this exists.

pub mod config;
pub mod etcd;
pub mod forward;
pub mod membership;
pub mod peer_tls;
pub mod placement;
mod tls;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use api::cluster::NodeRecord;
use tokio_util::sync::CancellationToken;

use self::config::ClusterConfig;
use self::etcd::{Etcd, OwnerRecord};
use self::peer_tls::{PeerTls, VerifiedPeer};
use crate::claims::now_ms;
use crate::error::{Error, Result};

/// Owners remembered per node (an owner never changes); beyond, the memory starts over.
const OWNERS_KEPT: usize = 100_000;

/// Where a request for a sandbox goes.
pub enum Route {
    /// Served here.
    Local,
    /// Forwarded to this member.
    Peer(NodeRecord),
}

/// This node's part of the cluster.
pub struct Cluster {
    /// `[cluster]`.
    pub config: ClusterConfig,
    /// The URL other nodes reach this one at.
    pub url: String,
    /// mTLS with the other nodes (`peer_*`), when configured.
    pub peer_tls: Option<PeerTls>,
    etcd: Etcd,
    /// Live members by name, as last read from etcd (kept while etcd is unreachable).
    members: RwLock<BTreeMap<String, NodeRecord>>,
    /// When the member list was last read (ms since the epoch; 0: never).
    members_read_ms: AtomicU64,
    /// The current lease (0: none yet).
    lease: AtomicI64,
    draining: AtomicBool,
    /// Last known owner of each sandbox (every ownership record, read by the reconcile
    /// pass, plus lookups since): forwarded calls keep working while etcd is unreachable.
    owners: Mutex<HashMap<String, String>>,
    shutdown: CancellationToken,
}

impl Cluster {
    /// Loads the peer TLS files, connects to etcd and takes a lease; the loops start
    /// with [`membership::spawn`]. `bound` is the main listener's address, `peer_bound`
    /// the peer listener's (with peer TLS, what is advertised when `advertise_url` is not).
    pub async fn join(
        config: ClusterConfig,
        bound: Option<std::net::SocketAddr>,
        peer_bound: Option<std::net::SocketAddr>,
    ) -> Result<Arc<Cluster>> {
        let needed = |why: &str| Error::Config(format!("[cluster] advertise_url is needed: {why}"));
        let url = match (&config.advertise_url, config.peer_tls()) {
            (Some(u), _) => u.trim_end_matches('/').to_string(),
            (None, true) => peer_bound
                .and_then(peer_tls::advertised)
                .ok_or_else(|| needed("peer_listen is a wildcard"))?,
            (None, false) => bound
                .filter(|a| !a.ip().is_unspecified())
                .map(|a| format!("http://{a}"))
                .ok_or_else(|| needed("listen is a wildcard or Unix address"))?,
        };
        let peer_tls = PeerTls::load(&config)?;
        let etcd = Etcd::connect(&config).await?;
        Ok(Arc::new(Cluster {
            config,
            url,
            peer_tls,
            etcd,
            members: RwLock::new(BTreeMap::new()),
            members_read_ms: AtomicU64::new(0),
            lease: AtomicI64::new(0),
            draining: AtomicBool::new(false),
            owners: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
        }))
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.config.node_name
    }

    /// Whether etcd answered recently enough for placement decisions to be trusted.
    pub fn etcd_reachable(&self) -> bool {
        let read = self.members_read_ms.load(Ordering::SeqCst);
        read != 0 && now_ms().saturating_sub(read) <= self.config.lease_ttl_seconds * 1000
    }

    /// The live members as last read.
    pub fn members(&self) -> Vec<NodeRecord> {
        self.members
            .read()
            .expect("members lock")
            .values()
            .cloned()
            .collect()
    }

    /// Whether this node is drained.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Drains this node, or takes it back; the change is published on the next tick.
    pub fn set_draining(&self, on: bool) {
        self.draining.store(on, Ordering::SeqCst);
    }

    fn lease(&self) -> Result<i64> {
        match self.lease.load(Ordering::SeqCst) {
            0 => Err(etcd::unreachable("no lease yet", "starting")),
            l => Ok(l),
        }
    }

    /// Whether `req` comes from another node, routed already: it carries the cluster's
    /// peer token (compared in constant time) and, with peer TLS, arrived on the peer
    /// listener ([`VerifiedPeer`]); elsewhere the token alone is not trusted.
    pub fn is_peer<B>(&self, req: &hyper::Request<B>) -> bool {
        use subtle::ConstantTimeEq;
        if self.peer_tls.is_some() && req.extensions().get::<VerifiedPeer>().is_none() {
            return false;
        }
        req.headers()
            .get(forward::PEER_HEADER)
            .is_some_and(|v| bool::from(v.as_bytes().ct_eq(self.config.peer_token.as_bytes())))
    }

    /// Where a request for sandbox `id` (not claimed here) goes: its owner while that
    /// node is a member; 410 when the owner's lease is gone, 404 for an id nobody
    /// recorded, 503 when etcd cannot say and no owner is remembered.
    pub async fn route_for(&self, id: &str) -> Result<Route> {
        // Ids are ours (`sb-` and hex): anything else is unknown without asking etcd,
        // so a hostile id never becomes a key.
        if id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(Error::NotFound);
        }
        let known = self.owners.lock().expect("owners lock").get(id).cloned();
        let owner = match known {
            Some(o) => o,
            None => {
                let rec = self.etcd.owner(id).await?.ok_or(Error::NotFound)?;
                let mut owners = self.owners.lock().expect("owners lock");
                if owners.len() >= OWNERS_KEPT {
                    owners.clear();
                }
                owners.insert(id.to_string(), rec.node.clone());
                rec.node
            }
        };
        if owner == self.name() {
            return Ok(Route::Local);
        }
        match self.members.read().expect("members lock").get(&owner) {
            Some(rec) => Ok(Route::Peer(rec.clone())),
            None => Err(Error::Lost {
                id: id.to_string(),
                node: owner,
            }),
        }
    }

    /// How many sandboxes' owners this node knows.
    pub fn owners_known(&self) -> u32 {
        self.owners.lock().expect("owners lock").len() as u32
    }

    /// Replaces the known owners with every ownership record just read.
    fn learn_owners(&self, recorded: &[(String, OwnerRecord)]) {
        if recorded.len() <= OWNERS_KEPT {
            *self.owners.lock().expect("owners lock") = recorded
                .iter()
                .map(|(id, rec)| (id.clone(), rec.node.clone()))
                .collect();
        }
    }

    /// Forgets a released sandbox's owner.
    pub fn forget(&self, id: &str) {
        self.owners.lock().expect("owners lock").remove(id);
    }

    /// The member a new claim for `template`/`size` goes to: 503 while etcd is
    /// unreachable or no member can take it.
    pub fn place(&self, template: &str, size: &str) -> Result<NodeRecord> {
        if !self.etcd_reachable() {
            return Err(etcd::unreachable(
                "placing a claim",
                "the member list is stale",
            ));
        }
        let members = self.members();
        placement::choose(self.name(), &members, template, size)
            .cloned()
            .ok_or_else(|| Error::Busy {
                reason: format!(
                    "no node in the cluster can take a claim for template {template:?} \
                     size {size:?} now (drained, full, or none serves it)"
                ),
                retry_after: 2,
            })
    }

    /// Takes a tenant slot for a claim about to be served here; returns its name.
    pub async fn reserve_slot(&self, tenant: &str, max: u32) -> Result<String> {
        let mut raw = [0u8; 8];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut raw);
        let slot = hex::encode(raw);
        self.etcd
            .reserve_slot(tenant, max, &slot, self.name(), self.lease()?)
            .await?;
        Ok(slot)
    }

    /// Frees a slot whose claim failed.
    pub async fn free_slot(&self, tenant: &str, slot: &str) {
        self.etcd.free_slot(tenant, slot).await;
    }

    /// Records this node as `id`'s owner (with its tenant slot).
    pub async fn record_owner(
        &self,
        id: &str,
        tenant: Option<String>,
        slot: Option<String>,
    ) -> Result<()> {
        let rec = OwnerRecord {
            node: self.name().to_string(),
            tenant,
            slot,
        };
        self.etcd.put_owner(id, &rec, self.lease()?).await?;
        self.owners
            .lock()
            .expect("owners lock")
            .insert(id.to_string(), rec.node);
        Ok(())
    }

    /// Deletes a released sandbox's records; the reconcile pass retries a failure.
    pub async fn released(&self, id: &str) {
        self.forget(id);
        match self.etcd.owner(id).await {
            Ok(Some(rec)) if rec.node == self.name() => {
                let _ = self.etcd.delete_owner(id, &rec).await;
            }
            _ => {}
        }
    }

    /// Stops the loops and revokes the lease, so that the others see this node leave now
    /// rather than a TTL later.
    pub async fn leave(&self) {
        self.shutdown.cancel();
        let lease = self.lease.swap(0, Ordering::SeqCst);
        if lease != 0 {
            self.etcd.revoke(lease).await;
        }
    }
}
