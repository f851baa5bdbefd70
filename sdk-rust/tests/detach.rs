//! Detached commands through the SDK against a real sandboxd (process engine, real
//! silkd): one outlives its `Process`, is listed, is attached by a second client that sees
//! retained then live output, and is killed.

use sandbox_sdk::{ClaimOptions, Command, Error, Event, ExitStatus, ProcState};
use testkit::sdk::assert_nothing_runs;
use testkit::{bounded, Setup};

const COUNTER: &str = "i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done";

/// Numbers read from `p` until one past `beyond` arrived (complete lines only).
async fn numbers_until(p: &mut sandbox_sdk::Process, beyond: u64) -> Vec<u64> {
    let mut text = String::new();
    loop {
        match p.next_event().await.unwrap() {
            Some(Event::Stdout(b)) => text.push_str(&String::from_utf8_lossy(&b)),
            other => panic!("{other:?}"),
        }
        let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        let numbers: Vec<u64> = complete.lines().map(|l| l.parse().unwrap()).collect();
        if numbers.last().is_some_and(|n| *n > beyond) {
            return numbers;
        }
    }
}

#[tokio::test]
async fn detached_counter_survives_is_listed_attached_and_killed() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let cmd = Command::new("sh").args(["-c", COUNTER]).detach(true);
        let mut first = sandbox.spawn(&cmd).await.unwrap();
        let pid = first.pid();
        numbers_until(&mut first, 2).await;
        drop(first);

        let row = sandbox
            .processes()
            .await
            .unwrap()
            .into_iter()
            .find(|p| p.pid == pid)
            .expect("listed");
        assert_eq!(row.state, ProcState::Running, "survived its client");
        assert!(row.detached && row.started_ms.is_some(), "{row:?}");
        assert_eq!(row.argv, ["sh", "-c", COUNTER]);

        let mut second = sandbox.attach(pid).await.unwrap();
        let seen = numbers_until(&mut second, 20).await;
        assert_eq!(seen[..3], [0, 1, 2], "retained output first");
        assert!(
            seen.windows(2).all(|w| w[1] == w[0] + 1),
            "then live: {seen:?}"
        );
        second.kill().await.unwrap();
        assert_eq!(second.wait().await.unwrap(), ExitStatus::Signal(9));
        assert_nothing_runs(&sandbox).await;

        // Refusals: an unknown pid, buffered exec of a detached command.
        let refused = sandbox.attach(999_999).await;
        assert!(matches!(refused, Err(Error::NotFound)), "{refused:?}");
        let refused = sandbox.exec(&cmd).await;
        assert!(matches!(refused, Err(Error::BadRequest(_))), "{refused:?}");
        sandbox.release().await.unwrap();
    })
    .await
}
