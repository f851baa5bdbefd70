//! Three real sandboxd nodes (the binary, process engine) over a real 3-member etcd
//! cluster on loopback, one cluster reused across the checks: claims at a node without
//! warm guests spread to the nodes with them; exec, relay, files and release through a
//! node that does not own the sandbox (the owner named in `x-sandboxd-node`, the token
//! checked by the owner); concurrent claims for one tenant at all three nodes never pass
//! its limit; drain; one etcd member down changes nothing; two down keep running
//! sandboxes serving and answer new placements 503 with `Retry-After`, and all heals
//! when they return; `kill -9` of a node reports its sandboxes lost (410) on the others
//! and new claims go to the survivors. Hostile: forged peer headers, foreign tokens,
//! odd ids, tenants on root routes.

use std::time::Duration;

use serde_json::json;
use testkit::cluster::{member, retrying_busy, served_by, start_node, wait_view, PEER_TOKEN};
use testkit::etcd::Etcd;
use testkit::files_http::call_bytes;
use testkit::restart::relay_info;
use testkit::setup::{TENANT_A, TENANT_B};
use testkit::{wait_until, Api, DaemonProcess, Setup, ROOT};

/// `echo word` in sandbox `id` through `api`, as the SDK calls it: a 503 with
/// `Retry-After` (etcd slow on a loaded host, a leader election) is waited out and
/// retried a few times; any other answer is returned as it is.
async fn echo(api: &Api, id: &str, token: &str, word: &str) -> testkit::http::Resp {
    retrying_busy("exec", async || {
        api.exec(id, token, json!({"argv": ["echo", word]})).await
    })
    .await
}

fn stdout(r: &testkit::http::Resp) -> String {
    assert_eq!(r.status, 200, "exec: {}", r.text());
    r.json()["stdout"].as_str().unwrap_or_default().to_string()
}

/// A claim at `api`, as the SDK makes one: a 503 with `Retry-After` (etcd slow to answer
/// on a loaded host, a leader election) is waited out and retried, a few times.
async fn claim_at(api: &Api, token: &str) -> (String, String, String) {
    let r = retrying_busy("claim", async || {
        api.call("POST", "/v1/claim", Some(token), Some("{}")).await
    })
    .await;
    assert_eq!(r.status, 200, "claim: {}", r.text());
    let v = r.json();
    (
        v["id"].as_str().unwrap().to_string(),
        v["token"].as_str().unwrap().to_string(),
        served_by(&r),
    )
}

/// Waits until `api` sees `n` members with `claims` claims in all.
async fn wait_claims(api: &Api, n: usize, claims: u64) {
    wait_view(api, &format!("{n} members holding {claims} claims"), |v| {
        let nodes = v["nodes"].as_array().unwrap();
        nodes.len() == n
            && nodes
                .iter()
                .map(|n| n["claims"].as_u64().unwrap())
                .sum::<u64>()
                == claims
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_act_as_one_service() {
    let mut etcd = Etcd::start(3).await;
    let setup = Setup {
        max_claims: 6,
        tenant_a_max_claims: 2,
        ..Setup::default()
    };
    // `a` keeps no warm guests: its claims must be placed on `b` and `c`.
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
    let nodes: [&DaemonProcess; 3] = [&a, &b, &c];
    wait_view(&a, "b and c warm", |v| {
        ["b", "c"]
            .iter()
            .all(|n| member(v, n).is_some_and(|m| m["pools"][0]["warm"] == 1))
            && member(v, "a").is_some()
    })
    .await;

    // Spread by warm capacity: a's claims go to b, then (b now loaded) to c.
    let (id1, tok1, owner1) = claim_at(&a, ROOT).await;
    wait_claims(&a, 3, 1).await;
    let (id2, tok2, owner2) = claim_at(&a, ROOT).await;
    let mut owners = [owner1.clone(), owner2.clone()];
    owners.sort();
    assert_eq!(owners, ["b", "c"], "claims at a spread over the warm nodes");

    // Any node serves any sandbox; the owner answers and is named.
    for n in nodes {
        let r = echo(n, &id1, &tok1, "hi").await;
        assert_eq!(stdout(&r), "hi\n");
        assert_eq!(served_by(&r), owner1);
    }
    assert!(
        relay_info(a.addr(), &id1, &tok1).await,
        "relay through a non-owner"
    );
    let path = format!("/v1/sandboxes/{id1}/files?path=/tmp/f");
    let put = call_bytes(a.addr(), "PUT", &path, &tok1, &[], b"through a".to_vec()).await;
    assert_eq!(put.status, 200, "{}", put.text());
    let other = if owner1 == "b" { &c } else { &b };
    let got = call_bytes(other.addr(), "GET", &path, &tok1, &[], vec![]).await;
    assert_eq!(
        (got.status.as_u16(), &got.body[..]),
        (200, &b"through a"[..])
    );

    // Hostile: another sandbox's token, a tenant's token, odd ids, a forged peer header.
    // Another node's sandbox token is unknown to the owner (401; on one node it is 404).
    assert_eq!(echo(&a, &id1, &tok2, "x").await.status, 401);
    assert_eq!(echo(&a, &id1, TENANT_A, "x").await.status, 403);
    for odd in ["sb-0000000000000000", "sb-..%2f..", &"x".repeat(300)] {
        assert_eq!(echo(&a, odd, ROOT, "x").await.status, 404, "{odd}");
    }
    let forged = call_bytes(
        a.addr(),
        "POST",
        &format!("/v1/sandboxes/{id1}/exec"),
        &tok1,
        &[
            ("x-sandboxd-peer", "not-the-peer-token"),
            ("content-type", "application/json"),
        ],
        br#"{"argv":["true"]}"#.to_vec(),
    )
    .await;
    assert_eq!(
        (forged.status.as_u16(), served_by(&forged)),
        (200, owner1.clone())
    );
    // The real peer token makes a node serve what it has, and it has nothing of b's.
    let here_only = call_bytes(
        a.addr(),
        "POST",
        &format!("/v1/sandboxes/{id1}/exec"),
        &tok1,
        &[("x-sandboxd-peer", PEER_TOKEN)],
        br#"{"argv":["true"]}"#.to_vec(),
    )
    .await;
    assert_eq!(
        here_only.status, 401,
        "a peer-routed request is not routed again"
    );
    assert_eq!(
        a.call("GET", "/v1/cluster", Some(TENANT_A), None)
            .await
            .status,
        403
    );
    assert_eq!(
        a.call("POST", "/v1/node/drain", Some(TENANT_A), Some("{}"))
            .await
            .status,
        403
    );
    assert_eq!(
        a.call("POST", "/v1/node/drain", Some(ROOT), Some("[]"))
            .await
            .status,
        400
    );

    // Release through a non-owner: gone everywhere.
    let r = a
        .call(
            "POST",
            &format!("/v1/sandboxes/{id2}/release"),
            Some(&tok2),
            None,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    for n in nodes {
        assert_eq!(echo(n, &id2, ROOT, "x").await.status, 404);
    }

    // Tenant `a` may hold 2 sandboxes in the whole cluster: 9 claims at once, 3 per node.
    let claims = nodes
        .iter()
        .flat_map(|n| (0..3).map(move |_| n.call("POST", "/v1/claim", Some(TENANT_A), Some("{}"))));
    let answers = futures::future::join_all(claims).await;
    let won: Vec<_> = answers.iter().filter(|r| r.status == 200).collect();
    assert_eq!(
        won.len(),
        2,
        "{:?}",
        answers.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(answers.iter().all(|r| r.status == 200 || r.status == 429));
    for r in won {
        let v = r.json();
        let path = format!("/v1/sandboxes/{}/release", v["id"].as_str().unwrap());
        let tok = v["token"].as_str().unwrap();
        assert_eq!(c.call("POST", &path, Some(tok), None).await.status, 204);
    }
    // Freed slots are free everywhere.
    let (tid, ttok, _) = claim_at(&b, TENANT_A).await;
    assert_eq!(
        a.call(
            "POST",
            &format!("/v1/sandboxes/{tid}/release"),
            Some(&ttok),
            None
        )
        .await
        .status,
        204
    );

    // Drain c: its sandbox keeps serving, new claims at c go elsewhere. The tenant's
    // claims above may have taken c's warm guest: its refill is waited for (a loaded
    // host can take seconds), so that the claim below is served at c.
    c.wait_pool(Duration::from_secs(60), "c's warm guest back", |p| {
        p["warm"] == 1
    })
    .await;
    let (cid, ctok, cowner) = claim_at(&c, ROOT).await;
    assert_eq!(cowner, "c", "c has a warm guest");
    let r = c.call("POST", "/v1/node/drain", Some(ROOT), None).await;
    assert_eq!(
        (r.status.as_u16(), r.json()["draining"].as_bool()),
        (200, Some(true))
    );
    wait_view(&c, "c draining", |v| {
        member(v, "c").is_some_and(|m| m["draining"] == true)
    })
    .await;
    let (did, dtok, downer) = claim_at(&c, ROOT).await;
    assert_ne!(downer, "c", "a drained node takes no claims");
    assert_eq!(stdout(&echo(&a, &cid, &ctok, "still").await), "still\n");
    let r = c
        .call(
            "POST",
            "/v1/node/drain",
            Some(ROOT),
            Some(r#"{"drain": false}"#),
        )
        .await;
    assert_eq!(r.json()["draining"], false);

    // One etcd member down: nothing changes.
    etcd.kill(2);
    let (eid, etok, _) = claim_at(&a, ROOT).await;
    assert_eq!(
        stdout(&echo(&b, &eid, &etok, "one-down").await),
        "one-down\n"
    );

    // Two down: no quorum. Running sandboxes serve, through their owner and through
    // others (the last known owner); new placements answer 503 with Retry-After.
    // Every node knows every running sandbox's owner before etcd goes: each has routed
    // a call to each of them (a count of known owners could include a released one).
    for n in nodes {
        for (id, tok) in [(&id1, &tok1), (&did, &dtok), (&eid, &etok)] {
            assert_eq!(stdout(&echo(n, id, tok, "known").await), "known\n");
        }
    }
    etcd.kill(1);
    let refused = wait_until(
        Duration::from_secs(30),
        "a claim refused with 503",
        async || {
            let r = a.call("POST", "/v1/claim", Some(ROOT), Some("{}")).await;
            if r.status == 503 {
                Ok(r)
            } else {
                Err(r.status)
            }
        },
    )
    .await;
    assert!(
        refused.headers.contains_key("retry-after"),
        "{:?}",
        refused.headers
    );
    for n in nodes {
        assert_eq!(
            stdout(&echo(n, &id1, &tok1, "no-quorum").await),
            "no-quorum\n"
        );
        assert_eq!(
            stdout(&echo(n, &did, &dtok, "no-quorum").await),
            "no-quorum\n"
        );
    }
    assert!(
        relay_info(c.addr(), &eid, &etok).await,
        "relay without quorum"
    );
    // Heal: quorum back, claims placed again, nobody lost.
    etcd.restart(1);
    etcd.restart(2);
    etcd.wait_healthy().await;
    let (hid, htok, _) = wait_until(
        Duration::from_secs(30),
        "claims after the heal",
        async || {
            let r = a.call("POST", "/v1/claim", Some(ROOT), Some("{}")).await;
            if r.status == 200 {
                let v = r.json();
                Ok((
                    v["id"].as_str().unwrap().to_string(),
                    v["token"].as_str().unwrap().to_string(),
                    (),
                ))
            } else {
                Err(format!("{} {}", r.status, r.text()))
            }
        },
    )
    .await;
    assert_eq!(stdout(&echo(&c, &hid, &htok, "healed").await), "healed\n");
    wait_view(&a, "all three members back", |v| {
        v["nodes"].as_array().unwrap().len() == 3
    })
    .await;

    // kill -9 of the owner of id1: lost (410) everywhere within the lease TTL; claims go on.
    let (victim, survivor, victim_name) = if owner1 == "b" {
        (b, c, "b")
    } else {
        (c, b, "c")
    };
    let lost = kill_and_wait_lost(victim, &a, &survivor, &id1, &tok1).await;
    assert!(
        lost.contains("lost") && lost.contains(victim_name),
        "{lost}"
    );
    for _ in 0..2 {
        let (nid, ntok, nowner) = claim_at(&a, ROOT).await;
        assert_ne!(nowner, victim_name);
        assert_eq!(stdout(&echo(&a, &nid, &ntok, "after").await), "after\n");
    }
    // Tenants claim as before.
    let r = a
        .call("POST", "/v1/claim", Some(TENANT_B), Some("{}"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// SIGKILLs `victim` and waits until both `a` and `survivor` answer 410 for `id`;
/// returns the answer's message.
async fn kill_and_wait_lost(
    mut victim: DaemonProcess,
    a: &Api,
    survivor: &Api,
    id: &str,
    token: &str,
) -> String {
    victim.process().kill();
    let mut message = String::new();
    for n in [a, survivor] {
        message = wait_until(
            Duration::from_secs(30),
            "the dead node's sandbox reported lost",
            async || {
                let r = echo(n, id, token, "x").await;
                if r.status == 410 {
                    Ok(r.json()["error"].as_str().unwrap().to_string())
                } else {
                    Err(r.status)
                }
            },
        )
        .await;
    }
    message
}
