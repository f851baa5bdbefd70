//! Shared harness for sandboxd's integration tests: builds silkd once, starts a real
//! sandboxd in-process on port 0, and speaks plain HTTP/1.1 to it.
//! Everything a test starts dies with it: `Daemon::stop` destroys every sandbox, and if a
//! test panics first, dropping the runtime drops the guests (which SIGKILL their process
//! trees) and bubblewrap's `--die-with-parent` covers the rest.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const ROOT: &str = "root-token-for-tests-0001";
pub const TENANT_A: &str = "tenant-a-token-for-tests";
pub const TENANT_B: &str = "tenant-b-token-for-tests";

/// Builds silkd (once per test binary); returns its path.
pub fn silkd() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = std::process::Command::new(env!("CARGO"))
                .args(["build", "-p", "silkd", "--quiet"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .expect("running cargo build -p silkd");
            assert!(
                out.status.success(),
                "cargo build -p silkd: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let exe = std::env::current_exe().unwrap();
            let debug = exe.parent().unwrap().parent().unwrap();
            let silkd = debug.join("silkd");
            assert!(silkd.is_file(), "{} missing", silkd.display());
            silkd
        })
        .clone()
}

/// Knobs of the test config; everything else is small and fixed.
pub struct Setup {
    pub warm: u32,
    pub warm_max: u32,
    /// TOML array literal, e.g. `["false"]`.
    pub warmup: Option<String>,
    pub max_claims: u32,
    pub max_output_bytes: u64,
    pub memory_budget_bytes: u64,
    pub max_in_flight: u32,
    pub default_ttl_seconds: u64,
    pub max_ttl_seconds: u64,
    pub tenants: bool,
    /// `[process] cgroup_root`; the host's when absent.
    pub cgroup_root: Option<PathBuf>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            warm: 1,
            warm_max: 4,
            warmup: None,
            max_claims: 8,
            max_output_bytes: 64 * 1024,
            memory_budget_bytes: 1024 * 1024,
            max_in_flight: 8,
            default_ttl_seconds: 60,
            max_ttl_seconds: 120,
            tenants: true,
            cgroup_root: None,
        }
    }
}

impl Setup {
    pub fn toml(&self, data_dir: &Path, listen: &str) -> String {
        let mut t = format!(
            r#"listen = "{listen}"
data_dir = "{data}"
api_token = "{ROOT}"
silkd_path = "{silkd}"
max_claims = {max_claims}
default_ttl_seconds = {dttl}
max_ttl_seconds = {mttl}
boot_timeout_seconds = 10
warmup_timeout_seconds = 10

[templates.host]
rootfs = "/"

[sizes.small]
cpus = 1
memory_mib = 256
max_pids = 256

[[pools]]
template = "host"
size = "small"
warm = {warm}
warm_max = {warm_max}
"#,
            data = data_dir.display(),
            silkd = silkd().display(),
            max_claims = self.max_claims,
            dttl = self.default_ttl_seconds,
            mttl = self.max_ttl_seconds,
            warm = self.warm,
            warm_max = self.warm_max,
        );
        if let Some(w) = &self.warmup {
            t.push_str(&format!("warmup = {w}\n"));
        }
        t.push_str(&format!(
            "\n[exec]\nmax_output_bytes = {}\nmemory_budget_bytes = {}\nmax_in_flight = {}\n",
            self.max_output_bytes, self.memory_budget_bytes, self.max_in_flight
        ));
        if let Some(root) = &self.cgroup_root {
            t.push_str(&format!(
                "\n[process]\ncgroup_root = \"{}\"\n",
                root.display()
            ));
        }
        if self.tenants {
            t.push_str(&format!(
                "\n[[tenants]]\nname = \"a\"\ntoken = \"{TENANT_A}\"\nmax_claims = 2\n\
                 \n[[tenants]]\nname = \"b\"\ntoken = \"{TENANT_B}\"\nmax_claims = 1\n"
            ));
        }
        t
    }
}

/// An HTTP answer.
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A sandboxd running in this test process.
pub struct Daemon {
    pub addr: SocketAddr,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<sandboxd::Result<()>>>,
}

impl Daemon {
    pub async fn start(setup: Setup) -> Daemon {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let mut d = Daemon::start_in(&dir, &setup).await;
        d._tmp = Some(tmp);
        d
    }

    /// Starts on an existing data dir (restart tests keep the dir across daemons).
    pub async fn start_in(dir: &Path, setup: &Setup) -> Daemon {
        let text = setup.toml(dir, "127.0.0.1:0");
        Daemon::start_text(dir, &text).await
    }

    pub async fn start_text(dir: &Path, text: &str) -> Daemon {
        let config = sandboxd::Config::parse(text).unwrap();
        let listener = sandboxd::Listener::bind(&config).await.unwrap();
        let sandboxd::Listener::Tcp(tcp) = &listener else {
            unreachable!("tests listen on TCP")
        };
        let addr = tcp.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(sandboxd::run(listener, config, async move {
            let _ = stopped.await;
        }));
        Daemon {
            addr,
            dir: dir.to_path_buf(),
            _tmp: None,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Graceful shutdown: every sandbox is destroyed when this returns.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("sandboxd did not stop within 20 s")
            .unwrap()
            .unwrap();
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Resp {
        call(self.addr, method, path, token, body).await
    }

    pub async fn claim_as(&self, token: &str) -> (String, String) {
        let r = self
            .call("POST", "/v1/claim", Some(token), Some("{}"))
            .await;
        assert_eq!(r.status, 200, "claim: {}", r.text());
        let v = r.json();
        (
            v["id"].as_str().unwrap().to_string(),
            v["token"].as_str().unwrap().to_string(),
        )
    }

    pub async fn claim(&self) -> (String, String) {
        self.claim_as(ROOT).await
    }

    pub async fn exec(&self, id: &str, token: &str, body: Value) -> Resp {
        let body = body.to_string();
        self.call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(token),
            Some(&body),
        )
        .await
    }

    pub async fn info(&self) -> Value {
        let r = self.call("GET", "/v1/info", Some(ROOT), None).await;
        assert_eq!(r.status, 200);
        r.json()
    }

    /// Polls `/v1/info` until `pred` holds for the first pool; panics after `within`.
    pub async fn wait_pool(
        &self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let start = Instant::now();
        loop {
            let info = self.info().await;
            if pred(&info["pools"][0]) {
                return info;
            }
            assert!(
                start.elapsed() < within,
                "timed out waiting for {what}: {info}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One request on a fresh connection.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Resp {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(path)
        .header("host", "sandboxd");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or("").to_string())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Resp {
        status,
        headers,
        body,
    }
}

/// Pids of processes whose command line contains `marker`.
pub fn procs_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) {
                found.push(pid);
            }
        }
    }
    found
}

/// Asserts that no process with `marker` remains (allowing a moment for SIGKILL to land).
pub async fn assert_gone(marker: &str) {
    let start = Instant::now();
    loop {
        let left = procs_with(marker);
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "processes with {marker:?} still running: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until a process with `marker` runs.
pub async fn wait_running(marker: &str) {
    let start = Instant::now();
    while procs_with(marker).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{marker:?} never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A sleep duration no other test (or test process) uses, to find its processes by.
pub fn marker(n: u32) -> String {
    format!("{}.{:05}{n}", 600 + n, std::process::id() % 100_000)
}
