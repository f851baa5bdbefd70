//! A pool's worker: golden first, then keep `target` idle guests, started with bounded
//! concurrency (the node's `refill_concurrency`), with exponential backoff after failures;
//! idle guests that died on their own are dropped and replaced, surplus ones destroyed.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::golden::GoldenState;
use super::{PoolKey, Pools};
use crate::engine::Guest;
use crate::metrics::{PoolLabel, WaitLabel};

/// How often a full pool looks for idle guests that died on their own.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Exponential backoff after `failures` consecutive failures: 0.5 s doubling to 60 s.
fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(7);
    Duration::from_millis(500 << exp).min(Duration::from_secs(60))
}

impl Pools {
    async fn pause(&self, wait: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.shutdown.cancelled() => {}
        }
    }

    /// One pool's loop: golden first, then keep `target` idle guests.
    pub(super) async fn worker(self: Arc<Self>, key: PoolKey) {
        let Some(wake) = self.with_pool(&key, |p| p.wake.clone()) else {
            return;
        };
        let label = PoolLabel {
            pool: key.to_string(),
        };
        let mut failures = 0u32;
        while !self.shutdown.is_cancelled() {
            let Some((golden, want, surplus)) = self.with_pool(&key, |p| {
                // Idle guests that died on their own are dropped, and replaced below.
                let (mut dead, alive): (Vec<_>, Vec<_>) =
                    p.idle.drain(..).partition(|g| g.failure().is_some());
                p.idle.extend(alive);
                let have = p.idle.len() as u32;
                dead.extend((p.target..have).filter_map(|_| p.idle.pop_back()));
                (p.golden, p.target.saturating_sub(have), dead)
            }) else {
                return;
            };
            self.metrics
                .pool_warm
                .get_or_create(&label)
                .set(self.with_pool(&key, |p| p.idle.len() as i64).unwrap_or(0));
            if !surplus.is_empty() {
                futures::future::join_all(surplus.iter().map(|g| g.destroy())).await;
                continue;
            }
            if want > 0 && golden != GoldenState::Ready {
                match self.build_golden(&key).await {
                    Ok(()) => failures = 0,
                    Err(_) => {
                        failures += 1;
                        self.pause(backoff(failures)).await;
                    }
                }
                continue;
            }
            if want == 0 {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = self.shutdown.cancelled() => {}
                    // Re-check now and then for idle guests that died.
                    () = tokio::time::sleep(IDLE_CHECK) => {}
                }
                continue;
            }
            let Some(spec) = self.with_pool(&key, |p| p.spec.clone()) else {
                return;
            };
            let mut starts = JoinSet::new();
            for _ in 0..want {
                let this = self.clone();
                let spec = spec.clone();
                starts.spawn(async move {
                    let asked = std::time::Instant::now();
                    this.pace.quiet(super::pace::REFILL_YIELD).await;
                    let _permit = this.refill.clone().acquire_owned().await;
                    this.metrics
                        .admission_wait_seconds
                        .get_or_create(&WaitLabel { kind: "start" })
                        .observe(asked.elapsed().as_secs_f64());
                    this.start_primed(&spec).await
                });
            }
            let mut failed = None;
            while let Some(joined) = starts.join_next().await {
                match joined {
                    Ok(Ok(g)) => self.add_idle(&key, g).await,
                    Ok(Err(e)) => failed = Some(e.to_string()),
                    Err(e) => failed = Some(format!("refill task failed: {e}")),
                }
            }
            self.with_pool(&key, |p| p.refill_error = failed.clone());
            if let Some(e) = failed {
                tracing::warn!(pool = %key, "refill failed: {e}");
                failures += 1;
                self.pause(backoff(failures)).await;
            } else {
                failures = 0;
            }
        }
    }

    async fn add_idle(&self, key: &PoolKey, guest: Arc<dyn Guest>) {
        let rejected = if self.shutdown.is_cancelled() {
            Some(guest)
        } else {
            self.with_pool(key, |p| {
                if (p.idle.len() as u32) < p.target {
                    p.idle.push_back(guest);
                    p.joined.notify_waiters();
                    None
                } else {
                    Some(guest)
                }
            })
            .flatten()
        };
        if let Some(g) = rejected {
            g.destroy().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(8), Duration::from_secs(60));
        assert_eq!(backoff(100), Duration::from_secs(60));
    }
}
