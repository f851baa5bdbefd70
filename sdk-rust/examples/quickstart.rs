//! Claim a sandbox, run a command, stream another one fed through stdin, give it back.
//! Run with `SANDBOXD_URL` and `SANDBOXD_TOKEN` set: `cargo run -p sdk-rust --example quickstart`.

use sandbox_sdk::{ClaimOptions, Client, Command, Event};

#[tokio::main]
async fn main() -> Result<(), sandbox_sdk::Error> {
    let client = Client::from_env()?;
    let sandbox = client.claim(ClaimOptions::new()).await?;

    // Buffered: run to completion, get the exit status and the exact output bytes.
    let out = sandbox.exec(&Command::new("uname").arg("-a")).await?;
    print!("{}", String::from_utf8_lossy(&out.stdout));

    // Streaming: output arrives while the command runs; stdin is ours to write.
    let cmd = Command::new("sh")
        .args(["-c", "tr a-z A-Z; echo done >&2"])
        .stdin(true);
    let mut process = sandbox.spawn(&cmd).await?;
    let mut stdin = process.stdin().expect("spawned with stdin");
    stdin.send(b"hello from a sandbox\n").await?;
    stdin.close().await?; // EOF
    while let Some(event) = process.next_event().await? {
        match event {
            Event::Stdout(bytes) => print!("{}", String::from_utf8_lossy(&bytes)),
            Event::Stderr(bytes) => eprint!("{}", String::from_utf8_lossy(&bytes)),
            Event::Exit(status) => println!("exited: {status}"),
        }
    }

    sandbox.release().await?;
    Ok(())
}
