//! Driving silkd's pseudo-terminal execs from tests: the request, typing, reading the
//! screen until something appears, and counting the pty fds a process holds.

use wire::{Pty, Request, Response};

use crate::silkd::Client;

/// An `Exec` of `argv` under a `rows` x `cols` pty with the default `TERM`.
pub fn pty_exec_req(argv: &[&str], rows: u32, cols: u32) -> Request {
    pty_exec_with(
        argv,
        Pty {
            rows,
            cols,
            term: None,
        },
    )
}

/// An `Exec` of `argv` under the given pty (which may be hostile).
pub fn pty_exec_with(argv: &[&str], pty: Pty) -> Request {
    Request::Exec {
        detach: false,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        env: None,
        stdin: false,
        timeout_ms: None,
        user: None,
        pty: Some(pty),
    }
}

impl Client {
    /// Types `text` into the running pty exec.
    pub async fn type_in(&mut self, text: &[u8]) {
        self.send(Request::Stdin {
            data: text.to_vec(),
        })
        .await;
    }

    /// Reads `Stdout` frames until what arrived since the call contains `needle`;
    /// returns it. Panics on `Stderr` (a pty has one stream), `Exit` or anything else.
    pub async fn read_until(&mut self, needle: &str) -> String {
        let mut seen = Vec::new();
        loop {
            match self.recv().await {
                Response::Stdout { data } => seen.extend_from_slice(&data),
                other => panic!(
                    "waiting for {needle:?} after {:?}: got {other:?}",
                    String::from_utf8_lossy(&seen)
                ),
            }
            let text = String::from_utf8_lossy(&seen);
            if text.contains(needle) {
                return text.into_owned();
            }
        }
    }
}

/// How many pty masters (`/dev/ptmx`) and slaves (`/dev/pts/N`) `pid` holds open.
pub fn pty_fds(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| {
            let t = t.to_string_lossy();
            t == "/dev/ptmx" || t.starts_with("/dev/pts/")
        })
        .count()
}

/// Reads a pty [`sandbox_sdk::Process`]'s output until what arrived since the call
/// contains `needle`; returns it. Panics on stderr (a pty has one stream) or the exit.
pub async fn read_process_until(process: &mut sandbox_sdk::Process, needle: &str) -> String {
    let mut seen = Vec::new();
    loop {
        match process.next_event().await {
            Ok(Some(sandbox_sdk::Event::Stdout(data))) => seen.extend_from_slice(&data),
            other => panic!(
                "waiting for {needle:?} after {:?}: got {other:?}",
                String::from_utf8_lossy(&seen)
            ),
        }
        let text = String::from_utf8_lossy(&seen);
        if text.contains(needle) {
            return text.into_owned();
        }
    }
}
