//! `sbx exec --detach`, `sbx ps` and `sbx attach`: starting a command that outlives sbx,
//! listing what runs, and following one again (its retained output, then live).

use std::io::IsTerminal;

use sandbox_sdk::{Client, Command, ExitStatus, ProcState};

use crate::exec::{finish, Interrupts, Stop};

/// `sbx exec --detach ID -- ARGV`: prints the pid once it runs. Its stdin is a pipe
/// left open, for `sbx attach` to write to later.
pub async fn start(client: &Client, id: String, cmd: Command) -> u8 {
    match client
        .sandbox(id)
        .spawn(&cmd.detach(true).stdin(true))
        .await
    {
        Ok(p) => {
            println!("{}", p.pid());
            0
        }
        Err(e) => {
            eprintln!("sbx: {e}");
            125
        }
    }
}

/// `sbx ps ID`: one line per command: pid, state, start (Unix seconds), detached and
/// the bytes its ring dropped, then the argv.
pub async fn ps(client: &Client, id: String) -> u8 {
    let procs = match client.sandbox(id).processes().await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sbx: {e}");
            return 1;
        }
    };
    println!("PID\tSTATE\tSTARTED\tDETACHED\tDROPPED\tCOMMAND");
    for p in procs {
        let state = match (p.state, p.code, p.signal) {
            (ProcState::Running, ..) => "running".to_string(),
            (_, Some(c), _) => format!("exited({c})"),
            (_, _, Some(s)) => format!("killed({s})"),
            _ => "exited".to_string(),
        };
        let started = p
            .started_ms
            .map_or("-".into(), |ms| (ms / 1000).to_string());
        let dropped = p.dropped.map_or("-".into(), |d| d.to_string());
        println!(
            "{}\t{state}\t{started}\t{}\t{dropped}\t{}",
            p.pid,
            if p.detached { "yes" } else { "no" },
            p.argv.join(" ")
        );
    }
    0
}

/// `sbx attach ID PID`: the command's retained then live output on ours, our stdin to it
/// when ours is not a terminal; exits with its code. A signal to sbx detaches (the
/// command runs on) and exits 128 + N.
pub async fn attach(client: &Client, id: String, pid: u32) -> u8 {
    let interrupts = match Interrupts::install() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("sbx: {e}");
            return 125;
        }
    };
    finish(follow(client, id, pid, &interrupts).await)
}

async fn follow(
    client: &Client,
    id: String,
    pid: u32,
    interrupts: &Interrupts,
) -> Result<ExitStatus, Stop> {
    let mut process = client.sandbox(id).attach(pid).await?;
    if let Some(mut stdin) = process.stdin() {
        if !std::io::stdin().is_terminal() {
            tokio::spawn(async move {
                if tokio::io::copy(&mut tokio::io::stdin(), &mut stdin)
                    .await
                    .is_ok()
                {
                    let _ = stdin.close().await;
                }
            });
        }
    }
    tokio::select! {
        ended = crate::exec::copy_and_wait(&mut process) => ended,
        sig = interrupts.wait() => Err(Stop::Signal(sig)),
    }
}
