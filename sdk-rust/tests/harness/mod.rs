//! Test harness: a real sandboxd binary (process engine, real silkd) in a temp dir,
//! listening on a Unix socket (or TCP), stopped with SIGTERM on drop — sandboxd then
//! destroys every sandbox — and SIGKILLed if it dawdles; its log is printed when the test
//! failed. The daemon also gets SIGTERM if the test process dies first (PDEATHSIG).
#![allow(dead_code)]

use std::future::Future;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sandbox_sdk::{Client, ProcState, Sandbox};

pub const ROOT: &str = "root-token-for-sdk-tests-0001";
pub const TENANT: &str = "tenant-token-for-sdk-tests-01";

/// Bound on any one test's body: a hang fails instead of stalling the suite.
pub const TEST_BOUND: Duration = Duration::from_secs(60);

/// The config knobs tests change; everything else is small and fixed.
#[derive(Clone)]
pub struct Limits {
    pub max_claims: u32,
    pub tenant_max_claims: u32,
    pub max_output_bytes: u64,
    pub max_in_flight: u32,
    pub warm: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_claims: 16,
            tenant_max_claims: 1,
            max_output_bytes: 4 * 1024 * 1024,
            max_in_flight: 16,
            warm: 1,
        }
    }
}

/// sandboxd and silkd, built once per test binary (a no-op when they are fresh).
pub fn binaries() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = Command::new(env!("CARGO"))
            .args(["build", "-p", "sandboxd", "-p", "silkd", "--quiet"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("running cargo build -p sandboxd -p silkd");
        assert!(
            out.status.success(),
            "cargo build -p sandboxd -p silkd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let exe = std::env::current_exe().unwrap();
        let debug = exe.parent().unwrap().parent().unwrap();
        let pair = (debug.join("sandboxd"), debug.join("silkd"));
        for bin in [&pair.0, &pair.1] {
            assert!(bin.is_file(), "{} missing", bin.display());
        }
        pair
    })
}

/// A sandboxd process owned by one test.
pub struct Daemon {
    child: Child,
    pub url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// On a Unix socket with the default limits.
    pub fn start() -> Daemon {
        Daemon::start_with(Limits::default())
    }

    /// On a Unix socket.
    pub fn start_with(limits: Limits) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("sandboxd.sock");
        Daemon::spawn(dir, &format!("unix:{}", sock.display()), limits)
    }

    /// On TCP, at a port picked free just before.
    pub fn start_tcp() -> Daemon {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        Daemon::spawn(dir, &format!("127.0.0.1:{port}"), Limits::default())
    }

    fn spawn(dir: tempfile::TempDir, listen: &str, limits: Limits) -> Daemon {
        let (sandboxd, silkd) = binaries();
        let config = dir.path().join("sandboxd.toml");
        std::fs::write(&config, config_text(dir.path(), listen, silkd, &limits)).unwrap();
        let log = dir.path().join("sandboxd.log");
        let mut cmd = Command::new(sandboxd);
        cmd.arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn sandboxd");
        let url = match listen.strip_prefix("unix:") {
            Some(_) => listen.to_string(),
            None => format!("http://{listen}"),
        };
        let mut daemon = Daemon {
            child,
            url,
            log,
            _dir: dir,
        };
        daemon.wait_listening(listen);
        daemon
    }

    fn wait_listening(&mut self, listen: &str) {
        let start = Instant::now();
        loop {
            let up = match listen.strip_prefix("unix:") {
                Some(path) => std::os::unix::net::UnixStream::connect(path).is_ok(),
                None => std::net::TcpStream::connect(listen).is_ok(),
            };
            if up {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("sandboxd exited with {status}:\n{}", self.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "sandboxd did not listen on {listen}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A client with the root token.
    pub fn root(&self) -> Client {
        self.client().with_token(ROOT)
    }

    /// A client with no token.
    pub fn client(&self) -> Client {
        Client::new(&self.url).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM: sandboxd destroys every sandbox, then exits.
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: signalling our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap_or(None) {
                break Some(status);
            }
            if start.elapsed() > Duration::from_secs(15) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if std::thread::panicking() || status.is_none_or(|s| !s.success()) {
            eprintln!(
                "---- sandboxd ({}) log ----\n{}",
                match status {
                    Some(s) => s.to_string(),
                    None => "SIGKILLed after 15 s".into(),
                },
                self.log_text()
            );
        }
    }
}

fn config_text(dir: &Path, listen: &str, silkd: &Path, l: &Limits) -> String {
    format!(
        r#"listen = "{listen}"
data_dir = "{data}"
api_token = "{ROOT}"
silkd_path = "{silkd}"
max_claims = {max_claims}
default_ttl_seconds = 120
max_ttl_seconds = 600
boot_timeout_seconds = 10

[[tenants]]
name = "t"
token = "{TENANT}"
max_claims = {tenant_max_claims}

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
warm_max = 4

[exec]
max_output_bytes = {max_output}
memory_budget_bytes = 16777216
max_in_flight = {max_in_flight}
"#,
        data = dir.join("data").display(),
        silkd = silkd.display(),
        max_claims = l.max_claims,
        tenant_max_claims = l.tenant_max_claims,
        warm = l.warm,
        max_output = l.max_output_bytes,
        max_in_flight = l.max_in_flight,
    )
}

/// Runs a test body, failing it if it takes longer than [`TEST_BOUND`].
pub async fn bounded<T>(body: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, body)
        .await
        .expect("test body exceeded its time bound")
}

/// Pids of the commands still running in the sandbox, asked with a wire `Ps`.
pub async fn running(sandbox: &Sandbox) -> Vec<u32> {
    sandbox
        .processes()
        .await
        .expect("ps over the relay")
        .into_iter()
        .filter(|p| p.state == ProcState::Running)
        .map(|p| p.pid)
        .collect()
}

/// Waits (bounded) until nothing runs in the sandbox; fails with what still runs.
pub async fn assert_nothing_runs(sandbox: &Sandbox) {
    let start = Instant::now();
    loop {
        let pids = running(sandbox).await;
        if pids.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still running in {}: {pids:?}",
            sandbox.id()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An example of this crate, built (once per name) and returned as a path.
pub fn example(name: &str) -> PathBuf {
    let out = Command::new(env!("CARGO"))
        .args(["build", "-p", "sdk-rust", "--quiet", "--example", name])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo build --example");
    assert!(
        out.status.success(),
        "cargo build --example {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(path.is_file(), "{} missing", path.display());
    path
}
