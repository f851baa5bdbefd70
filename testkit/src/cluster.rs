//! sandboxd nodes in one cluster for a test: the binary (so a node can be `kill -9`ed)
//! with a `[cluster]` table naming a test [`Etcd`], a short lease, and what a test reads
//! off the cluster (the members a node sees, the node that served an answer).

use std::time::Duration;

use serde_json::Value;

use crate::daemon::{Api, DaemonProcess};
use crate::etcd::Etcd;
use crate::http::Resp;
use crate::setup::{Listen, Setup, ROOT};
use crate::wait::wait_until;

/// The nodes' shared `peer_token`.
pub const PEER_TOKEN: &str = "peer-token-for-tests-0001";
/// The nodes' lease TTL: a killed node is gone this long after its last keep-alive.
pub const LEASE_TTL_SECONDS: u64 = 3;

/// The `[cluster]` table of node `name`.
pub fn cluster_toml(etcd: &Etcd, name: &str) -> String {
    let endpoints = etcd
        .endpoints()
        .iter()
        .map(|e| format!("{e:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "\n[cluster]\netcd = [{endpoints}]\nnode_name = \"{name}\"\npeer_token = \"{PEER_TOKEN}\"\n\
         lease_ttl_seconds = {LEASE_TTL_SECONDS}\nprefix = \"/testkit\"\n"
    )
}

/// Starts the sandboxd binary as cluster node `name`, with `setup` otherwise.
pub async fn start_node(etcd: &Etcd, name: &str, setup: &Setup) -> DaemonProcess {
    start_node_with(etcd, name, setup, "").await
}

/// [`start_node`] with `extra` lines in its `[cluster]` table (TLS keys, say).
pub async fn start_node_with(etcd: &Etcd, name: &str, setup: &Setup, extra: &str) -> DaemonProcess {
    let mut setup = setup.clone();
    setup.tail.push_str(&cluster_toml(etcd, name));
    setup.tail.push_str(extra);
    DaemonProcess::start_temp(crate::bins::sandboxd(), &setup, Listen::Tcp).await
}

/// Runs the sandboxd binary as node `name` with `extra` `[cluster]` lines, expecting it
/// to refuse to start; returns its log (stderr), after checking that it exited non-zero
/// and left no process behind.
pub async fn refused(etcd: &Etcd, name: &str, setup: &Setup, extra: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let mut setup = setup.clone();
    setup.tail.push_str(&cluster_toml(etcd, name));
    setup.tail.push_str(extra);
    let text = setup.toml(&tmp.path().join("data"), &Listen::Tcp.address(tmp.path()));
    let config = tmp.path().join("sandboxd.toml");
    std::fs::write(&config, text).unwrap();
    let log = tmp.path().join("sandboxd.log");
    let mut cmd = std::process::Command::new(crate::bins::sandboxd());
    cmd.arg("--config")
        .arg(&config)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut guard = crate::guard::ChildGuard::spawn("sandboxd", &mut cmd)
        .log(log)
        .sweep(tmp.path().to_string_lossy().into_owned());
    let status = wait_until(Duration::from_secs(30), "sandboxd refusing", async || {
        guard.try_exit().ok_or_else(|| {
            let log = guard.log_text();
            let tail: Vec<&str> = log.lines().rev().take(6).collect();
            format!("still running; its log ends (newest first): {tail:#?}")
        })
    })
    .await;
    let text = guard.log_text();
    assert!(!status.success(), "sandboxd exited 0:\n{text}");
    // Whatever it started before giving up (its warm pool) went with it.
    crate::procs::wait_gone(&tmp.path().to_string_lossy(), Duration::from_secs(10)).await;
    text
}

/// `call`'s answer, as the SDK treats a 503 with `Retry-After` (etcd slow to answer on a
/// loaded host, a leader election): waited out and asked again, up to 5 times; any
/// other answer (or the sixth 503) is returned as it is.
pub async fn retrying_busy(what: &str, mut call: impl AsyncFnMut() -> Resp) -> Resp {
    let mut r = call().await;
    for _ in 0..5 {
        let retry_after = r
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        match (r.status.as_u16(), retry_after) {
            (503, Some(secs)) => {
                println!("{what}: 503, retrying after {secs} s: {}", r.text());
                tokio::time::sleep(Duration::from_secs(secs)).await;
                r = call().await;
            }
            _ => break,
        }
    }
    r
}

/// `GET /v1/cluster` as root.
pub async fn view(api: &Api) -> Value {
    let r = api.call("GET", "/v1/cluster", Some(ROOT), None).await;
    assert_eq!(r.status, 200, "GET /v1/cluster: {}", r.text());
    r.json()
}

/// One member's record in a view, by name.
pub fn member<'a>(view: &'a Value, name: &str) -> Option<&'a Value> {
    view["nodes"].as_array()?.iter().find(|n| n["name"] == name)
}

/// Waits until `api`'s view of the cluster satisfies `pred`; returns it.
pub async fn wait_view(api: &Api, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    wait_until(Duration::from_secs(30), what, async || {
        let v = view(api).await;
        if pred(&v) {
            Ok(v)
        } else {
            Err(v)
        }
    })
    .await
}

/// The node an answer names as its server (`x-sandboxd-node`).
pub fn served_by(r: &Resp) -> String {
    r.headers
        .get("x-sandboxd-node")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no x-sandboxd-node header ({}): {}", r.status, r.text()))
        .to_string()
}
