//! Detached commands through the SDK against a real sandboxd (process engine, real
//! silkd): one outlives its `Process`, is listed, is attached by a second client that sees
//! retained then live output, and is killed; and with the template's `detach_ring_bytes`
//! set small, an attach gets only the newest bytes and `processes()` counts the rest.

use std::time::Duration;

use sandbox_sdk::{ClaimOptions, Command, Error};
use testkit::detach::{
    counter_survives_is_listed_attached_and_killed, ring_keeps_the_newest_bytes, COUNTER,
};
use testkit::{bounded, Setup};

#[tokio::test]
async fn detached_counter_survives_is_listed_attached_and_killed() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        counter_survives_is_listed_attached_and_killed(&sandbox).await;

        // Refusals: an unknown pid, buffered exec of a detached command.
        let refused = sandbox.attach(999_999).await;
        assert!(
            matches!(refused, Err(Error::NotFound { .. })),
            "{refused:?}"
        );
        let cmd = Command::new("sh").args(["-c", COUNTER]).detach(true);
        let refused = sandbox.exec(&cmd).await;
        assert!(matches!(refused, Err(Error::BadRequest(_))), "{refused:?}");
        sandbox.release().await.unwrap();
    })
    .await
}

/// `[templates.base] detach_ring_bytes` reaches the process engine's silkd.
#[tokio::test]
async fn the_configured_ring_keeps_the_newest_bytes_and_counts_the_rest() {
    const RING: usize = 4096;
    let setup = Setup {
        template_extra: format!("detach_ring_bytes = {RING}"),
        ..Setup::sdk()
    };
    let d = testkit::sdk::start(setup).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        ring_keeps_the_newest_bytes(&sandbox, RING, Duration::from_secs(20)).await;
        sandbox.release().await.unwrap();
    })
    .await
}
