//! Test harness: a real silkd process on a Unix socket in a temp dir, killed on drop,
//! and a small frame client.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio::net::UnixStream;
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

pub struct Silkd {
    child: Child,
    pub sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Silkd {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("silkd.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_silkd"))
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn silkd");
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "silkd did not listen"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Silkd {
            child,
            sock,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn connect(&self) -> Client {
        let s = UnixStream::connect(&self.sock).await.expect("connect");
        Client {
            framed: Framed::new(s, HostCodec::new()),
        }
    }

    /// Raw socket, for malformed-input tests.
    pub async fn raw(&self) -> UnixStream {
        UnixStream::connect(&self.sock).await.expect("connect")
    }

    /// Peak resident set (VmHWM) in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        status_field(self.pid(), "VmHWM:")
    }

    pub fn rss_kib(&self) -> u64 {
        status_field(self.pid(), "VmRSS:")
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }
}

impl Drop for Silkd {
    fn drop(&mut self) {
        // SIGTERM lets silkd kill its commands; SIGKILL if it dawdles.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("field")
}

pub struct Client {
    pub framed: Framed<UnixStream, HostCodec>,
}

#[derive(Debug, Default)]
pub struct Outcome {
    pub pid: u32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
}

pub fn exec_req(argv: &[&str]) -> Request {
    Request::Exec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        env: None,
        stdin: false,
        timeout_ms: None,
    }
}

impl Client {
    pub async fn send(&mut self, r: Request) {
        self.framed.send(r).await.expect("send");
    }

    pub async fn recv(&mut self) -> Response {
        tokio::time::timeout(Duration::from_secs(30), self.framed.next())
            .await
            .expect("no answer within 30 s")
            .expect("connection closed")
            .expect("decode")
    }

    /// Next frame, or None when silkd closed the connection.
    pub async fn recv_or_close(&mut self) -> Option<Response> {
        tokio::time::timeout(Duration::from_secs(30), self.framed.next())
            .await
            .expect("no answer within 30 s")
            .map(|r| r.expect("decode"))
    }

    pub async fn rpc(&mut self, r: Request) -> Response {
        self.send(r).await;
        self.recv().await
    }

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

    pub async fn exec(&mut self, r: Request) -> Outcome {
        self.send(r).await;
        let pid = self.started().await;
        self.collect(pid).await
    }

    pub async fn run(&mut self, argv: &[&str]) -> Outcome {
        self.exec(exec_req(argv)).await
    }
}

/// Pids of live (non-zombie) processes whose process group is `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command name: state ppid pgrp ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" {
            out.push(pid);
        }
    }
    out
}

/// Waits (bounded) until no live process of `pgid` remains; returns what is left.
pub async fn wait_group_gone(pgid: u32, within: Duration) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let left = group_members(pgid);
        if left.is_empty() || start.elapsed() > within {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (bounded) until at least `n` live processes are in group `pgid`.
pub async fn wait_group_size(pgid: u32, n: usize) {
    let start = Instant::now();
    while group_members(pgid).len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "group {pgid} never reached {n} processes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
