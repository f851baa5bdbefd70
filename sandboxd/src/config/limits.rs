//! The limits sections: `[exec]` (buffered exec output and concurrency) and `[http]`
//! (connections and how long a client may sit without progress), with their defaults.

use serde::{Deserialize, Serialize};

/// `[exec]`: buffered exec limits.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// Per-exec output cap in raw bytes, stdout and stderr together (413 beyond).
    #[serde(default = "max_output")]
    pub max_output_bytes: u64,
    /// Node-wide heap for buffered output; beyond it output spills to unlinked temp files.
    #[serde(default = "memory_budget")]
    pub memory_budget_bytes: u64,
    /// Buffered execs at once (503 + Retry-After beyond).
    #[serde(default = "max_in_flight")]
    pub max_in_flight: u32,
    /// Buffered execs at once in one sandbox (503 + Retry-After beyond), so one sandbox
    /// cannot take the node's whole share.
    #[serde(default = "max_in_flight_per_sandbox")]
    pub max_in_flight_per_sandbox: u32,
    /// Buffered execs at once across one tenant's sandboxes (503 + Retry-After beyond).
    #[serde(default = "max_in_flight_per_tenant")]
    pub max_in_flight_per_tenant: u32,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            max_output_bytes: max_output(),
            memory_budget_bytes: memory_budget(),
            max_in_flight: max_in_flight(),
            max_in_flight_per_sandbox: max_in_flight_per_sandbox(),
            max_in_flight_per_tenant: max_in_flight_per_tenant(),
        }
    }
}

/// `[http]`: what one client may hold of the node: connections, and how long a
/// connection may sit on a request or a response without progress.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Open connections at once, relays included; beyond it a new connection is answered
    /// 503 and closed.
    #[serde(default = "max_connections")]
    pub max_connections: u32,
    /// From a request's first byte to its complete head (slow-headers clients).
    #[serde(default = "header_timeout")]
    pub header_timeout_seconds: u64,
    /// From a request's head to its complete body (408 beyond).
    #[serde(default = "body_timeout")]
    pub body_timeout_seconds: u64,
    /// A connection with no request in progress is closed after this long without a
    /// byte (new connections that never send, and idle keep-alive ones).
    #[serde(default = "idle_timeout")]
    pub idle_timeout_seconds: u64,
    /// A response write that makes no progress for this long (the client stopped
    /// reading) closes the connection, which frees the exec output it held.
    #[serde(default = "write_timeout")]
    pub write_timeout_seconds: u64,
    /// Relays open at once to one sandbox (429 beyond).
    #[serde(default = "max_relays_per_sandbox")]
    pub max_relays_per_sandbox: u32,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_connections: max_connections(),
            header_timeout_seconds: header_timeout(),
            body_timeout_seconds: body_timeout(),
            idle_timeout_seconds: idle_timeout(),
            write_timeout_seconds: write_timeout(),
            max_relays_per_sandbox: max_relays_per_sandbox(),
        }
    }
}

fn max_output() -> u64 {
    8 * 1024 * 1024
}

fn memory_budget() -> u64 {
    64 * 1024 * 1024
}

fn max_in_flight() -> u32 {
    256
}

fn max_in_flight_per_sandbox() -> u32 {
    32
}

fn max_in_flight_per_tenant() -> u32 {
    128
}

fn max_connections() -> u32 {
    4096
}

fn header_timeout() -> u64 {
    10
}

fn body_timeout() -> u64 {
    30
}

fn idle_timeout() -> u64 {
    60
}

fn write_timeout() -> u64 {
    30
}

fn max_relays_per_sandbox() -> u32 {
    32
}
