//! `/metrics` histograms against a real sandboxd and silkd (process engine): a claim, buffered
//! execs and a relay move the claim, exec, relay-setup, start and admission-wait buckets by
//! exactly what was done; refused requests (bad body, no token on the relay) move none.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::json;
use testkit::prometheus::{buckets, value};
use testkit::relay::upgrade;
use testkit::{Daemon, Setup, ROOT};
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

async fn scrape(d: &Daemon) -> String {
    let r = d.call("GET", "/metrics", Some(ROOT), None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

/// How much `series` grew from `before` to `after`.
fn grew(before: &str, after: &str, series: &str) -> f64 {
    value(after, series) - value(before, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histograms_move_with_a_claim_an_exec_and_a_relay() {
    let d = Daemon::start(Setup {
        warm: 1,
        ..Setup::default()
    })
    .await;
    d.wait_pool(Duration::from_secs(20), "1 warm", |p| p["warm"] == 1)
        .await;
    let before = scrape(&d).await;

    let (id, token) = d.claim().await;
    for argv in [json!(["true"]), json!(["sh", "-c", "exit 3"])] {
        let r = d.exec(&id, &token, json!({ "argv": argv })).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Hostile: a body that is not an exec request is refused before admission.
    let path = format!("/v1/sandboxes/{id}/exec");
    let r = d
        .call("POST", &path, Some(&token), Some("{\"argv\": 7}"))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    // Hostile: a relay without a token never reaches setup.
    let agent = format!("/v1/sandboxes/{id}/agent");
    let (status, _, _) = upgrade(d.addr(), &agent, None).await;
    assert_eq!(status, 401);
    let (status, stream, rest) = upgrade(d.addr(), &agent, Some(&token)).await;
    assert_eq!((status, rest.len()), (101, 0));
    let mut relay = Framed::new(stream, HostCodec::new());
    relay.send(Request::Info).await.unwrap();
    let answer = relay.next().await.expect("an answer").expect("a frame");
    assert!(matches!(answer, Response::Info { .. }), "{answer:?}");
    drop(relay);
    // The claim took the warm guest; the refill starts its replacement.
    d.wait_pool(Duration::from_secs(20), "refilled", |p| p["warm"] == 1)
        .await;
    let after = scrape(&d).await;

    let claim = "sandboxd_claim_seconds";
    assert_eq!(
        grew(
            &before,
            &after,
            &format!("{claim}_count{{source=\"warm\"}}")
        ),
        1.0
    );
    let exec = "sandboxd_exec_seconds";
    assert_eq!(
        grew(&before, &after, &format!("{exec}_count{{status=\"200\"}}")),
        2.0
    );
    assert_eq!(
        value(&after, &format!("{exec}_count{{status=\"400\"}}")),
        0.0
    );
    assert_eq!(
        grew(&before, &after, "sandboxd_relay_setup_seconds_count"),
        1.0
    );
    let start = "sandboxd_start_seconds_count{origin=\"cold\"}";
    assert!(grew(&before, &after, start) >= 1.0, "{after}");
    let wait = "sandboxd_admission_wait_seconds_count{kind=\"start\"}";
    assert!(grew(&before, &after, wait) >= 1.0, "{after}");
    // Every start this node made is one the refill asked a permit for (no claim missed).
    assert_eq!(value(&after, start), value(&after, wait));

    // The buckets themselves moved: a finite bucket took each observation (none took
    // longer than the largest bound), and every histogram is well formed.
    for (name, labels, n) in [
        (claim, "source=\"warm\"", 1.0),
        (exec, "status=\"200\"", 2.0),
        ("sandboxd_relay_setup_seconds", "", 1.0),
    ] {
        let (b, a) = (
            buckets(&before, name, labels),
            buckets(&after, name, labels),
        );
        assert!(a.len() > 1, "{name}{{{labels}}} has no buckets: {after}");
        let finite = |rows: &[(String, f64)]| rows.iter().rev().nth(1).map_or(0.0, |r| r.1);
        assert_eq!(finite(&a) - finite(&b), n, "{name}{{{labels}}}");
    }
    let info = d.info().await;
    let builds = info["pools"][0]["golden"]["builds"].as_f64().unwrap();
    let golden = "sandboxd_golden_build_seconds_count{pool=\"base/small\"}";
    assert_eq!(value(&after, golden), builds, "{after}");
    buckets(
        &after,
        "sandboxd_golden_build_seconds",
        "pool=\"base/small\"",
    );
    buckets(&after, "sandboxd_start_seconds", "origin=\"cold\"");
    d.stop().await;
}
