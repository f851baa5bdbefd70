//! `cargo xtask bench cluster`: three real sandboxd nodes (process engine) over a real
//! 3-member etcd on loopback. Prints, in one run: claim and exec latency through the
//! owner against through another node (the proxy's cost), claim throughput of the three
//! nodes against one node alone (a plain sandboxd, no `[cluster]`), and how long a
//! `kill -9`ed node's sandbox takes to be reported lost (410) by another node.
//!
//! Run as root, after `cargo xtask image`.

use std::time::{Duration, Instant};

use serde_json::json;
use testkit::cluster::{member, start_node, wait_view, LEASE_TTL_SECONDS};
use testkit::etcd::Etcd;
use testkit::setup::Listen;
use testkit::{Api, DaemonProcess, Setup, ROOT};

/// `cargo xtask bench --quick` (CI's smoke test) sets `BENCH_QUICK=1`: fewer rounds.
fn quick() -> bool {
    std::env::var("BENCH_QUICK").as_deref() == Ok("1")
}

/// Warm claims per entry node, execs per path, claims in the burst (fewer when quick).
fn n_claims() -> usize {
    if quick() {
        5
    } else {
        20
    }
}
fn n_execs() -> usize {
    if quick() {
        30
    } else {
        200
    }
}
fn n_burst() -> usize {
    if quick() {
        6
    } else {
        24
    }
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_cluster: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median and 90th percentile, in ms.
fn summary(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| ms(samples[((samples.len() - 1) as f64 * q) as usize]);
    (at(0.5), at(0.9))
}

async fn claim(api: &Api) -> Result<(String, String, String), String> {
    let r = api.call("POST", "/v1/claim", Some(ROOT), Some("{}")).await;
    if r.status != 200 {
        return Err(format!("claim: {} {}", r.status, r.text()));
    }
    let v = r.json();
    let node = r
        .headers
        .get("x-sandboxd-node")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    Ok((
        v["id"].as_str().unwrap_or_default().into(),
        v["token"].as_str().unwrap_or_default().into(),
        node,
    ))
}

async fn release(api: &Api, id: &str, token: &str) {
    let _ = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/release"),
            Some(token),
            None,
        )
        .await;
}

/// `CLAIMS` warm claims at `at`, each released and the owners' pools refilled (as `at`
/// sees it, which is what placement reads) before the next; the client's latencies.
/// Each must be served by one of `owners` (placement picks among equally warm nodes by
/// load, so a claim at a node without warm guests may land on either other node).
async fn warm_claims(at: &Api, owners: &[&str]) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::new();
    for _ in 0..n_claims() {
        wait_view(at, "every pool full", |v| {
            v["nodes"].as_array().is_some_and(|nodes| {
                nodes
                    .iter()
                    .all(|m| m["claims"] == 0 && (m["name"] == "a" || m["pools"][0]["warm"] == 2))
            }) && owners.iter().all(|o| member(v, o).is_some())
        })
        .await;
        let t = Instant::now();
        let (id, token, node) = claim(at).await?;
        samples.push(t.elapsed());
        if !owners.contains(&node.as_str()) {
            return Err(format!("claim went to {node}, not one of {owners:?}"));
        }
        release(at, &id, &token).await;
    }
    Ok(samples)
}

async fn execs(at: &Api, id: &str, token: &str) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::new();
    for _ in 0..n_execs() {
        let t = Instant::now();
        let r = at.exec(id, token, json!({"argv": ["true"]})).await;
        samples.push(t.elapsed());
        if r.status != 200 {
            return Err(format!("exec: {} {}", r.status, r.text()));
        }
    }
    Ok(samples)
}

/// `BURST` claims at once, spread over `entries`; claims per second, then released.
async fn burst(entries: &[&Api]) -> Result<f64, String> {
    let t = Instant::now();
    let claims = (0..n_burst()).map(|i| claim(entries[i % entries.len()]));
    let claimed = futures::future::join_all(claims).await;
    let rate = n_burst() as f64 / t.elapsed().as_secs_f64();
    for c in claimed {
        let (id, token, _) = c?;
        release(entries[0], &id, &token).await;
    }
    Ok(rate)
}

async fn bench() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("run as root: the process engine's sandboxes need their identities".into());
    }
    let setup = Setup {
        warm: 2,
        max_claims: 40,
        max_in_flight: 64,
        ..Setup::default()
    };
    let sandboxd = testkit::bins::debug_dir().join("sandboxd");
    // One node alone, the throughput baseline.
    let alone = DaemonProcess::start_temp(&sandboxd, &setup, Listen::Tcp).await;
    alone
        .wait_pool(Duration::from_secs(30), "warm", |p| p["warm"] == 2)
        .await;
    let alone_rate = burst(&[&alone]).await?;
    drop(alone);

    let mut etcd = Etcd::start(3).await;
    let a = start_node(
        &etcd,
        "a",
        &Setup {
            warm: 0,
            ..setup.clone()
        },
    )
    .await;
    let b = start_node(&etcd, "b", &setup).await;
    let c = start_node(&etcd, "c", &setup).await;
    wait_view(&a, "three members", |v| {
        v["nodes"].as_array().is_some_and(|n| n.len() == 3)
    })
    .await;

    let claim_owner = summary(warm_claims(&b, &["b"]).await?);
    let claim_other = summary(warm_claims(&a, &["b", "c"]).await?);
    let (id, token, _) = claim(&b).await?;
    let exec_owner = summary(execs(&b, &id, &token).await?);
    let exec_other = summary(execs(&a, &id, &token).await?);
    release(&b, &id, &token).await;
    let cluster_rate = burst(&[&a, &b, &c]).await?;

    // The time from `kill -9` to another node answering 410 for the dead node's sandbox.
    let (lost_id, lost_token, _) = claim(&c).await?;
    let mut c = c;
    let killed = Instant::now();
    c.process().kill();
    let lost_after = loop {
        let r = a
            .exec(&lost_id, &lost_token, json!({"argv": ["true"]}))
            .await;
        if r.status == 410 {
            break killed.elapsed();
        }
        if killed.elapsed() > Duration::from_secs(60) {
            return Err(format!("not reported lost after 60 s: {}", r.status));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    etcd.kill(2);

    println!("cluster: 3 sandboxd nodes (process engine) over a 3-member etcd, loopback");
    println!("  {:<34} {:>10} {:>10}", "", "median ms", "p90 ms");
    for (what, (p50, p90)) in [
        ("warm claim at the owner", claim_owner),
        ("warm claim at another node", claim_other),
        ("exec `true` at the owner", exec_owner),
        ("exec `true` through another node", exec_other),
    ] {
        println!("  {what:<34} {p50:>10.2} {p90:>10.2}");
    }
    println!(
        "  proxy cost (median, other/owner): claim {:.2}x, exec {:.2}x",
        claim_other.0 / claim_owner.0,
        exec_other.0 / exec_owner.0
    );
    println!(
        "  {} claims at once: 1 node alone {alone_rate:.1}/s, 3 nodes {cluster_rate:.1}/s ({:.2}x)",
        n_burst(),
        cluster_rate / alone_rate
    );
    println!(
        "  kill -9 to 410 at another node: {:.0} ms (lease TTL {LEASE_TTL_SECONDS} s)",
        ms(lost_after)
    );
    Ok(())
}
