//! Exec admission: the node's exec limits from `[exec]` and the in-flight bounds, node-wide
//! and per tenant and per sandbox, so that one sandbox (or one tenant) flooding slow execs
//! leaves the rest of the node's share to the others. Beyond any bound: 503 with
//! `Retry-After`, naming the bound. An [`Admitted`] slot is freed when it is dropped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::capture::{Budget, Captured};
use crate::config::ExecConfig;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Execs in flight now, by holder; every count changes under one lock so the three bounds
/// are checked and taken together.
#[derive(Default)]
struct InFlight {
    node: u32,
    by_tenant: HashMap<String, u32>,
    by_sandbox: HashMap<String, u32>,
}

/// Exec limits and the state they guard.
pub struct Execs {
    pub(super) max_output: u64,
    max_in_flight: u32,
    max_per_tenant: u32,
    max_per_sandbox: u32,
    in_flight: Mutex<InFlight>,
    budget: Arc<Budget>,
    spill_dir: PathBuf,
    pub(super) metrics: Arc<Metrics>,
}

/// One admitted exec; frees its in-flight slots on drop.
pub struct Admitted {
    execs: Arc<Execs>,
    sandbox: String,
    tenant: Option<String>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut f = self.execs.in_flight.lock().expect("in-flight lock");
        f.node -= 1;
        release(&mut f.by_sandbox, &self.sandbox);
        if let Some(t) = &self.tenant {
            release(&mut f.by_tenant, t);
        }
        drop(f);
        self.execs.metrics.exec_in_flight.dec();
    }
}

/// Lowers a holder's count; a holder at zero leaves the map, so it does not grow with
/// every sandbox that ever ran an exec.
fn release(map: &mut HashMap<String, u32>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Execs {
    /// Limits from `[exec]`; spill files go under `spill_dir`.
    pub fn new(config: &ExecConfig, spill_dir: PathBuf, metrics: Arc<Metrics>) -> Execs {
        Execs {
            max_output: config.max_output_bytes,
            max_in_flight: config.max_in_flight,
            max_per_tenant: config.max_in_flight_per_tenant,
            max_per_sandbox: config.max_in_flight_per_sandbox,
            in_flight: Mutex::new(InFlight::default()),
            budget: Arc::new(Budget::new(config.memory_budget_bytes, metrics.clone())),
            spill_dir,
            metrics,
        }
    }

    /// Takes an in-flight slot for an exec in sandbox `id` of `tenant` (root's sandboxes
    /// have none), or 503 with `Retry-After` naming the bound that is full.
    pub fn admit(self: &Arc<Self>, id: &str, tenant: Option<&str>) -> Result<Admitted> {
        let busy = |reason: String| Error::Busy {
            reason,
            retry_after: 1,
        };
        let mut f = self.in_flight.lock().expect("in-flight lock");
        if f.by_sandbox.get(id).copied().unwrap_or(0) >= self.max_per_sandbox {
            return Err(busy(format!(
                "sandbox {id} has {} buffered execs in flight ([exec] max_in_flight_per_sandbox); \
                 retry later",
                self.max_per_sandbox
            )));
        }
        if let Some(t) = tenant {
            if f.by_tenant.get(t).copied().unwrap_or(0) >= self.max_per_tenant {
                return Err(busy(format!(
                    "tenant {t:?} has {} buffered execs in flight \
                     ([exec] max_in_flight_per_tenant); retry later",
                    self.max_per_tenant
                )));
            }
        }
        if f.node >= self.max_in_flight {
            return Err(busy(format!(
                "{} buffered execs in flight on this node ([exec] max_in_flight); retry later",
                self.max_in_flight
            )));
        }
        f.node += 1;
        *f.by_sandbox.entry(id.to_string()).or_default() += 1;
        if let Some(t) = tenant {
            *f.by_tenant.entry(t.to_string()).or_default() += 1;
        }
        drop(f);
        self.metrics.exec_in_flight.inc();
        Ok(Admitted {
            execs: self.clone(),
            sandbox: id.to_string(),
            tenant: tenant.map(str::to_string),
        })
    }

    /// An empty capture for one output stream, charged to the node's budget.
    pub(super) fn capture(&self) -> Captured {
        Captured::new(self.budget.clone(), self.spill_dir.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn execs(node: u32, tenant: u32, sandbox: u32) -> Arc<Execs> {
        let config = ExecConfig {
            max_in_flight: node,
            max_in_flight_per_tenant: tenant,
            max_in_flight_per_sandbox: sandbox,
            ..ExecConfig::default()
        };
        Arc::new(Execs::new(
            &config,
            PathBuf::from("/nonexistent"),
            Arc::new(Metrics::new()),
        ))
    }

    fn refusal(r: Result<Admitted>) -> String {
        match r {
            Err(e @ Error::Busy { .. }) => e.to_string(),
            Err(e) => panic!("not busy: {e}"),
            Ok(_) => panic!("admitted"),
        }
    }

    #[test]
    fn each_bound_is_its_own_and_named() {
        let e = execs(5, 3, 2);
        let a = [
            e.admit("sb-1", Some("t")).unwrap(),
            e.admit("sb-1", Some("t")).unwrap(),
        ];
        // sb-1 is full; its tenant and the node are not.
        assert!(refusal(e.admit("sb-1", Some("t"))).contains("max_in_flight_per_sandbox"));
        let b = e.admit("sb-2", Some("t")).unwrap();
        // Tenant t is full; another tenant and root's sandboxes are not.
        assert!(refusal(e.admit("sb-3", Some("t"))).contains("max_in_flight_per_tenant"));
        let c = e.admit("sb-4", Some("u")).unwrap();
        let d = e.admit("sb-5", None).unwrap();
        assert!(refusal(e.admit("sb-6", None)).contains("[exec] max_in_flight)"));
        // Dropping frees every count it took, and empty holders leave the maps.
        drop(a);
        let again = e.admit("sb-1", Some("t")).unwrap();
        drop((again, b, c, d));
        let f = e.in_flight.lock().unwrap();
        assert_eq!(f.node, 0);
        assert!(f.by_sandbox.is_empty() && f.by_tenant.is_empty());
    }
}
