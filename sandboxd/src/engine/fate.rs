//! How a guest ended, recorded once by its engine's supervisor (the task that owns the
//! guest's process and sees it exit) and read by everyone else: claims, pools, exec,
//! relay. The one source of truth for "this sandbox has failed"; nothing polls `/proc`
//! or keeps a failure of its own.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The end of a guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// It died on its own (its VM or namespace init exited); why, for users and logs.
    Failed(Arc<str>),
    /// sandboxd destroyed it (release, TTL, shutdown, a failed start).
    Destroyed,
}

/// The record of one guest's end; cheap to clone, all clones share it. The first
/// ending recorded wins: a guest destroyed on purpose never turns into a failure when its
/// process exits afterwards, and a failure is never overwritten by the destroy that
/// follows it.
#[derive(Clone)]
pub struct Fate {
    tx: Arc<watch::Sender<Option<Ending>>>,
}

impl Default for Fate {
    fn default() -> Fate {
        Fate {
            tx: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl Fate {
    /// A guest that has not ended.
    pub fn new() -> Fate {
        Fate::default()
    }

    /// Records that the guest died on its own, unless an ending is recorded already.
    pub fn fail(&self, why: impl Into<String>) {
        let why: Arc<str> = why.into().into();
        self.tx.send_if_modified(|e| match e {
            None => {
                *e = Some(Ending::Failed(why));
                true
            }
            Some(_) => false,
        });
    }

    /// Records that sandboxd destroyed the guest, unless an ending is recorded already.
    pub fn destroyed(&self) {
        self.tx.send_if_modified(|e| match e {
            None => {
                *e = Some(Ending::Destroyed);
                true
            }
            Some(_) => false,
        });
    }

    /// Why the guest died on its own, once it has.
    pub fn failure(&self) -> Option<String> {
        match &*self.tx.borrow() {
            Some(Ending::Failed(why)) => Some(why.to_string()),
            _ => None,
        }
    }

    /// The ending, if any.
    pub fn ending(&self) -> Option<Ending> {
        self.tx.borrow().clone()
    }

    /// Waits up to `bound` for an ending and returns the failure, if that is how it
    /// ended. A channel that broke is often the first sign of a guest dying; its
    /// supervisor sees the exit a few milliseconds later.
    pub async fn failure_within(&self, bound: Duration) -> Option<String> {
        let mut rx = self.tx.subscribe();
        let _ = tokio::time::timeout(bound, rx.wait_for(Option::is_some)).await;
        self.failure()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_ending_wins() {
        let f = Fate::new();
        assert_eq!(f.ending(), None);
        f.fail("QEMU exited");
        f.destroyed();
        f.fail("later");
        assert_eq!(f.failure().as_deref(), Some("QEMU exited"));
        let d = Fate::new();
        d.destroyed();
        d.fail("exit after kill");
        assert_eq!(d.failure(), None);
        assert_eq!(d.ending(), Some(Ending::Destroyed));
    }

    #[tokio::test(start_paused = true)]
    async fn failure_within_waits_for_the_supervisor() {
        let f = Fate::new();
        let g = f.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            g.fail("namespace init exited");
        });
        let started = tokio::time::Instant::now();
        assert_eq!(
            f.failure_within(Duration::from_millis(500))
                .await
                .as_deref(),
            Some("namespace init exited")
        );
        assert!(started.elapsed() < Duration::from_millis(100));
        let quiet = Fate::new();
        assert_eq!(quiet.failure_within(Duration::from_millis(500)).await, None);
    }
}
