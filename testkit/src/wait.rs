//! Waiting on a condition with a deadline: the one polling loop every test uses, so no
//! test sleeps and hopes. And [`bounded`], which turns a hang into a failure.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`wait_until`] looks again.
const POLL: Duration = Duration::from_millis(10);

/// What a condition reports on each look: ready (with a value), or not yet.
pub trait Condition {
    /// What [`wait_until`] returns once the condition holds.
    type Output;
    /// `Ok` when the condition holds; `Err` with what was seen otherwise.
    fn check(self) -> Result<Self::Output, String>;
}

impl Condition for bool {
    type Output = ();
    fn check(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("false".into())
        }
    }
}

impl<T> Condition for Option<T> {
    type Output = T;
    fn check(self) -> Result<T, String> {
        self.ok_or_else(|| "None".into())
    }
}

/// `Err(e)`: not yet, and `e` (the last one) goes into the timeout message.
impl<T, E: Debug> Condition for Result<T, E> {
    type Output = T;
    fn check(self) -> Result<T, String> {
        self.map_err(|e| format!("{e:?}"))
    }
}

/// Polls `condition` until it holds and returns its value; panics naming `what` and the
/// last thing seen once `within` has passed.
pub async fn wait_until<C: Condition>(
    within: Duration,
    what: &str,
    mut condition: impl AsyncFnMut() -> C,
) -> C::Output {
    let deadline = Instant::now() + within;
    loop {
        match condition().await.check() {
            Ok(value) => return value,
            Err(seen) => assert!(
                Instant::now() < deadline,
                "timed out after {within:?} waiting for {what}; last seen: {seen}"
            ),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A [`wait_until`] condition on a list: holds when it is empty, else shows it.
pub fn empty<T>(items: Vec<T>) -> Result<(), Vec<T>> {
    if items.is_empty() {
        Ok(())
    } else {
        Err(items)
    }
}

/// Bound on one test's body: a hang fails instead of stalling the suite.
pub const TEST_BOUND: Duration = Duration::from_secs(60);

/// Runs a test body, failing it if it takes longer than [`TEST_BOUND`].
pub async fn bounded<T>(body: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, body)
        .await
        .expect("test body exceeded its time bound")
}
