//! sandboxd against hostile clients and tenants, over real HTTP with real sandboxes:
//! thousands of idle connections, a slow-headers client, a body that never ends, a
//! response nobody reads, the connection cap, one sandbox's flood of slow execs, bodies
//! that are not what they claim, too many relays, and errors that must not show a tenant
//! the host. Each attack counts its leftovers (connections on the daemon's port, spill
//! descriptors, processes) before and after.

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::json;
use testkit::hostile::{
    closed_count, fds_under, idle_connections, metric, peer_closed, raise_nofile, read_to_close,
    slow_headers, unfinished_body, unread_request,
};
use testkit::procs::{assert_gone, marker, procs_with, wait_running};
use testkit::relay::upgrade;
use testkit::{wait_until, Api, Daemon, Setup, ROOT, TENANT_A};
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

/// Short timeouts so the attacks end within a test's patience.
const FAST_HTTP: &str = "[http]\nheader_timeout_seconds = 1\nbody_timeout_seconds = 1\n\
                         idle_timeout_seconds = 2\nwrite_timeout_seconds = 2\n";

async fn metrics(api: &Api) -> String {
    let r = api.call("GET", "/metrics", Some(ROOT), None).await;
    assert_eq!(r.status, 200);
    r.text()
}

async fn metric_of(api: &Api, name: &str) -> f64 {
    metric(&metrics(api).await, name).unwrap_or(0.0)
}

/// TCP connections to or from `addr`'s port that someone still holds open: established,
/// or closed by the peer but not by its holder (CLOSE_WAIT, a leak if it stays).
fn open_tcp(addr: SocketAddr) -> usize {
    let port = format!(":{:04X}", addr.port());
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3
                && (f[1].ends_with(&port) || f[2].ends_with(&port))
                && matches!(f[3], "01" | "08")
        })
        .count()
}

/// What a test leaves: sockets on the daemon's port, spill descriptors, sandbox processes.
fn leftovers(d: &Daemon) -> (usize, usize, usize) {
    (
        open_tcp(d.addr()),
        fds_under(&d.dir.join("spill")),
        procs_with(&d.dir.to_string_lossy()).len(),
    )
}

/// The leftovers once the connections of earlier calls have closed and the warm pool is
/// full again (a refill in flight would count as a leftover, or hide one).
async fn settled(d: &Daemon) -> (usize, usize, usize) {
    steady_pool(d).await;
    wait_until(
        Duration::from_secs(10),
        "earlier calls' connections closed",
        async || open_tcp(d.addr()) == 0,
    )
    .await;
    leftovers(d)
}

/// Every pool at its warm target, with nothing starting.
async fn steady_pool(d: &Daemon) {
    d.wait_pool(Duration::from_secs(60), "the pool full", |p| {
        p["warm"] == p["target"]
    })
    .await;
}

/// Waits until the leftovers are `want` again, once the pool is full again.
async fn leftovers_back_to(d: &Daemon, want: (usize, usize, usize)) {
    steady_pool(d).await;
    wait_until(
        Duration::from_secs(30),
        "the leftovers of before",
        async || {
            let now = leftovers(d);
            if now == want {
                Ok(())
            } else {
                Err((want, now))
            }
        },
    )
    .await;
}

/// After `stop`, nothing of the daemon's may be left.
async fn stop_clean(d: Daemon) {
    let (addr, dir) = (d.addr(), d.dir.clone());
    d.stop().await;
    wait_until(Duration::from_secs(10), "no leftovers", async || {
        let left = (
            open_tcp(addr),
            fds_under(&dir.join("spill")),
            procs_with(&dir.to_string_lossy()).len(),
        );
        if left == (0, 0, 0) {
            Ok(())
        } else {
            Err(left)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_slow_and_unfinished_clients_do_not_stop_the_node() {
    const IDLE: usize = 2000;
    // Each idle connection costs this process two descriptors (client and daemon).
    assert!(raise_nofile(2 * IDLE as u64 + 1024) >= 2 * IDLE as u64 + 512);
    let d = Daemon::start(Setup {
        tail: FAST_HTTP.into(),
        ..Setup::default()
    })
    .await;
    let addr = d.addr();
    let (id, token) = d.claim_as(TENANT_A).await;
    let before = settled(&d).await;

    let idle = idle_connections(addr, IDLE).await;
    let (slow, trickle) = slow_headers(addr, Duration::from_millis(200)).await;
    let mut unfinished = unfinished_body(addr, &format!("/v1/sandboxes/{id}/exec"), &token).await;
    // The node keeps answering others meanwhile: a claim and an exec.
    let (id2, token2) = d.claim_as(TENANT_A).await;
    let r = d
        .exec(&id2, &token2, json!({"argv": ["echo", "served"]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["stdout"], "served\n");
    let open = metric_of(&d, "sandboxd_http_connections").await;
    assert!(open >= IDLE as f64, "only {open} connections counted");

    // The never-finished body is answered 408 after body_timeout_seconds.
    let answer = read_to_close(&mut unfinished).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // The slow-headers client is cut off although it keeps trickling.
    wait_until(
        Duration::from_secs(20),
        "the slow-headers client closed",
        async || peer_closed(&slow, &mut Vec::new()),
    )
    .await;
    trickle.abort();
    // Every idle connection is closed by the daemon after idle_timeout_seconds.
    wait_until(
        Duration::from_secs(60),
        "every idle connection closed",
        async || {
            let n = closed_count(&idle);
            if n == IDLE {
                Ok(())
            } else {
                Err(n)
            }
        },
    )
    .await;
    let text = metrics(&d).await;
    let count = |kind: &str| {
        metric(
            &text,
            &format!("sandboxd_http_timeouts_total{{kind=\"{kind}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(count("idle") >= IDLE as f64, "{text}");
    assert!(count("header") >= 1.0, "{text}");
    assert!(metric(&text, "sandboxd_http_body_timeouts_total").unwrap_or(0.0) >= 1.0);
    drop((idle, slow, unfinished));
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{id2}/release"),
            Some(ROOT),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    leftovers_back_to(&d, before).await;
    stop_clean(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_answers_503_and_recovers() {
    let d = Daemon::start(Setup {
        warm: 0,
        tail: format!("{FAST_HTTP}max_connections = 16\n"),
        ..Setup::default()
    })
    .await;
    let addr = d.addr();
    let before = settled(&d).await;
    let idle = idle_connections(addr, 16).await;
    let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
    let answer = read_to_close(&mut over).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("max_connections"), "{answer}");
    // The slots come back once the idle timeout closes the squatters.
    wait_until(
        Duration::from_secs(30),
        "the squatters closed",
        async || closed_count(&idle) == idle.len(),
    )
    .await;
    let text = metrics(&d).await;
    assert!(
        metric(&text, "sandboxd_http_refused_total").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    drop((idle, over));
    leftovers_back_to(&d, before).await;
    stop_clean(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_exec_answer_frees_its_budget_and_spill_after_the_write_timeout() {
    let d = Daemon::start(Setup {
        warm: 0,
        max_output_bytes: 32 * 1024 * 1024,
        memory_budget_bytes: 1024 * 1024,
        tail: FAST_HTTP.into(),
        ..Setup::default()
    })
    .await;
    let spill = d.dir.join("spill");
    let (id, token) = d.claim().await;
    let before = settled(&d).await;
    assert_eq!(before.1, 0, "no spill file before");
    // 200 kB on stderr stay in memory (charged to the budget) until the body reaches
    // stderr; 20 MB on stdout fill the rest of the budget and spill.
    let script = "head -c 200000 /dev/zero | tr '\\0' e >&2; yes | head -c 20000000";
    let body = json!({"argv": ["sh", "-c", script]}).to_string();
    let path = format!("/v1/sandboxes/{id}/exec");
    let unread = unread_request(d.addr(), &path, &token, &body).await;
    // Stalled: the client reads nothing, the answer holds budget and a spill file.
    wait_until(
        Duration::from_secs(30),
        "the answer to hold budget and spill",
        async || {
            let held = metric_of(&d, "sandboxd_exec_buffered_bytes").await;
            let files = fds_under(&spill);
            if held > 0.0 && files > 0 {
                Ok(())
            } else {
                Err((held, files))
            }
        },
    )
    .await;
    // After write_timeout_seconds without progress, both are freed.
    wait_until(
        Duration::from_secs(30),
        "budget and spill freed",
        async || {
            let held = metric_of(&d, "sandboxd_exec_buffered_bytes").await;
            let files = fds_under(&spill);
            if held == 0.0 && files == 0 {
                Ok(())
            } else {
                Err((held, files))
            }
        },
    )
    .await;
    let write = metric_of(&d, "sandboxd_http_timeouts_total{kind=\"write\"}").await;
    assert!(write >= 1.0);
    drop(unread);
    // The node serves the same sandbox as before.
    let r = d.exec(&id, &token, json!({"argv": ["echo", "ok"]})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    leftovers_back_to(&d, before).await;
    stop_clean(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sandboxs_flood_of_slow_execs_leaves_the_others_served() {
    let d = Daemon::start(Setup {
        warm: 0,
        max_in_flight: 8,
        exec_extra: "max_in_flight_per_sandbox = 3\nmax_in_flight_per_tenant = 6".into(),
        ..Setup::default()
    })
    .await;
    let (flooder, flooder_token) = d.claim_as(TENANT_A).await;
    let (other, other_token) = d.claim_as(TENANT_A).await;
    let before = procs_with(&d.dir.to_string_lossy()).len();
    let m = marker(41);
    let mut running = Vec::new();
    for _ in 0..3 {
        let (api, id, token, m) = (
            Api::clone(&d),
            flooder.clone(),
            flooder_token.clone(),
            m.clone(),
        );
        running.push(tokio::spawn(async move {
            api.exec(&id, &token, json!({"argv": ["sleep", m]})).await
        }));
    }
    wait_until(Duration::from_secs(10), "3 sleeps running", async || {
        procs_with(&m).len() >= 3
    })
    .await;
    // The flooder's fourth is refused, naming its own bound.
    let r = d
        .exec(&flooder, &flooder_token, json!({"argv": ["sleep", m]}))
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.headers.contains_key("retry-after"));
    assert!(
        r.text().contains("max_in_flight_per_sandbox"),
        "{}",
        r.text()
    );
    // Another sandbox is served.
    let r = d
        .exec(&other, &other_token, json!({"argv": ["echo", "served"]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Releasing the flooder kills its sleeps and answers their execs.
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{flooder}/release"),
            Some(ROOT),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    assert_gone(&m).await;
    for t in running {
        assert_ne!(t.await.unwrap().status, 200);
    }
    let after = procs_with(&d.dir.to_string_lossy()).len();
    assert!(
        after < before,
        "the flooder's processes are gone ({before} → {after})"
    );
    stop_clean(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_strict() {
    let d = Daemon::start(Setup {
        warm: 0,
        ..Setup::default()
    })
    .await;
    // A JSON array would fill ClaimRequest's fields in order; it claims nothing.
    let r = d
        .call(
            "POST",
            "/v1/claim",
            Some(ROOT),
            Some(r#"["base","small",60]"#),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("JSON object"), "{}", r.text());
    assert_eq!(d.info().await["claims"]["active"], 0);
    for body in ["[]", "\"x\"", "7", "null"] {
        let r = d.call("POST", "/v1/claim", Some(ROOT), Some(body)).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
    let (id, token) = d.claim().await;
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/renew"),
            Some(&token),
            Some("[30]"),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    for (env, why) in [
        (json!({"A=B": "x"}), "="),
        (json!({"": "x"}), "non-empty"),
        (json!({"A\u{0}": "x"}), "NUL"),
        (json!({"A": "x\u{0}y"}), "NUL"),
    ] {
        let r = d
            .exec(&id, &token, json!({"argv": ["env"], "env": env}))
            .await;
        assert_eq!(r.status, 400, "{env}: {}", r.text());
        assert!(r.text().contains(why), "{env}: {}", r.text());
    }
    let r = d
        .exec(&id, &token, json!({"argv": ["echo", "a\u{0}b"]}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    // '=' inside a value is an ordinary value.
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["sh", "-c", "echo $A"], "env": {"A": "b=c"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["stdout"], "b=c\n");
    // PUT /v1/pools stays within the config's warm_max (4 in the test config).
    let over = json!({"pools": [{"template": "base", "size": "small", "warm": 5, "warm_max": 5}]});
    let r = d
        .call("PUT", "/v1/pools", Some(ROOT), Some(&over.to_string()))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("warm_max"), "{}", r.text());
    assert_eq!(d.info().await["pools"][0]["warm_max"], 4);
    stop_clean(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_over_the_cap_answer_429_and_the_sandbox_still_works() {
    let d = Daemon::start(Setup {
        warm: 0,
        tail: "[http]\nmax_relays_per_sandbox = 3\n".into(),
        ..Setup::default()
    })
    .await;
    let (id, token) = d.claim().await;
    let path = format!("/v1/sandboxes/{id}/agent");
    let mut relays = Vec::new();
    for _ in 0..3 {
        let (status, stream, _) = upgrade(d.addr(), &path, Some(&token)).await;
        assert_eq!(status, 101);
        relays.push(Framed::new(stream, HostCodec::new()));
    }
    let (status, _, _) = upgrade(d.addr(), &path, Some(&token)).await;
    assert_eq!(status, 429);
    // The open relays and the sandbox itself are unaffected.
    for relay in &mut relays {
        relay.send(Request::Info).await.unwrap();
        assert!(matches!(
            relay.next().await.unwrap().unwrap(),
            Response::Info { .. }
        ));
    }
    let r = d.exec(&id, &token, json!({"argv": ["echo", "ok"]})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(metric_of(&d, "sandboxd_relays_open").await, 3.0);
    // Closing one frees its place.
    drop(relays.pop());
    wait_until(Duration::from_secs(10), "a relay slot freed", async || {
        metric_of(&d, "sandboxd_relays_open").await == 2.0
    })
    .await;
    let (status, _, _) = upgrade(d.addr(), &path, Some(&token)).await;
    assert_eq!(status, 101);
    drop(relays);
    stop_clean(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_see_no_host_detail_in_errors() {
    let d = Daemon::start(Setup {
        warm: 0,
        ..Setup::default()
    })
    .await;
    let (id, token) = d.claim_as(TENANT_A).await;
    // silkd dies: the sandbox has failed, and the engine's account names host files.
    let r = d
        .exec(&id, &token, json!({"argv": ["sh", "-c", "kill -9 $PPID"]}))
        .await;
    assert_eq!(r.status, 502);
    let shown = wait_until(
        Duration::from_secs(10),
        "exec answering failed",
        async || {
            let r = d.exec(&id, &token, json!({"argv": ["true"]})).await;
            let text = r.json()["error"].as_str().unwrap_or_default().to_string();
            if r.status == 502 && text.contains("has failed") {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
    .await;
    let host = d.dir.to_string_lossy().into_owned();
    assert!(!shown.contains('/'), "the sandbox token saw {shown:?}");
    assert!(shown.contains("incident "), "{shown}");
    // Root sees the engine's whole account; the tenant's list only that it failed.
    let root = d
        .call("GET", &format!("/v1/sandboxes/{id}"), Some(ROOT), None)
        .await
        .json();
    assert_eq!(root["state"], "failed");
    let why = root["error"].as_str().unwrap();
    let list = d.call("GET", "/v1/sandboxes", Some(TENANT_A), None).await;
    assert!(!list.text().contains(why), "{}", list.text());
    assert!(!list.text().contains(&host), "{}", list.text());
    assert!(list.text().contains("failed"), "{}", list.text());
    stop_clean(d).await;
}

/// The timeouts are for clients that make no progress, never for a handler at work: a
/// command longer than all of them is answered, and one cut short by a release leaves no
/// process behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_exec_is_never_cut_by_the_http_timeouts() {
    let d = Daemon::start(Setup {
        warm: 0,
        tail: FAST_HTTP.into(),
        ..Setup::default()
    })
    .await;
    let (id, token) = d.claim().await;
    // Longer than every [http] timeout: the handler at work is never timed.
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["sh", "-c", "sleep 4; echo done"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["stdout"], "done\n");
    let m = marker(43);
    let (api, body) = (Api::clone(&d), json!({"argv": ["sleep", m]}));
    let (id2, token2) = (id.clone(), token.clone());
    let running = tokio::spawn(async move { api.exec(&id2, &token2, body).await });
    wait_running(&m).await;
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/release"),
            Some(ROOT),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    assert_gone(&m).await;
    let _ = running.await;
    stop_clean(d).await;
}
