//! The progress line shown on a terminal while a slow call (claim, release) runs.

use std::future::Future;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Runs `work`; when stderr is a terminal and it takes over a second, shows the label and
/// the seconds elapsed until it is done.
pub async fn with_progress<T>(label: &str, work: impl Future<Output = T>) -> T {
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    let start = Instant::now();
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    tokio::pin!(work);
    let mut shown = false;
    let result = loop {
        tokio::select! {
            result = &mut work => break result,
            _ = tick.tick() => {
                eprint!("\r{label}... {}s", start.elapsed().as_secs());
                shown = true;
            }
        }
    };
    if shown {
        eprint!("\r\x1b[K");
    }
    result
}
