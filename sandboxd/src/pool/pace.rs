//! Refill pacing: the API requests in flight on the node, and the wait a refill start
//! makes (bounded) for a moment with none, so warming guests yield the CPU to the claims
//! and execs they are warmed for.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// The longest a refill start waits for the node to go quiet. Under sustained load the
/// refill runs anyway, this much later; a burst shorter than this never competes with it.
pub const REFILL_YIELD: Duration = Duration::from_millis(250);

/// API requests in flight, and a wake-up when the count reaches zero.
#[derive(Default)]
pub struct Pace {
    in_flight: AtomicUsize,
    quiet: Notify,
}

/// One request in flight, counted until dropped.
pub struct Busy(Arc<Pace>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.quiet.notify_waiters();
        }
    }
}

impl Pace {
    /// Counts a request until the guard is dropped.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    /// Returns once no request is in flight, or after `most`.
    pub async fn quiet(&self, most: Duration) {
        let deadline = tokio::time::Instant::now() + most;
        loop {
            let notified = self.quiet.notified();
            tokio::pin!(notified);
            // Registered before the check, so a drop to zero in between is not missed.
            notified.as_mut().enable();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn quiet_waits_for_the_last_request_or_the_bound() {
        let pace = Arc::new(Pace::default());
        // Nothing in flight: at once.
        let t = tokio::time::Instant::now();
        pace.quiet(REFILL_YIELD).await;
        assert_eq!(t.elapsed(), Duration::ZERO);

        // Two requests; the wait ends when the second one ends, not the first.
        let (a, b) = (pace.busy(), pace.busy());
        let p = pace.clone();
        let waiter = tokio::spawn(async move {
            let t = tokio::time::Instant::now();
            p.quiet(Duration::from_secs(10)).await;
            t.elapsed()
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(a);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished());
        drop(b);
        assert_eq!(waiter.await.unwrap(), Duration::from_millis(20));

        // A request that never ends: the bound.
        let _held = pace.busy();
        let t = tokio::time::Instant::now();
        pace.quiet(REFILL_YIELD).await;
        assert_eq!(t.elapsed(), REFILL_YIELD);
    }
}
