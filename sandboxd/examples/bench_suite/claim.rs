//! Suite `claim`: a warm hit (the pool refilled before each claim) and a pool miss (the
//! pool's one warm guest held: a process start, or a clone of the golden), each timed by the client
//! (claim request to answer, a fresh connection) and by the server (`Server-Timing`),
//! next to a host fork+exec+wait of `true`. A cold VM boot is the `vm` suite's row
//! (start to `Info` through the engine), since a node boots cold only without a golden.

use std::time::{Duration, Instant};

use testkit::ROOT;

use crate::node::{host_spawn, BoxError, Engine, Node, Shape};
use crate::stats::{Samples, Table};

/// `claim;dur=MS` from the claim's `Server-Timing`.
fn server_time(headers: &hyper::HeaderMap) -> Option<Duration> {
    let v = headers.get("server-timing")?.to_str().ok()?;
    let ms: f64 = v.split_once("dur=")?.1.parse().ok()?;
    Some(Duration::from_secs_f64(ms / 1e3))
}

/// One claim and its release; the claim's client and server time.
async fn claim_once(node: &Node) -> Result<(Duration, Duration), BoxError> {
    let t = Instant::now();
    let r = node
        .daemon
        .call("POST", "/v1/claim", Some(ROOT), Some("{}"))
        .await;
    let client = t.elapsed();
    if r.status != 200 {
        return Err(format!("claim: {} {}", r.status, r.text()).into());
    }
    let server = server_time(&r.headers).ok_or("no Server-Timing")?;
    let id = r.json()["id"].as_str().ok_or("no id")?.to_string();
    let path = format!("/v1/sandboxes/{id}/release");
    let rel = node.daemon.call("POST", &path, Some(ROOT), None).await;
    if rel.status != 204 && rel.status != 200 {
        return Err(format!("release: {}", rel.status).into());
    }
    Ok((client, server))
}

async fn measure(node: &Node, n: usize) -> Result<(Samples, Samples, Samples), BoxError> {
    let (mut floor, mut client, mut server) = Default::default();
    for _ in 0..n {
        node.wait_warm(1).await;
        let f: Samples = host_spawn(&["true"], 1)?;
        Samples::push(&mut floor, f.median());
        match claim_once(node).await {
            Ok((c, s)) => {
                Samples::push(&mut client, c);
                Samples::push(&mut server, s);
            }
            Err(e) => {
                eprintln!("bench claim: {e}");
                client.failures += 1;
            }
        }
    }
    Ok((floor, client, server))
}

pub async fn run(engine: Engine, quick: bool) -> Result<(), BoxError> {
    let n = match (engine, quick) {
        (Engine::Process, false) => 100,
        (Engine::Qemu, false) => 20,
        (_, true) => 5,
    };
    let shape = |warm| Shape {
        warm,
        max_claims: 4,
        max_in_flight: 8,
        max_output_bytes: 1 << 20,
    };
    let mut table = Table::new("claim", engine.name());
    {
        let node = Node::start(engine, shape(1)).await?;
        let (floor, client, server) = measure(&node, n).await?;
        table.floor("host fork+exec+wait `true`", &floor, None);
        table.row("warm hit, client (HTTP, fresh connection)", &client, None);
        table.row("warm hit, server (Server-Timing)", &server, None);
    }
    let node = Node::start(engine, shape(1)).await?;
    let (client, server) = misses(&node, n).await?;
    let miss = match engine {
        Engine::Process => "pool miss (process start)",
        Engine::Qemu => "pool miss (clone from golden)",
    };
    table.row(&format!("{miss}, client"), &client, None);
    table.row(&format!("{miss}, server"), &server, None);
    Ok(())
}

/// Pool misses on a pool of 1: its warm guest claimed and held, so the next claim
/// starts one (with the golden built, a qemu miss is a clone; a pool of 0 never builds
/// its golden, so its misses boot cold), then both released. The refill of the held
/// guest's slot runs alongside, as it would in a burst.
async fn misses(node: &Node, n: usize) -> Result<(Samples, Samples), BoxError> {
    let (mut client, mut server) = (Samples::default(), Samples::default());
    for _ in 0..n {
        node.wait_warm(1).await;
        let held = node
            .daemon
            .call("POST", "/v1/claim", Some(ROOT), Some("{}"))
            .await;
        if held.status != 200 {
            return Err(format!("claim: {}", held.status).into());
        }
        let r = claim_once(node).await;
        let id = held.json()["id"].as_str().ok_or("no id")?.to_string();
        let path = format!("/v1/sandboxes/{id}/release");
        node.daemon.call("POST", &path, Some(ROOT), None).await;
        match r {
            Ok((c, s)) => {
                client.push(c);
                server.push(s);
            }
            Err(e) => {
                eprintln!("bench claim: {e}");
                client.failures += 1;
            }
        }
    }
    Ok((client, server))
}
