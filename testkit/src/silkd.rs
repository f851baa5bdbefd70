//! A real silkd process on a Unix socket in a temp dir (stopped like any [`ChildGuard`]:
//! SIGTERM lets it kill its commands), and a small frame client for it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::UnixStream;
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

use crate::guard::ChildGuard;
use crate::procs;
use crate::wait::wait_until;

/// How long any one frame may take to arrive.
const FRAME_BOUND: Duration = Duration::from_secs(30);

/// A silkd owned by one test.
pub struct Silkd {
    guard: ChildGuard,
    /// Its socket.
    pub sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Silkd {
    /// Runs `binary` (silkd's tests pass `env!("CARGO_BIN_EXE_silkd")`); returns once it
    /// accepts connections.
    pub async fn start(binary: impl AsRef<Path>) -> Silkd {
        Silkd::start_with(binary, &[]).await
    }

    /// Like [`Silkd::start`], with extra flags (`--max-procs`, `--cgroup`).
    pub async fn start_with(binary: impl AsRef<Path>, flags: &[&str]) -> Silkd {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("silkd.sock");
        let mut cmd = Command::new(binary.as_ref());
        cmd.arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .args(flags)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        let mut guard = ChildGuard::spawn("silkd", &mut cmd).grace(Duration::from_secs(3));
        wait_until(Duration::from_secs(10), "silkd listening", async || {
            if let Some(status) = guard.try_exit() {
                panic!("silkd exited with {status}");
            }
            UnixStream::connect(&sock).await.map(drop)
        })
        .await;
        Silkd {
            guard,
            sock,
            _dir: dir,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// A new connection with the frame codec.
    pub async fn connect(&self) -> Client {
        Client {
            framed: Framed::new(self.raw().await, HostCodec::new()),
        }
    }

    /// A raw connection, for malformed-input tests.
    pub async fn raw(&self) -> UnixStream {
        UnixStream::connect(&self.sock).await.expect("connect")
    }

    /// Peak resident set (VmHWM) in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        procs::status_field(self.pid(), "VmHWM:").expect("silkd's VmHWM")
    }

    /// Resident set (VmRSS) in KiB.
    pub fn rss_kib(&self) -> u64 {
        procs::status_field(self.pid(), "VmRSS:").expect("silkd's VmRSS")
    }

    /// SIGTERM (silkd kills every command), then waits up to `within` for it to exit.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        self.guard.terminate(within)
    }

    /// True until silkd exits.
    pub fn is_running(&mut self) -> bool {
        self.guard.try_exit().is_none()
    }
}

/// A framed connection to silkd.
pub struct Client {
    /// The connection.
    pub framed: Framed<UnixStream, HostCodec>,
}

/// What one exec produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The command's pid (and process group).
    pub pid: u32,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: Vec<u8>,
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Signal, if one ended it.
    pub signal: Option<i32>,
    /// Whether its timeout ended it.
    pub timed_out: bool,
}

/// A plain `Exec` of `argv`.
pub fn exec_req(argv: &[&str]) -> Request {
    Request::Exec {
        detach: false,
        pty: None,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        env: None,
        stdin: false,
        timeout_ms: None,
        user: None,
    }
}

impl Client {
    /// Sends one request.
    pub async fn send(&mut self, r: Request) {
        self.framed.send(r).await.expect("send");
    }

    /// The next frame; panics on close or after 30 s.
    pub async fn recv(&mut self) -> Response {
        self.recv_or_close().await.expect("connection closed")
    }

    /// The next frame, or `None` when silkd closed the connection.
    pub async fn recv_or_close(&mut self) -> Option<Response> {
        tokio::time::timeout(FRAME_BOUND, self.framed.next())
            .await
            .expect("no answer within 30 s")
            .map(|r| r.expect("decode"))
    }

    /// Sends a request and returns the first answer.
    pub async fn rpc(&mut self, r: Request) -> Response {
        self.send(r).await;
        self.recv().await
    }

    /// Expects `Started`; returns the pid.
    pub async fn started(&mut self) -> u32 {
        match self.recv().await {
            Response::Started { pid } => pid,
            other => panic!("expected Started, got {other:?}"),
        }
    }

    /// Collects output until `Exit`; panics on anything unexpected.
    pub async fn collect(&mut self, pid: u32) -> Outcome {
        let mut out = Outcome {
            pid,
            ..Default::default()
        };
        loop {
            match self.recv().await {
                Response::Stdout { data } => out.stdout.extend_from_slice(&data),
                Response::Stderr { data } => out.stderr.extend_from_slice(&data),
                Response::Exit {
                    code,
                    signal,
                    timed_out,
                } => {
                    out.code = code;
                    out.signal = signal;
                    out.timed_out = timed_out;
                    return out;
                }
                other => panic!("unexpected {other:?} during exec"),
            }
        }
    }

    /// Runs an `Exec` request to its end.
    pub async fn exec(&mut self, r: Request) -> Outcome {
        self.send(r).await;
        let pid = self.started().await;
        self.collect(pid).await
    }

    /// Runs `argv` to its end.
    pub async fn run(&mut self, argv: &[&str]) -> Outcome {
        self.exec(exec_req(argv)).await
    }
}
