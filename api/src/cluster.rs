//! Bodies of the cluster routes (`GET /v1/cluster`, `POST /v1/node/drain`) and the node
//! record every member keeps in etcd (the same JSON).

use serde::{Deserialize, Serialize};

/// One node as it announces itself in etcd, under its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Its `[cluster] node_name`.
    pub name: String,
    /// How the other nodes reach it.
    pub url: String,
    /// `process` or `qemu`.
    pub engine: String,
    /// Template names it serves.
    pub templates: Vec<String>,
    /// Size names it serves.
    pub sizes: Vec<String>,
    /// Its pools and their warm guests now.
    pub pools: Vec<NodePool>,
    /// Sandboxes claimed on it now.
    pub claims: u32,
    /// Its node-wide `max_claims`.
    pub max_claims: u32,
    /// Drained: it takes no new claims.
    pub draining: bool,
}

/// A node's warm guests for one template and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePool {
    /// Template name.
    pub template: String,
    /// Size name.
    pub size: String,
    /// Idle guests ready now.
    pub warm: u32,
}

/// `GET /v1/cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The node that answered.
    pub node: String,
    /// Whether that node reached etcd recently (`false`: placements answer 503 and the
    /// node list is the last one seen).
    pub etcd_reachable: bool,
    /// Live members by name, this one included.
    pub nodes: Vec<NodeRecord>,
    /// Sandboxes whose owner this node knows (from the ownership records it last read,
    /// and the lookups since): it can forward to them even while etcd is unreachable.
    pub owners_known: u32,
}

/// `POST /v1/node/drain` body; `{}` drains.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// `false` takes the node back into placement; `true` (the default) drains it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<bool>,
}

/// `POST /v1/node/drain` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainResponse {
    /// The node.
    pub node: String,
    /// Whether it is draining now.
    pub draining: bool,
    /// Sandboxes still claimed on it (they keep serving until released or expired).
    pub sandboxes: u32,
}
