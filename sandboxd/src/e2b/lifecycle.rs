//! Pause and resume: E2B's pause is the node's hibernate, and connecting to a paused
//! sandbox wakes it. These two functions are the only places that will call hibernate
//! and wake (issue 15); until those exist, pause answers 501 with a message saying so,
//! never a pretended success, and no sandbox is ever paused.

use std::sync::Arc;

use super::E2b;
use crate::claims::Sandbox;
use crate::error::{Error, Result};

/// The state E2B reports for a claimed sandbox.
pub fn state(_sandbox: &Sandbox) -> &'static str {
    "running"
}

/// `POST /sandboxes/{id}/pause`: will hibernate `sandbox`.
pub async fn pause(_e2b: &E2b, _sandbox: &Sandbox) -> Result<()> {
    Err(Error::Unsupported(
        "pause is not available on this node yet: it lands with hibernate (docs/e2b.md)".into(),
    ))
}

/// A sandbox about to be used: running (woken first, once wake exists, when paused),
/// or 404.
pub fn running(e2b: &E2b, id: &str) -> Result<Arc<Sandbox>> {
    e2b.node.sandbox(id)
}
