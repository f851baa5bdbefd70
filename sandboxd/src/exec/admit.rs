//! Exec admission: the node's exec limits from `[exec]` and the in-flight bound (503 with
//! `Retry-After` beyond it). An [`Admitted`] slot is freed when it is dropped.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::capture::{Budget, Captured};
use crate::config::ExecConfig;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Exec limits and the state they guard.
pub struct Execs {
    pub(super) max_output: u64,
    max_in_flight: u32,
    in_flight: AtomicU32,
    budget: Arc<Budget>,
    spill_dir: PathBuf,
    pub(super) metrics: Arc<Metrics>,
}

/// One admitted exec; frees its in-flight slot on drop.
pub struct Admitted {
    execs: Arc<Execs>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.execs.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.execs.metrics.exec_in_flight.dec();
    }
}

impl Execs {
    /// Limits from `[exec]`; spill files go under `spill_dir`.
    pub fn new(config: &ExecConfig, spill_dir: PathBuf, metrics: Arc<Metrics>) -> Execs {
        Execs {
            max_output: config.max_output_bytes,
            max_in_flight: config.max_in_flight,
            in_flight: AtomicU32::new(0),
            budget: Arc::new(Budget::new(config.memory_budget_bytes, metrics.clone())),
            spill_dir,
            metrics,
        }
    }

    /// Takes an in-flight slot, or 503 with `Retry-After`.
    pub fn admit(self: &Arc<Self>) -> Result<Admitted> {
        let max = self.max_in_flight;
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| Error::Busy {
                reason: format!("{max} buffered execs in flight; retry later"),
                retry_after: 1,
            })?;
        self.metrics.exec_in_flight.inc();
        Ok(Admitted {
            execs: self.clone(),
        })
    }

    /// An empty capture for one output stream, charged to the node's budget.
    pub(super) fn capture(&self) -> Captured {
        Captured::new(self.budget.clone(), self.spill_dir.clone())
    }
}
