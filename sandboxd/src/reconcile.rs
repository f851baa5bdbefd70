//! Start-up reconciliation between the state database and what is running: every
//! recorded claim whose guest is alive and provably ours is re-adopted (its channel
//! re-opened and answering `Info`), a claim whose guest is gone or whose deadline passed
//! is dropped and logged, and then the engine sweeps every guest, socket, cgroup and file
//! that no kept claim owns. Runs before pools start, so no fresh guest is swept.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::claims::now_ms;
use crate::engine::{Engine, Guest, GuestHandle};
use crate::error::Result;
use crate::store::{ClaimRecord, Store};

/// Bound on a re-adopted guest's `Info` answer.
const INFO_BOUND: Duration = Duration::from_secs(5);

/// What reconciliation found.
pub struct Reconciled {
    /// Claims whose guests were re-adopted, with those guests.
    pub adopted: Vec<(ClaimRecord, Arc<dyn Guest>)>,
    /// Claims dropped because their guest was gone (or not provably ours).
    pub gone: usize,
    /// Claims dropped because their deadline passed while sandboxd was down.
    pub expired: usize,
    /// How long it took.
    pub elapsed: Duration,
}

/// Re-adopts what it can of `store`'s claims, deletes the records of the rest, and sweeps.
/// A hibernated claim is kept, without a guest, while its files under `hibernated` are
/// there (they are all it is); they are deleted with an expired claim.
pub async fn reconcile(
    engine: &dyn Engine,
    store: &Store,
    hibernated: &std::path::Path,
) -> Result<Reconciled> {
    let started = Instant::now();
    let now = now_ms();
    let records = store.claims()?;
    let mut expired = 0;
    let mut candidates = Vec::new();
    let mut dormant = Vec::new();
    for rec in records {
        if rec.deadline_ms <= now {
            tracing::info!(id = %rec.id, "claim expired while sandboxd was down; reaping it");
            store.delete_claim(&rec.id)?;
            if crate::hibernate::is_sandbox_id(&rec.id) {
                let _ = std::fs::remove_dir_all(hibernated.join(&rec.id));
            }
            expired += 1;
        } else if rec.hibernated {
            if crate::hibernate::is_sandbox_id(&rec.id) && hibernated.join(&rec.id).is_dir() {
                tracing::info!(id = %rec.id, "kept hibernated sandbox");
                dormant.push(rec);
            } else {
                tracing::warn!(id = %rec.id, "dropping hibernated claim: its files are gone");
                store.delete_claim(&rec.id)?;
            }
        } else {
            candidates.push(rec);
        }
    }
    // Concurrently: each adoption waits for its guest's `Info`.
    let tried = futures::future::join_all(candidates.into_iter().map(|rec| async move {
        let outcome = adopt_one(engine, &rec).await;
        (rec, outcome)
    }))
    .await;
    let mut adopted: Vec<(ClaimRecord, Arc<dyn Guest>)> = dormant
        .into_iter()
        .map(|rec| {
            let guest = Arc::new(crate::hibernate::Dormant::new(&rec.id)) as Arc<dyn Guest>;
            (rec, guest)
        })
        .collect();
    let mut gone = 0;
    for (rec, outcome) in tried {
        match outcome {
            Ok(guest) => {
                tracing::info!(id = %rec.id, guest = guest.id(), "re-adopted sandbox");
                adopted.push((rec, guest));
            }
            Err(why) => {
                tracing::warn!(id = %rec.id, "dropping claim: its sandbox is gone: {why}");
                store.delete_claim(&rec.id)?;
                gone += 1;
            }
        }
    }
    let keep: Vec<GuestHandle> = adopted.iter().filter_map(|(_, g)| g.handle()).collect();
    engine.sweep(&keep);
    let elapsed = started.elapsed();
    tracing::info!(
        adopted = adopted.len(),
        gone,
        expired,
        ?elapsed,
        "reconciled the state database with running sandboxes"
    );
    Ok(Reconciled {
        adopted,
        gone,
        expired,
        elapsed,
    })
}

async fn adopt_one(engine: &dyn Engine, rec: &ClaimRecord) -> Result<Arc<dyn Guest>, String> {
    let handle = rec
        .handle
        .as_ref()
        .ok_or_else(|| "no engine handle was recorded (its engine cannot re-adopt)".to_string())?;
    let guest = engine.adopt(handle).await.map_err(|e| e.to_string())?;
    // The guest is ours and alive; it must also answer on a fresh channel session.
    if let Err(e) = crate::guest::info(&*guest, INFO_BOUND).await {
        guest.destroy().await;
        return Err(format!("its guest did not answer Info: {e}"));
    }
    Ok(guest)
}
