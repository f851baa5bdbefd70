//! A real sandboxd for a test: in this process on port 0 ([`Daemon`], through
//! sandboxd's `Config::parse`, `Listener::bind` and `run` only), or the binary
//! ([`DaemonProcess`], for signal and crash tests and the SDK); both speak through
//! [`Api`]. Neither outlives its test: see their `Drop`s.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::guard::ChildGuard;
use crate::http::{call, Endpoint, Resp};
use crate::setup::{Listen, Setup, ROOT};
use crate::wait::wait_until;

/// A sandboxd's HTTP API, wherever it runs.
#[derive(Debug, Clone)]
pub struct Api {
    /// Where it listens.
    pub endpoint: Endpoint,
}

impl Api {
    /// The TCP address; panics on a Unix socket.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.endpoint.addr()
    }

    /// One request (see [`call`]).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Resp {
        call(&self.endpoint, method, path, token, body).await
    }

    /// Claims with `token`; returns the sandbox's id and token.
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

    /// Claims as root.
    pub async fn claim(&self) -> (String, String) {
        self.claim_as(ROOT).await
    }

    /// A buffered exec with `body` as its JSON request.
    pub async fn exec(&self, id: &str, token: &str, body: Value) -> Resp {
        let body = body.to_string();
        let path = format!("/v1/sandboxes/{id}/exec");
        self.call("POST", &path, Some(token), Some(&body)).await
    }

    /// `GET /v1/info` as root.
    pub async fn info(&self) -> Value {
        let r = self.call("GET", "/v1/info", Some(ROOT), None).await;
        assert_eq!(r.status, 200, "info: {}", r.text());
        r.json()
    }

    /// Polls `/v1/info` until `pred` holds for it; returns it.
    pub async fn wait_info(
        &self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        wait_until(within, what, async || {
            let info = self.info().await;
            if pred(&info) {
                Ok(info)
            } else {
                Err(info)
            }
        })
        .await
    }

    /// Polls `/v1/info` until `pred` holds for the first pool; returns the info.
    pub async fn wait_pool(
        &self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        self.wait_info(within, what, |info| pred(&info["pools"][0]))
            .await
    }
}

/// A sandboxd running in this test process. `stop` shuts it down gracefully (every
/// sandbox destroyed); dropping it without `stop` (a panicking test) does the same
/// within 20 s, then SIGKILLs any process still carrying its data dir.
pub struct Daemon {
    api: Api,
    /// Its data dir.
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<sandboxd::Result<()>>>,
}

impl Deref for Daemon {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Daemon {
    /// On TCP port 0 with a fresh data dir.
    pub async fn start(setup: Setup) -> Daemon {
        let tmp = tempfile::tempdir().unwrap();
        let mut d = Daemon::start_in(tmp.path(), &setup).await;
        d._tmp = Some(tmp);
        d
    }

    /// On TCP port 0 with an existing data dir (restart tests keep it across daemons).
    pub async fn start_in(dir: &Path, setup: &Setup) -> Daemon {
        Daemon::start_text(dir, &setup.toml(dir, "127.0.0.1:0")).await
    }

    /// With a config file's text; `dir` is its data dir.
    pub async fn start_text(dir: &Path, text: &str) -> Daemon {
        let config = sandboxd::Config::parse(text).unwrap();
        let listener = sandboxd::Listener::bind(&config).await.unwrap();
        let endpoint = match &listener {
            sandboxd::Listener::Tcp(tcp) => Endpoint::Tcp(tcp.local_addr().unwrap()),
            sandboxd::Listener::Unix(unix) => Endpoint::Unix(
                unix.local_addr()
                    .unwrap()
                    .as_pathname()
                    .expect("a named socket")
                    .to_path_buf(),
            ),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(sandboxd::run(listener, config, async move {
            let _ = stopped.await;
        }));
        Daemon {
            api: Api { endpoint },
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
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else {
            return; // stopped by the test
        };
        let _ = self.stop.take().map(|s| s.send(()));
        // Wait for the graceful stop from a plain thread: Drop cannot await, and this
        // thread may be a runtime worker or inside `block_on`. Only a multi-thread
        // runtime runs the daemon's tasks meanwhile; otherwise the sweep does it all.
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|r| r.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if let Some(runtime) = runtime {
            std::thread::scope(|s| {
                let waiter = s.spawn(|| {
                    runtime.block_on(async {
                        let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
                    })
                });
                // A second panic here would abort the test run; the sweep follows anyway.
                let _ = waiter.join();
            });
        }
        crate::guard::sweep(&self.dir.to_string_lossy());
    }
}

/// The `sandboxd` binary, its config and log in one directory. It is stopped (SIGTERM,
/// 15 s, SIGKILL) and its leftovers swept when dropped; its log is printed if the test
/// failed.
pub struct DaemonProcess {
    api: Api,
    guard: ChildGuard,
    _tmp: Option<tempfile::TempDir>,
}

impl Deref for DaemonProcess {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl DaemonProcess {
    /// Runs `binary` with `config` (written into `dir`, beside the log); returns once it
    /// serves. A `listen` on port 0 is fine: the address comes from its log.
    pub async fn start(binary: impl AsRef<Path>, dir: &Path, config: &str) -> DaemonProcess {
        // Several daemons may share a dir in turn (restart tests): one file pair each.
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let config_path = dir.join(format!("sandboxd-{n}.toml"));
        std::fs::write(&config_path, config).unwrap();
        let log = dir.join(format!("sandboxd-{n}.log"));
        let mut cmd = Command::new(binary.as_ref());
        cmd.arg("--config")
            .arg(&config_path)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut guard = ChildGuard::spawn("sandboxd", &mut cmd)
            .log(log.clone())
            .sweep(dir.to_string_lossy().into_owned());
        let endpoint = wait_until(Duration::from_secs(20), "sandboxd serving", async || {
            if let Some(status) = guard.try_exit() {
                panic!("sandboxd exited with {status}:\n{}", guard.log_text());
            }
            serving_on(&guard.log_text()).ok_or("no `sandboxd serving` line yet")
        })
        .await;
        DaemonProcess {
            api: Api { endpoint },
            guard,
            _tmp: None,
        }
    }

    /// `binary` with `setup`, in a fresh temp dir (data in `data/`).
    pub async fn start_temp(
        binary: impl AsRef<Path>,
        setup: &Setup,
        listen: Listen,
    ) -> DaemonProcess {
        let tmp = tempfile::tempdir().unwrap();
        let text = setup.toml(&tmp.path().join("data"), &listen.address(tmp.path()));
        let mut d = DaemonProcess::start(binary, tmp.path(), &text).await;
        d._tmp = Some(tmp);
        d
    }

    /// The data dir of a daemon from [`start_temp`](Self::start_temp), for a leftovers
    /// [`Census`](crate::leftovers::Census).
    pub fn data_dir(&self) -> PathBuf {
        let tmp = self._tmp.as_ref().expect("a daemon from start_temp");
        tmp.path().join("data")
    }

    /// The process: signal it, wait for its exit, SIGKILL it.
    pub fn process(&mut self) -> &mut ChildGuard {
        &mut self.guard
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        self.guard.log_text()
    }
}

/// The address in the `sandboxd serving listen=...` log line, once it is there.
fn serving_on(log: &str) -> Option<Endpoint> {
    let line = log.lines().find(|l| l.contains("sandboxd serving"))?;
    let value = line.split_once("listen=")?.1.split_whitespace().next()?;
    Some(Endpoint::parse(value))
}
