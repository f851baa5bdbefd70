//! Suite `tti`: time to interactive, a load generator on the SDK. Each user claims,
//! runs `echo hi` (buffered exec, or the relay: spawn, read, wait) and releases; the
//! time from claim to release answered is one sample, failures are counted. At
//! concurrency 1, 16 and 100 against a warm pool at least that large (refilled before
//! each round), and a burst of users past a smaller pool; next to a host fork+exec+wait
//! of `echo hi` measured in the same run. Process engine: a hundred warm TCG guests do
//! not fit this machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_sdk::{ClaimOptions, Client, Command};

use crate::node::{host_spawn, BoxError, Engine, Node, Shape};
use crate::stats::{Samples, Table};

#[derive(Clone, Copy)]
enum Mode {
    Buffered,
    Relay,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Buffered => "buffered exec",
            Mode::Relay => "relay",
        }
    }
}

/// One user's phases: claim, `echo hi`, release.
#[derive(Default)]
struct Phases {
    claim: Samples,
    exec: Samples,
    release: Samples,
}

impl Phases {
    /// The phases' rows under their level's row.
    fn rows(&self, table: &mut Table) {
        table.row("  of which claim", &self.claim, None);
        table.row("  of which exec", &self.exec, None);
        table.row("  of which release", &self.release, None);
    }
}

/// One user's claim, `echo hi` and release; each phase's time into `phases`.
async fn user(client: &Client, mode: Mode) -> Result<[Duration; 3], BoxError> {
    let t = Instant::now();
    let sandbox = client.claim(ClaimOptions::new()).await?;
    let claimed = t.elapsed();
    let cmd = Command::new("echo").arg("hi");
    let out = match mode {
        Mode::Buffered => sandbox.exec(&cmd).await.map(|o| o.stdout.to_vec()),
        Mode::Relay => {
            async {
                let mut p = sandbox.spawn(&cmd).await?;
                let mut out = p.take_stdout().expect("stdout");
                let mut got = Vec::new();
                while let Some(c) = out.next_chunk().await {
                    got.extend_from_slice(&c);
                }
                p.wait().await?;
                Ok(got)
            }
            .await
        }
    };
    let executed = t.elapsed();
    let released = sandbox.release().await;
    let done = t.elapsed();
    let out = out?;
    released?;
    if out != b"hi\n" {
        return Err(format!("echo said {:?}", String::from_utf8_lossy(&out)).into());
    }
    Ok([claimed, executed - claimed, done - executed])
}

/// `users` users at once; their times and failures added to `s`, their phases' to `phases`.
async fn round(client: &Client, mode: Mode, users: usize, s: &mut Samples, phases: &mut Phases) {
    let mut tasks = Vec::new();
    for _ in 0..users {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            user(&client, mode)
                .await
                .map(|p| (t.elapsed(), p))
                .map_err(|e| e.to_string())
        }));
    }
    for t in tasks {
        match t.await {
            Ok(Ok((d, [claim, exec, release]))) => {
                s.push(d);
                phases.claim.push(claim);
                phases.exec.push(exec);
                phases.release.push(release);
            }
            Ok(Err(e)) => {
                eprintln!("bench tti: {e}");
                s.failures += 1;
            }
            Err(_) => s.failures += 1,
        }
    }
}

/// Concurrency levels (users at once, rounds) and the burst (users, warm pool).
struct Plan {
    levels: Vec<(usize, usize)>,
    burst: (usize, u32),
}

pub async fn run(engine: Engine, quick: bool) -> Result<(), BoxError> {
    if engine != Engine::Process {
        return Err("tti runs on the process engine only".into());
    }
    let plan = if quick {
        Plan {
            levels: vec![(1, 10), (16, 1)],
            burst: (24, 8),
        }
    } else {
        Plan {
            levels: vec![(1, 50), (16, 5), (100, 3)],
            burst: (100, 32),
        }
    };
    let big = plan.levels.iter().map(|l| l.0).max().unwrap_or(1) as u32;
    let shape = |warm| Shape {
        warm,
        max_claims: 256,
        max_in_flight: 256,
        max_output_bytes: 1 << 20,
    };
    let mut table = Table::new("tti", engine.name());
    let floor = host_spawn(&["echo", "hi"], 50)?;
    table.floor("host fork+exec+wait `echo hi`", &floor, None);
    {
        let node = Node::start(engine, shape(big)).await?;
        let client = node.client();
        for mode in [Mode::Buffered, Mode::Relay] {
            for &(users, rounds) in &plan.levels {
                let (mut s, mut phases) = (Samples::default(), Phases::default());
                for _ in 0..rounds {
                    node.wait_warm(users as u32).await;
                    round(&client, mode, users, &mut s, &mut phases).await;
                }
                let what = format!("{}, concurrency {users}, pool {big}", mode.name());
                table.row(&what, &s, None);
                phases.rows(&mut table);
            }
        }
    }
    let (users, pool) = plan.burst;
    let node = Node::start(engine, shape(pool)).await?;
    let client = Arc::new(node.client());
    for mode in [Mode::Buffered, Mode::Relay] {
        node.wait_warm(pool).await;
        let (mut s, mut phases) = (Samples::default(), Phases::default());
        round(&client, mode, users, &mut s, &mut phases).await;
        let what = format!("{}, burst of {users} past pool {pool}", mode.name());
        table.row(&what, &s, None);
        phases.rows(&mut table);
    }
    Ok(())
}
