//! `POST /v1/sandboxes/{id}/exec`: validation, admission, the exec task's answer, and the
//! JSON body encoded incrementally from the raw output (never materialised whole; base64
//! or escaped JSON strings, chunk by chunk).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use tokio::sync::mpsc;

use super::{awake_for, read_json, status_of, Body};
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::exec::{self, Finished};
use crate::metrics::StatusLabel;
use crate::node::Node;

/// Raw bytes encoded per body chunk: a multiple of 3 so base64 needs no padding mid-body,
/// and small so 50 concurrent bodies in flight stay far below the memory slack.
const RAW_CHUNK: usize = 8190;

pub(super) async fn exec(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = awake_for(node, caller, id).await?;
    let body: api::ExecRequest = read_json(node, req, false).await?;
    exec::validate(&body)?;
    let encoding = body.encoding.unwrap_or_default();
    let admitted = node.execs.admit(&sandbox.id, sandbox.tenant.as_deref())?;
    let started = std::time::Instant::now();
    // A lost exec task (it panicked) is answered like a guest failure, and counted as
    // what it is answered with.
    let outcome = exec::spawn(node.execs.clone(), admitted, sandbox, body)
        .await
        .unwrap_or_else(|_| Err(Error::Guest("the exec task ended without an answer".into())));
    // A command the node cut short (timeout, output cap) is answered with its error's
    // status and, unlike other errors, with the output it wrote until then.
    let status = match &outcome {
        Ok(finished) => finished.cut.as_ref().map_or(StatusCode::OK, status_of),
        Err(e) => status_of(e),
    };
    let label = StatusLabel {
        status: status.as_u16(),
    };
    node.metrics.execs.get_or_create(&label).inc();
    node.metrics
        .exec_seconds
        .get_or_create(&label)
        .observe(started.elapsed().as_secs_f64());
    let mut resp = Response::new(encode_body(outcome?, encoding).boxed());
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

/// A response body fed chunk by chunk by the encoder task; at most one chunk waits.
pub struct StreamedBody {
    rx: mpsc::Receiver<Bytes>,
}

impl HttpBody for StreamedBody {
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
            tracing::debug!("exec body cut short: {e}");
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
            .map_err(|_| Error::ClientGone("the client stopped reading the exec body"))
    };
    let mut head = "{".to_string();
    if let Some(cut) = &finished.cut {
        let flag = match cut {
            Error::Timeout { .. } => "timed_out",
            _ => "truncated",
        };
        let message = serde_json::to_string(&cut.to_string()).expect("a string serializes");
        head.push_str(&format!("\"error\":{message},\"{flag}\":true,"));
    }
    match finished.exit_code {
        Some(code) => head.push_str(&format!("\"exit_code\":{code}")),
        None => head.push_str("\"exit_code\":null"),
    }
    if let Some(signal) = finished.signal {
        head.push_str(&format!(",\"signal\":{signal}"));
    }
    send(head.into_bytes()).await?;
    for (name, captured) in [
        ("stdout", &mut finished.stdout),
        ("stderr", &mut finished.stderr),
    ] {
        let b64 = encoding == api::Encoding::Base64 || !captured.is_utf8();
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::exec::capture::{CHUNK_OVERHEAD, GATHER};
    use crate::exec::{Budget, Captured};
    use crate::metrics::Metrics;

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
        // A budget of one small-chunk buffer: the first chunk stays in memory, the rest
        // spills.
        let small = GATHER as u64 + CHUNK_OVERHEAD;
        let b = Arc::new(Budget::new(small, Arc::new(Metrics::new())));
        let big: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let out = captured(&b, dir.path(), &[b"0123456789", &big, b"\x01\x02"]).await;
        let err = captured(&b, dir.path(), &[b"warn\n\"q\""]).await;
        assert_eq!(b.used(), small, "second stream could not fit");
        let finished = Finished {
            exit_code: Some(3),
            signal: None,
            stdout: out,
            stderr: err,
            cut: None,
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
        assert_eq!(b.used(), 0, "budget returned");
    }

    #[tokio::test]
    async fn base64_encoding_is_forced() {
        let dir = tempfile::tempdir().unwrap();
        let b = Arc::new(Budget::new(1 << 20, Arc::new(Metrics::new())));
        for len in [0usize, 1, 2, 3, 8190, 8191, 20_000] {
            let data: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let finished = Finished {
                exit_code: None,
                signal: Some(9),
                stdout: captured(&b, dir.path(), &[&data]).await,
                stderr: captured(&b, dir.path(), &[]).await,
                cut: None,
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

    #[tokio::test]
    async fn a_cut_answer_carries_its_flag_error_and_output() {
        let dir = tempfile::tempdir().unwrap();
        let b = Arc::new(Budget::new(1 << 20, Arc::new(Metrics::new())));
        for (cut, flag) in [
            (Error::Timeout { seconds: 1.5 }, "timed_out"),
            (Error::OutputTooLarge { limit: 5 }, "truncated"),
        ] {
            let message = cut.to_string();
            let finished = Finished {
                exit_code: None,
                signal: Some(9),
                stdout: captured(&b, dir.path(), &[b"tick \"1\"\n"]).await,
                stderr: captured(&b, dir.path(), &[b"\xff"]).await,
                cut: Some(cut),
            };
            let body = body_bytes(encode_body(finished, api::Encoding::Utf8)).await;
            let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(value[flag], true, "{value}");
            assert_eq!(value["error"], message.as_str());
            let resp: api::ExecResponse = serde_json::from_slice(&body).unwrap();
            assert_eq!((resp.exit_code, resp.signal), (None, Some(9)));
            assert_eq!(resp.stdout.as_deref(), Some("tick \"1\"\n"));
            assert_eq!(resp.stderr_b64.as_deref(), Some("/w=="));
        }
    }
}
