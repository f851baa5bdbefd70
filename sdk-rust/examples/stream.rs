//! Stream a long command's output as it is written, and give up on it after a deadline:
//! the command is killed, nothing keeps running in the sandbox.
//! Run with `SANDBOXD_URL` and `SANDBOXD_TOKEN` set: `cargo run -p sdk-rust --example stream`.

use std::time::Duration;

use sandbox_sdk::{ClaimOptions, Client, Command, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Client::from_env()?;
    let sandbox = client.claim(ClaimOptions::new()).await?;

    // Counts forever, one line every 100 ms.
    let cmd = Command::shell("i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.1; done");
    let mut process = sandbox.spawn(&cmd).await?;
    println!("started pid {}", process.pid());

    // Print stdout lines as they arrive, in a task of their own (no extra crate needed:
    // `next_line`, or `next_chunk` for raw bytes).
    let mut lines = process.take_stdout().expect("not taken yet").lines();
    let printer = tokio::spawn(async move {
        while let Some(line) = lines.next_line().await {
            println!("{line}");
        }
    });

    // Give up after a second: the command is killed and `Timeout` returned.
    match process.wait_timeout(Duration::from_secs(1)).await {
        Err(Error::Timeout { .. }) => println!("gave up after 1s; killed"),
        other => println!("ended by itself: {other:?}"),
    }
    printer.await.expect("printer task");

    let still_running = sandbox
        .processes()
        .await?
        .into_iter()
        .filter(|p| p.state == sandbox_sdk::ProcState::Running)
        .count();
    println!("still running: {still_running}");
    sandbox.release().await?;
    Ok(())
}
