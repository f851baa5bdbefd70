//! Buffered exec (DESIGN section 5): admission against the in-flight limit, one fresh guest
//! stream per exec, output collected on raw bytes against the per-exec cap and a node-wide
//! memory budget (overflow spills to an unlinked temp file), the bounded `Kill` on every
//! give-up path, and the response body encoded incrementally from the raw output.
//!
//! Must not: hold a response body whole, answer before a give-up's `Kill` was answered or
//! timed out, or count output on encoded (escaped) bytes.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures::SinkExt;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use wire::{ErrorKind, Request, Response};

use crate::claims::Sandbox;
use crate::config::ExecConfig;
use crate::error::{Error, Result};
use crate::guest;
use crate::metrics::Metrics;

/// Raw bytes encoded per body chunk: a multiple of 3 so base64 needs no padding mid-body,
/// and small so 50 concurrent bodies in flight stay far below the memory slack.
const RAW_CHUNK: usize = 8190;
/// Largest `timeout_seconds` accepted (one year).
const MAX_TIMEOUT_SECONDS: f64 = 365.0 * 86_400.0;
/// Slack over `timeout_seconds` for silkd's own timer to answer first.
const TIMEOUT_GRACE: Duration = Duration::from_secs(1);

/// Node-wide bytes of buffered output allowed in memory.
pub struct Budget {
    limit: u64,
    used: AtomicU64,
    metrics: Arc<Metrics>,
}

impl Budget {
    fn try_take(&self, n: u64) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u + n <= self.limit).then_some(u + n)
            })
            .is_ok();
        if taken {
            self.metrics.exec_buffered_bytes.inc_by(n as i64);
        }
        taken
    }

    fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::SeqCst);
        self.metrics.exec_buffered_bytes.dec_by(n as i64);
    }
}

/// Exec limits and the state they guard.
pub struct Execs {
    max_output: u64,
    max_in_flight: u32,
    in_flight: AtomicU32,
    budget: Arc<Budget>,
    spill_dir: PathBuf,
    metrics: Arc<Metrics>,
}

/// One admitted exec; frees its in-flight slot on drop.
pub struct Admitted {
    execs: Arc<Execs>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.execs.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.execs.metrics.exec_in_flight.dec();
    }
}

/// A finished command and its captured output, ready to encode.
pub struct Finished {
    exit_code: Option<i32>,
    signal: Option<i32>,
    stdout: Captured,
    stderr: Captured,
}

impl Execs {
    /// Limits from `[exec]`; spill files go under `spill_dir`.
    pub fn new(config: &ExecConfig, spill_dir: PathBuf, metrics: Arc<Metrics>) -> Execs {
        Execs {
            max_output: config.max_output_bytes,
            max_in_flight: config.max_in_flight,
            in_flight: AtomicU32::new(0),
            budget: Arc::new(Budget {
                limit: config.memory_budget_bytes,
                used: AtomicU64::new(0),
                metrics: metrics.clone(),
            }),
            spill_dir,
            metrics,
        }
    }

    /// Takes an in-flight slot, or 503 with `Retry-After`.
    pub fn admit(self: &Arc<Self>) -> Result<Admitted> {
        let max = self.max_in_flight;
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| Error::Busy {
                reason: format!("{max} buffered execs in flight; retry later"),
                retry_after: 1,
            })?;
        self.metrics.exec_in_flight.inc();
        Ok(Admitted {
            execs: self.clone(),
        })
    }
}

/// Checks a request before admission: non-empty argv, positive finite timeout.
pub fn validate(req: &api::ExecRequest) -> Result<()> {
    if req.argv.is_empty() || req.argv[0].is_empty() {
        return Err(Error::BadRequest("argv must not be empty".into()));
    }
    if let Some(t) = req.timeout_seconds {
        // The upper bound keeps the value representable as a Duration and as silkd's
        // `timeout_ms`; no sandbox lives that long anyway.
        if !t.is_finite() || t <= 0.0 || t > MAX_TIMEOUT_SECONDS {
            return Err(Error::BadRequest(format!(
                "timeout_seconds must be a positive number up to {MAX_TIMEOUT_SECONDS}"
            )));
        }
    }
    Ok(())
}

/// Why collection stopped early.
enum GiveUp {
    Timeout,
    TooLarge,
    ClientGone,
    Guest(Error),
}

/// Runs the exec in its own task so that a client hanging up (which drops the HTTP
/// handler) still ends in a `Kill`; the handler awaits the returned receiver, and the task
/// notices the receiver's drop.
pub fn spawn(
    execs: Arc<Execs>,
    admitted: Admitted,
    sandbox: Arc<Sandbox>,
    req: api::ExecRequest,
) -> oneshot::Receiver<Result<Finished>> {
    let (mut tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let outcome = match sandbox.failed_error() {
            Some(e) => Err(e),
            // A guest that died mid-exec shows as a closed channel; say what happened.
            None => match run(&execs, &sandbox, req, &mut tx).await {
                Err(e) => Err(sandbox.explain(e).await),
                ok => ok,
            },
        };
        drop(admitted);
        let _ = tx.send(outcome);
    });
    rx
}

async fn run(
    execs: &Execs,
    sandbox: &Sandbox,
    req: api::ExecRequest,
    client: &mut oneshot::Sender<Result<Finished>>,
) -> Result<Finished> {
    let guest = &*sandbox.guest;
    let mut conn = guest::connect(guest).await.inspect_err(|e| {
        sandbox.mark_failed(&e.to_string());
    })?;
    let timeout = req.timeout_seconds.map(Duration::from_secs_f64);
    conn.send(Request::Exec {
        argv: req.argv,
        cwd: req.cwd,
        env: req.env.map(|m| m.into_iter().collect()),
        stdin: false,
        timeout_ms: timeout.map(|t| t.as_millis().max(1) as u64),
    })
    .await?;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t + TIMEOUT_GRACE);
    let mut stdout = Captured::new(execs.budget.clone(), execs.spill_dir.clone());
    let mut stderr = Captured::new(execs.budget.clone(), execs.spill_dir.clone());
    let mut pid = None;
    let mut total: u64 = 0;
    let give_up = loop {
        let frame = tokio::select! {
            frame = guest::next(&mut conn) => frame,
            () = sleep_until(deadline) => break GiveUp::Timeout,
            () = client.closed() => break GiveUp::ClientGone,
        };
        let (data, out) = match frame {
            Ok(Response::Started { pid: p }) => {
                pid = Some(p);
                continue;
            }
            Ok(Response::Stdout { data }) => (data, &mut stdout),
            Ok(Response::Stderr { data }) => (data, &mut stderr),
            Ok(Response::Exit {
                timed_out: true, ..
            }) => break GiveUp::Timeout,
            Ok(Response::Exit { code, signal, .. }) => {
                return Ok(Finished {
                    exit_code: code,
                    signal,
                    stdout,
                    stderr,
                })
            }
            Ok(Response::Error { kind, message }) => {
                let e = match kind {
                    ErrorKind::BadRequest => Error::BadRequest(message),
                    ErrorKind::ResourceExhausted => Error::Busy {
                        reason: format!("guest out of resources: {message}"),
                        retry_after: 1,
                    },
                    other => Error::Guest(format!("{}: {message}", other.as_str())),
                };
                break GiveUp::Guest(e);
            }
            Ok(other) => break GiveUp::Guest(Error::Guest(format!("unexpected frame {other:?}"))),
            Err(e) => break GiveUp::Guest(e),
        };
        total += data.len() as u64;
        if total > execs.max_output {
            break GiveUp::TooLarge;
        }
        if let Err(e) = out.push(data, &execs.metrics).await {
            break GiveUp::Guest(e);
        }
    };
    // Every give-up kills the command through a fresh stream, and answers only after.
    if let Some(pid) = pid {
        let _ = guest::kill(guest, pid).await;
    }
    drop(conn);
    Err(match give_up {
        GiveUp::Timeout => Error::Timeout {
            seconds: req.timeout_seconds.unwrap_or_default(),
        },
        GiveUp::TooLarge => Error::OutputTooLarge {
            limit: execs.max_output,
        },
        GiveUp::ClientGone => Error::Guest("the client went away".into()),
        GiveUp::Guest(e) => e,
    })
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// One stream's output: a prefix in memory (charged to the budget), the rest in an unlinked
/// temp file once the budget said no. Tracks UTF-8 validity as bytes arrive.
pub struct Captured {
    budget: Arc<Budget>,
    spill_dir: PathBuf,
    memory: VecDeque<Vec<u8>>,
    /// Bytes of `memory.front()` already handed out.
    front_offset: usize,
    charged: u64,
    spill: Option<tokio::fs::File>,
    utf8: Utf8Check,
}

impl Captured {
    fn new(budget: Arc<Budget>, spill_dir: PathBuf) -> Captured {
        Captured {
            budget,
            spill_dir,
            memory: VecDeque::new(),
            front_offset: 0,
            charged: 0,
            spill: None,
            utf8: Utf8Check::default(),
        }
    }

    async fn push(&mut self, data: Vec<u8>, metrics: &Metrics) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.utf8.push(&data);
        let n = data.len() as u64;
        // Once spilling, keep spilling so the order of bytes is memory prefix, file rest.
        if self.spill.is_none() && self.budget.try_take(n) {
            self.charged += n;
            self.memory.push_back(data);
            return Ok(());
        }
        if self.spill.is_none() {
            let file = tempfile::tempfile_in(&self.spill_dir).map_err(Error::io(format!(
                "spill file in {}",
                self.spill_dir.display()
            )))?;
            self.spill = Some(tokio::fs::File::from_std(file));
        }
        let file = self.spill.as_mut().expect("spill file just set");
        file.write_all(&data)
            .await
            .map_err(Error::io("writing spill file"))?;
        metrics.exec_spilled_bytes.inc_by(n);
        Ok(())
    }

    async fn rewind(&mut self) -> Result<()> {
        if let Some(file) = &mut self.spill {
            file.flush()
                .await
                .map_err(Error::io("flushing spill file"))?;
            file.seek(std::io::SeekFrom::Start(0))
                .await
                .map_err(Error::io("rewinding spill file"))?;
        }
        Ok(())
    }

    /// Up to `max` next raw bytes; empty at the end. Memory is returned to the budget as
    /// it is handed out.
    async fn next_chunk(&mut self, max: usize) -> Result<Vec<u8>> {
        if let Some(front) = self.memory.front() {
            let end = (self.front_offset + max).min(front.len());
            let chunk = front[self.front_offset..end].to_vec();
            self.front_offset = end;
            if end == front.len() {
                let freed = front.len() as u64;
                self.memory.pop_front();
                self.front_offset = 0;
                self.charged -= freed;
                self.budget.give(freed);
            }
            return Ok(chunk);
        }
        let Some(file) = &mut self.spill else {
            return Ok(Vec::new());
        };
        let mut buf = vec![0u8; max];
        let n = file
            .read(&mut buf)
            .await
            .map_err(Error::io("reading spill file"))?;
        buf.truncate(n);
        Ok(buf)
    }
}

impl Drop for Captured {
    fn drop(&mut self) {
        self.budget.give(self.charged);
    }
}

/// Incremental UTF-8 validation across chunk boundaries.
#[derive(Default)]
struct Utf8Check {
    invalid: bool,
    /// An incomplete sequence at the end of the bytes seen so far.
    pending: Vec<u8>,
}

impl Utf8Check {
    fn push(&mut self, mut data: &[u8]) {
        if self.invalid {
            return;
        }
        if !self.pending.is_empty() {
            let need = match self.pending[0] {
                0xC2..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            } - self.pending.len();
            let take = need.min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if take < need {
                return;
            }
            if std::str::from_utf8(&self.pending).is_err() {
                self.invalid = true;
                return;
            }
            self.pending.clear();
        }
        if let Err(e) = std::str::from_utf8(data) {
            if e.error_len().is_some() {
                self.invalid = true;
            } else {
                self.pending = data[e.valid_up_to()..].to_vec();
            }
        }
    }

    fn is_valid(&self) -> bool {
        !self.invalid && self.pending.is_empty()
    }
}

/// Appends `raw` as the inside of a JSON string. Only ASCII needs escaping; the bytes are
/// known to be valid UTF-8, so everything else passes through as is.
fn escape_json(raw: &[u8], out: &mut Vec<u8>) {
    let mut start = 0;
    for (i, &b) in raw.iter().enumerate() {
        let escaped: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            0x00..=0x1F => None,
            _ => continue,
        };
        out.extend_from_slice(&raw[start..i]);
        match escaped {
            Some(e) => out.extend_from_slice(e),
            None => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let (hi, lo) = (HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]);
                out.extend_from_slice(&[b'\\', b'u', b'0', b'0', hi, lo]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(&raw[start..]);
}

/// A response body fed chunk by chunk by the encoder task; at most one chunk waits.
pub struct StreamedBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for StreamedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Starts encoding `finished` as the JSON answer and returns the body that streams it.
/// The encoder stops (and frees the output) as soon as the client stops reading.
pub fn encode_body(finished: Finished, encoding: api::Encoding) -> StreamedBody {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        if let Err(e) = write_body(finished, encoding, &tx).await {
            // Headers are gone already; cutting the body short is all that is left.
            tracing::warn!("exec body cut short: {e}");
        }
    });
    StreamedBody { rx }
}

async fn write_body(
    mut finished: Finished,
    encoding: api::Encoding,
    tx: &mpsc::Sender<Bytes>,
) -> Result<()> {
    let send = |b: Vec<u8>| async move {
        tx.send(Bytes::from(b))
            .await
            .map_err(|_| Error::Guest("client stopped reading".into()))
    };
    let mut head = match finished.exit_code {
        Some(code) => format!("{{\"exit_code\":{code}"),
        None => "{\"exit_code\":null".to_string(),
    };
    if let Some(signal) = finished.signal {
        head.push_str(&format!(",\"signal\":{signal}"));
    }
    send(head.into_bytes()).await?;
    for (name, captured) in [
        ("stdout", &mut finished.stdout),
        ("stderr", &mut finished.stderr),
    ] {
        let b64 = encoding == api::Encoding::Base64 || !captured.utf8.is_valid();
        let suffix = if b64 { "_b64" } else { "" };
        send(format!(",\"{name}{suffix}\":\"").into_bytes()).await?;
        captured.rewind().await?;
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let raw = captured.next_chunk(RAW_CHUNK).await?;
            if raw.is_empty() {
                break;
            }
            let mut out = Vec::with_capacity(raw.len() * 2);
            if b64 {
                // Encode whole 3-byte groups; the remainder waits for the next chunk.
                carry.extend_from_slice(&raw);
                let whole = carry.len() / 3 * 3;
                let encoded = base64::engine::general_purpose::STANDARD.encode(&carry[..whole]);
                out.extend_from_slice(encoded.as_bytes());
                carry.drain(..whole);
            } else {
                escape_json(&raw, &mut out);
            }
            if !out.is_empty() {
                send(out).await?;
            }
        }
        let mut tail = base64::engine::general_purpose::STANDARD
            .encode(&carry)
            .into_bytes();
        tail.push(b'"');
        send(tail).await?;
    }
    send(b"}".to_vec()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicU64::new(0),
            metrics: Arc::new(Metrics::new()),
        })
    }

    #[test]
    fn utf8_check_across_boundaries() {
        let text = "héllo → 😀 done".as_bytes();
        for split in 0..text.len() {
            let mut c = Utf8Check::default();
            c.push(&text[..split]);
            c.push(&text[split..]);
            assert!(c.is_valid(), "split at {split}");
        }
        for split in 0..4 {
            let mut c = Utf8Check::default();
            let emoji = "😀".as_bytes();
            c.push(&emoji[..split]);
            if split > 0 {
                assert!(!c.is_valid(), "incomplete sequence at end is not valid");
            }
        }
        let mut c = Utf8Check::default();
        c.push(b"ok\xff");
        assert!(!c.is_valid());
        let mut c = Utf8Check::default();
        c.push(b"\xe2\x82");
        c.push(b"A");
        assert!(!c.is_valid());
    }

    #[test]
    fn escape_matches_serde_json() {
        let raw: Vec<u8> = (0u8..128).chain("é😀\"\\".bytes()).collect();
        let mut out = b"\"".to_vec();
        escape_json(&raw, &mut out);
        out.push(b'"');
        let back: String = serde_json::from_slice(&out).unwrap();
        assert_eq!(back.as_bytes(), raw.as_slice());
    }

    async fn body_bytes(mut body: StreamedBody) -> Vec<u8> {
        let mut all = Vec::new();
        while let Some(b) = body.rx.recv().await {
            all.extend_from_slice(&b);
        }
        all
    }

    async fn captured(budget: &Arc<Budget>, dir: &std::path::Path, chunks: &[&[u8]]) -> Captured {
        let mut c = Captured::new(budget.clone(), dir.to_path_buf());
        let metrics = Metrics::new();
        for ch in chunks {
            c.push(ch.to_vec(), &metrics).await.unwrap();
        }
        c
    }

    #[tokio::test]
    async fn body_round_trips_with_spill_and_budget() {
        let dir = tempfile::tempdir().unwrap();
        // A budget of 10 bytes: the first chunk stays in memory, the rest spills.
        let b = budget(10);
        let big: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let out = captured(&b, dir.path(), &[b"0123456789", &big, b"\x01\x02"]).await;
        let err = captured(&b, dir.path(), &[b"warn\n\"q\""]).await;
        assert_eq!(
            b.used.load(Ordering::SeqCst),
            10,
            "second stream could not fit"
        );
        let finished = Finished {
            exit_code: Some(3),
            signal: None,
            stdout: out,
            stderr: err,
        };
        let body = body_bytes(encode_body(finished, api::Encoding::Utf8)).await;
        let resp: api::ExecResponse = serde_json::from_slice(&body).unwrap();
        let mut expected = b"0123456789".to_vec();
        expected.extend_from_slice(&big);
        expected.extend_from_slice(b"\x01\x02");
        let got = base64::engine::general_purpose::STANDARD
            .decode(resp.stdout_b64.unwrap())
            .unwrap();
        assert_eq!(got, expected);
        assert_eq!(resp.stdout, None);
        assert_eq!(resp.stderr.as_deref(), Some("warn\n\"q\""));
        assert_eq!(resp.exit_code, Some(3));
        assert_eq!(b.used.load(Ordering::SeqCst), 0, "budget returned");
    }

    #[tokio::test]
    async fn base64_encoding_is_forced() {
        let dir = tempfile::tempdir().unwrap();
        let b = budget(1 << 20);
        for len in [0usize, 1, 2, 3, 8190, 8191, 20_000] {
            let data: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let finished = Finished {
                exit_code: None,
                signal: Some(9),
                stdout: captured(&b, dir.path(), &[&data]).await,
                stderr: captured(&b, dir.path(), &[]).await,
            };
            let body = body_bytes(encode_body(finished, api::Encoding::Base64)).await;
            let resp: api::ExecResponse = serde_json::from_slice(&body).unwrap();
            assert_eq!(resp.signal, Some(9));
            assert_eq!(resp.exit_code, None);
            let got = base64::engine::general_purpose::STANDARD
                .decode(resp.stdout_b64.unwrap())
                .unwrap();
            assert_eq!(got, data, "len {len}");
            assert_eq!(resp.stderr_b64.as_deref(), Some(""));
        }
    }

    #[test]
    fn validation() {
        let ok = api::ExecRequest {
            argv: vec!["true".into()],
            ..Default::default()
        };
        assert!(validate(&ok).is_ok());
        let empty = api::ExecRequest::default();
        assert!(matches!(validate(&empty), Err(Error::BadRequest(_))));
        for t in [-1.0, 0.0, f64::NAN, f64::INFINITY, 1e20] {
            let r = api::ExecRequest {
                timeout_seconds: Some(t),
                ..ok.clone()
            };
            assert!(validate(&r).is_err(), "{t}");
        }
    }
}
