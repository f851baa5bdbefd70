//! Suite `exec`: the round trip of `true` by buffered exec (HTTP, pooled connection), by
//! relay on a kept connection (one upgraded stream, `Exec` after `Exec`) and by relay on
//! a fresh connection (the SDK's `spawn` + `wait`), next to a host fork+exec+wait of
//! `true`, interleaved round by round so machine noise hits all alike; then the first
//! buffered exec in a sandbox just claimed from the warm pool (a fresh VM clone), to set
//! beside the steady buffered row.

use std::time::Instant;

use futures::{SinkExt, StreamExt};
use sandbox_sdk::{ClaimOptions, Command};
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

use crate::node::{host_spawn, BoxError, Engine, Node, Shape};
use crate::stats::{Samples, Table};

pub fn true_exec() -> Request {
    Request::Exec {
        detach: false,
        pty: None,
        argv: vec!["true".into()],
        cwd: None,
        env: None,
        stdin: false,
        timeout_ms: None,
        user: None,
    }
}

/// Sends `true` on a kept relay and reads to its `Exit`.
async fn relay_true(relay: &mut Framed<tokio::net::TcpStream, HostCodec>) -> Result<(), BoxError> {
    relay.send(true_exec()).await?;
    loop {
        match relay.next().await.ok_or("relay closed")?? {
            Response::Exit { code: Some(0), .. } => return Ok(()),
            Response::Started { .. } => {}
            other => return Err(format!("unexpected {other:?}").into()),
        }
    }
}

pub async fn run(engine: Engine, quick: bool) -> Result<(), BoxError> {
    let n = match (engine, quick) {
        (Engine::Process, false) => 300,
        (Engine::Qemu, false) => 100,
        (_, true) => 20,
    };
    let node = Node::start(
        engine,
        Shape {
            warm: 1,
            max_claims: 4,
            max_in_flight: 16,
            max_output_bytes: 1 << 20,
        },
    )
    .await?;
    node.wait_warm(1).await;
    let client = node.client();
    let sandbox = client.claim(ClaimOptions::new()).await?;
    let token = sandbox.token().ok_or("no sandbox token")?.to_string();
    let path = format!("/v1/sandboxes/{}/agent", sandbox.id());
    let (status, stream, rest) =
        testkit::relay::upgrade(node.daemon.addr(), &path, Some(&token)).await;
    if status != 101 || !rest.is_empty() {
        return Err(format!("relay upgrade answered {status}").into());
    }
    let mut relay = Framed::new(stream, HostCodec::new());
    let cmd = Command::new("true");
    let (mut floor, mut buffered, mut kept, mut fresh) = Default::default();
    let (floor, buffered, kept, fresh): (&mut Samples, &mut Samples, &mut Samples, &mut Samples) =
        (&mut floor, &mut buffered, &mut kept, &mut fresh);
    for i in 0..n + 5 {
        let warm_up = i < 5;
        let f = host_spawn(&["true"], 1)?;
        let t = Instant::now();
        let ok = matches!(sandbox.exec(&cmd).await, Ok(o) if o.exit.success());
        let b = t.elapsed();
        let t = Instant::now();
        let k_ok = relay_true(&mut relay).await.is_ok();
        let k = t.elapsed();
        let t = Instant::now();
        let r_ok = match sandbox.spawn(&cmd).await {
            Ok(mut p) => p.wait().await.is_ok_and(|s| s.success()),
            Err(_) => false,
        };
        let r = t.elapsed();
        if warm_up {
            continue;
        }
        floor.push(f.median());
        for (s, ok, d) in [
            (&mut *buffered, ok, b),
            (&mut *kept, k_ok, k),
            (&mut *fresh, r_ok, r),
        ] {
            if ok {
                s.push(d);
            } else {
                s.failures += 1;
            }
        }
    }
    let first = first_execs(&node, &cmd, if quick { 3 } else { 10 }).await;
    let mut table = Table::new("exec", engine.name());
    table.floor("host fork+exec+wait `true`", floor, None);
    table.row(
        "buffered exec `true` (HTTP, kept connection)",
        buffered,
        None,
    );
    table.row("relay `true`, kept connection", kept, None);
    table.row(
        "relay `true`, fresh connection (SDK spawn+wait)",
        fresh,
        None,
    );
    table.row(
        "buffered exec `true`, first in a fresh warm claim",
        &first,
        None,
    );
    drop(relay);
    sandbox.release().await?;
    Ok(())
}

/// The first buffered `true` in each of `n` sandboxes claimed from a refilled warm pool.
async fn first_execs(node: &Node, cmd: &Command, n: usize) -> Samples {
    let client = node.client();
    let mut first = Samples::default();
    for _ in 0..n {
        node.wait_warm(1).await;
        let Ok(sandbox) = client.claim(ClaimOptions::new()).await else {
            first.failures += 1;
            continue;
        };
        let t = Instant::now();
        match sandbox.exec(cmd).await {
            Ok(o) if o.exit.success() => first.push(t.elapsed()),
            _ => first.failures += 1,
        }
        let _ = sandbox.release().await;
    }
    first
}
