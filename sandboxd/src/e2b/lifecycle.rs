//! Pause and resume: E2B's pause is the node's hibernate, and connecting to a paused
//! sandbox (or any agent call to it) wakes it. These are the only places the E2B
//! surface calls hibernate and wake.

use std::sync::Arc;

use super::E2b;
use crate::claims::Sandbox;
use crate::error::{Error, Result};

/// The state E2B reports for a claimed sandbox.
pub fn state(sandbox: &Sandbox) -> &'static str {
    if sandbox.is_hibernated() {
        "paused"
    } else {
        "running"
    }
}

/// `POST /sandboxes/{id}/pause`: hibernates `sandbox`. The SDK reads 409 as "already
/// paused" (its `pause()` returns false), so an engine that cannot hibernate answers
/// 501 instead, which the SDK raises.
pub async fn pause(e2b: &E2b, sandbox: &Arc<Sandbox>) -> Result<()> {
    if sandbox.is_hibernated() {
        return Err(Error::Conflict(format!(
            "sandbox {} is already paused",
            sandbox.id
        )));
    }
    match e2b.node.hibernate(sandbox).await {
        Err(Error::Conflict(why)) => Err(Error::Unsupported(format!("pause: {why}"))),
        other => other,
    }
}

/// A sandbox about to be used: running (woken first when paused, within the node's
/// bounded wait), or 404.
pub async fn running(e2b: &E2b, id: &str) -> Result<Arc<Sandbox>> {
    let sandbox = e2b.node.sandbox(id)?;
    e2b.node.wake(&sandbox).await?;
    Ok(sandbox)
}
