//! Ports: a Python `http.server` started detached in a `default`-template sandbox answers
//! through the SDK's `connect_port` and through `sbx port-forward`; and the route's
//! refusals: nothing listening (502), bad ports (400), no `Upgrade: tcp` (426), another
//! sandbox's token (404), connections past the relay cap (429, the sandbox keeps serving);
//! after them the host's leftovers (processes, sandbox dirs, sockets, cgroups) are counted
//! back to what they were before.

use std::time::Duration;

use sandbox_sdk::{ClaimOptions, Error};
use testkit::images::template_image;
use testkit::leftovers::Census;
use testkit::ports::{assert_hello, get_hello, http_get, port_forward, serve_hello};
use testkit::relay::upgrade_to;
use testkit::setup::uid_range;
use testkit::{bounded, wait_until, Setup, ROOT};

/// Relays one sandbox may hold: four tunnels (the detached server holds none).
const RELAY_CAP: usize = 4;

fn setup() -> Setup {
    Setup {
        image: Some(template_image("default")),
        warmup: Some(r#"["python3", "-c", "import http.server"]"#.into()),
        tail: format!("[http]\nmax_relays_per_sandbox = {RELAY_CAP}\n"),
        ..Setup::sdk()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_in_the_sandbox_answers_through_connect_port_and_port_forward() {
    let d = testkit::sdk::start_tcp(setup()).await;
    bounded(async {
        let root = d.root();
        let sandbox = root.claim(ClaimOptions::new()).await.unwrap();
        // Detached: the server holds no connection and outlives the request.
        serve_hello(&sandbox, Duration::from_secs(30)).await;

        // sbx port-forward: two connections one after the other on the local port.
        let dir = tempfile::tempdir().unwrap();
        let sbx = std::path::Path::new(env!("CARGO_BIN_EXE_sbx"));
        let (_fwd, local) = port_forward(sbx, &d.url(), ROOT, sandbox.id(), 8000, dir.path()).await;
        for _ in 0..2 {
            let mut conn = tokio::net::TcpStream::connect(local).await.unwrap();
            assert_hello(&http_get(&mut conn, "/hello.txt").await);
        }

        // The attacks start here: afterwards the host must hold what it holds now (the
        // sandbox, its server, the pool), nothing more. Counted once the pool has refilled
        // after our claim, so no warmup command is running in the count.
        d.wait_pool(Duration::from_secs(30), "1 warm", |p| p["warm"] == 1)
            .await;
        let census = Census::new(&d.data_dir(), uid_range(&d.data_dir()));
        let before = census.count();

        // Nothing listens on 8001: the SDK gets the guest's reason, HTTP a 502 before any 101.
        match sandbox.connect_port(8001).await {
            Err(Error::Guest(m)) => assert!(m.contains("127.0.0.1:8001"), "{m}"),
            other => panic!("connect to a closed port: {other:?}"),
        }
        let addr = d.endpoint.addr();
        let id = sandbox.id();
        let token = sandbox.token();
        let path = |port: &str| format!("/v1/sandboxes/{id}/ports/{port}");
        let (status, ..) = upgrade_to(addr, &path("8001"), token, Some("tcp")).await;
        assert_eq!(status, 502);
        for bad in ["0", "65536", "-1", "http", "8000x"] {
            let (status, ..) = upgrade_to(addr, &path(bad), token, Some("tcp")).await;
            assert_eq!(status, 400, "port {bad}");
        }
        let (status, ..) = upgrade_to(addr, &path("8000"), token, None).await;
        assert_eq!(status, 426);
        let (status, ..) = upgrade_to(addr, &path("8000"), token, Some("silkd")).await;
        assert_eq!(status, 426);

        // Another sandbox's token: as if the sandbox did not exist.
        let other = root.claim(ClaimOptions::new()).await.unwrap();
        let (status, ..) = upgrade_to(addr, &path("8000"), other.token(), Some("tcp")).await;
        assert_eq!(status, 404);
        other.release().await.unwrap();

        // Past the relay cap: 429, and the tunnels already open keep working.
        let mut held = Vec::new();
        for _ in 0..RELAY_CAP {
            held.push(sandbox.connect_port(8000).await.unwrap());
        }
        let (status, ..) = upgrade_to(addr, &path("8000"), token, Some("tcp")).await;
        assert_eq!(status, 429);
        assert!(matches!(
            get_hello(&sandbox).await,
            Err(Error::LimitReached(m)) if m.contains("max_relays_per_sandbox")
        ));
        for tunnel in &mut held {
            assert_hello(&http_get(tunnel, "/hello.txt").await);
        }
        drop(held);
        // Their slots come back once the tunnels have closed: the cap's worth opens again.
        let again = wait_until(
            Duration::from_secs(20),
            "relay slots to be freed",
            async || {
                let mut opened = Vec::new();
                for _ in 0..RELAY_CAP {
                    opened.push(sandbox.connect_port(8000).await?);
                }
                Ok::<_, Error>(opened)
            },
        )
        .await;
        for mut tunnel in again {
            assert_hello(&http_get(&mut tunnel, "/hello.txt").await);
        }
        census.wait_back_to(&before).await;
        sandbox.release().await.unwrap();
    })
    .await;
}
