//! HTTP bodies of sandboxd's v1 API, shared by `sandboxd` and `sdk-rust` so neither
//! copies the other's types. Plain data: no I/O, no validation beyond serde's.
//!
//! Times are Unix seconds (`u64`). Every request body rejects unknown fields.
#![deny(missing_docs)]

use std::collections::BTreeMap;

pub mod cluster;
pub mod files;
pub mod snapshots;

use serde::{Deserialize, Serialize};

/// Every error answer: `{"error": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, for humans.
    pub error: String,
}

/// `POST /v1/claim` body. Every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// Template name; the node's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Size name; the node's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Lifetime; `default_ttl_seconds` when absent, clamped to `max_ttl_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// Fork this snapshot (`snapshot_id`) instead of taking a fresh sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// `POST /v1/claim` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimResponse {
    /// Sandbox id.
    pub id: String,
    /// The sandbox's own bearer token (256-bit, hex).
    pub token: String,
    /// When the sandbox will be destroyed unless renewed (Unix seconds).
    pub deadline: u64,
}

/// `POST /v1/sandboxes/{id}/renew` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    /// New lifetime from now, clamped to `max_ttl_seconds`.
    pub ttl_seconds: u64,
}

/// `POST /v1/sandboxes/{id}/renew` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewResponse {
    /// The granted deadline (Unix seconds).
    pub deadline: u64,
}

/// Lifecycle of a claimed sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Claimed and serving.
    Ready,
    /// Its guest died; exec and relay answer 502 until it is released.
    Failed,
    /// Written to disk with its memory freed; the next call wakes it.
    Hibernated,
}

/// One row of `GET /v1/sandboxes` (never a token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSummary {
    /// Sandbox id.
    pub id: String,
    /// Template it was made from.
    pub template: String,
    /// Size it was made with.
    pub size: String,
    /// Deadline (Unix seconds).
    pub deadline: u64,
    /// Lifecycle state.
    pub state: SandboxState,
    /// Tenant that claimed it, when a tenant did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/sandboxes` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxList {
    /// The caller's sandboxes (root sees all).
    pub sandboxes: Vec<SandboxSummary>,
}

/// How buffered exec returns output bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// A JSON string when the bytes are valid UTF-8, else `*_b64`.
    #[default]
    Utf8,
    /// Always `*_b64` (standard base64).
    Base64,
}

/// `POST /v1/sandboxes/{id}/exec` body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments (non-empty).
    pub argv: Vec<String>,
    /// Working directory inside the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Give up (kill, 504) after this many seconds; must be positive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// Output encoding; `utf8` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
    /// Run as this user (a name or numeric uid from the sandbox's `/etc/passwd`); the
    /// template's user when absent. An unknown user answers 400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// `POST /v1/sandboxes/{id}/exec` answer. Each stream comes as exactly one of the plain
/// or the `_b64` field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResponse {
    /// Exit code when the command exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when a signal ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Stdout as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// Stdout as standard base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_b64: Option<String>,
    /// Stderr as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// Stderr as standard base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_b64: Option<String>,
    /// On a 504: the command ran past `timeout_seconds` and was killed; the streams hold
    /// what it wrote until then. Absent (false) on a 200.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// On a 413: the command wrote more than the node's output cap and was killed; the
    /// streams hold its first bytes, at most the cap in all. Absent (false) on a 200.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// On a 504 or 413, what happened, for humans (the field every error answer has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One pool's warm target, as `PUT /v1/pools` takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolTarget {
    /// Template name.
    pub template: String,
    /// Size name.
    pub size: String,
    /// Idle sandboxes to keep ready.
    pub warm: u32,
    /// Upper bound for `warm`.
    pub warm_max: u32,
}

/// `PUT /v1/pools` body: the complete list; pools absent from it are drained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolsUpdate {
    /// New targets.
    pub pools: Vec<PoolTarget>,
}

/// State of a pool's golden snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoldenInfo {
    /// `missing`, `building`, `ready` or `failed`.
    pub state: String,
    /// Hash of the golden's inputs, once built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<String>,
    /// The last build failure, kept until a build succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Builds started by this daemon process (0 when a matching stamp was reused).
    #[serde(default)]
    pub builds: u64,
}

/// One pool in `GET /v1/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolInfo {
    /// Template name.
    pub template: String,
    /// Size name.
    pub size: String,
    /// Idle sandboxes ready now.
    pub warm: u32,
    /// Target of idle sandboxes.
    pub target: u32,
    /// Upper bound for the target.
    pub warm_max: u32,
    /// The golden snapshot.
    pub golden: GoldenInfo,
    /// The last refill failure, if the latest attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refill_error: Option<String>,
}

/// Claim counts in `GET /v1/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimsInfo {
    /// Sandboxes claimed now.
    pub active: u32,
    /// Node-wide limit.
    pub max: u32,
}

/// Engine facts in `GET /v1/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineInfo {
    /// `process` or `qemu`.
    pub name: String,
    /// `kvm` or `tcg` for qemu.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<String>,
    /// Limits the engine could not apply on this host, said plainly.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// Limits in `GET /v1/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsInfo {
    /// Default lifetime.
    pub default_ttl_seconds: u64,
    /// Largest lifetime.
    pub max_ttl_seconds: u64,
    /// Per-exec output cap in raw bytes.
    pub max_output_bytes: u64,
    /// Node-wide budget for buffered output.
    pub memory_budget_bytes: u64,
    /// Buffered execs in flight before 503.
    pub max_in_flight: u32,
}

/// `GET /v1/info` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InfoResponse {
    /// sandboxd's version.
    pub version: String,
    /// The engine.
    pub engine: EngineInfo,
    /// Claim counts.
    pub claims: ClaimsInfo,
    /// Configured limits.
    pub limits: LimitsInfo,
    /// Every pool.
    pub pools: Vec<PoolInfo>,
    /// Node-level warnings, e.g. saved pool targets discarded because the config changed.
    #[serde(default)]
    pub warnings: Vec<String>,
}
