//! Claim a sandbox, run a shell line, stream a command's lines as they come, give it back.
//! Run with `SANDBOXD_URL` and `SANDBOXD_TOKEN` set: `cargo run -p sdk-rust --example quickstart`.

use sandbox_sdk::{ClaimOptions, Client, Command};

#[tokio::main]
async fn main() -> Result<(), sandbox_sdk::Error> {
    let client = Client::from_env()?;
    // Released however the closure ends: done, an early `?` error, or a panic.
    client
        .with_sandbox(ClaimOptions::new(), |sandbox| async move {
            // A shell line, buffered; `check` makes a non-zero exit an error.
            let cmd = Command::shell("cd /tmp && echo hello > f && cat f");
            print!("{}", sandbox.exec(&cmd).await?.check()?.stdout_text());

            // Each line as it is written; the whole output at the end.
            let cmd = Command::shell("for i in 1 2 3; do echo line $i; done");
            let out = sandbox.exec_lines(&cmd, |line| println!("{line}")).await?;
            println!("exited: {}", out.exit);
            Ok(())
        })
        .await
}
