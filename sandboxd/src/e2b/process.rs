//! `process.Process` onto silkd: `Start` is an `Exec` with `detach` (so a command outlives
//! the stream that started it, as E2B's background commands do, and `Connect` is an
//! `Attach`); `SendInput`, `CloseStdin` and `Update` (terminal resize) attach for the one
//! message; `SendSignal` is `Kill`; `List` is `Ps`. Output events are sent as silkd's
//! frames arrive, with keepalives between them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use wire::{Request as Verb, Response as Answer};

use super::connect::{self, Stream};
use super::{record, E2b};
use crate::api::Body;
use crate::claims::Sandbox;
use crate::error::{Error, Result};
use crate::files::{self, unexpected};
use crate::guest::GuestConn;

/// Bound on handing input to a command (silkd takes it once the command's retained output
/// was replayed, which a command writing without pause can delay).
const DELIVER_WITHIN: Duration = Duration::from_secs(10);
/// Keepalive interval when the client names none (`Keepalive-Ping-Interval`, seconds).
const KEEPALIVE: Duration = Duration::from_secs(30);

#[derive(Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<PtyRequest>,
    stdin: Option<bool>,
    tag: Option<String>,
}

#[derive(Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize)]
struct PtyRequest {
    size: Option<PtySize>,
}

#[derive(Deserialize)]
struct PtySize {
    #[serde(default)]
    cols: u32,
    #[serde(default)]
    rows: u32,
}

#[derive(Deserialize)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

impl Selector {
    fn pid(&self) -> Result<u32> {
        match (self.pid, &self.tag) {
            (Some(pid), _) => Ok(pid),
            (None, Some(_)) => Err(Error::Unsupported("selecting a process by tag".into())),
            (None, None) => Err(Error::BadRequest("process.pid is required".into())),
        }
    }
}

#[derive(Deserialize)]
struct Selected {
    process: Selector,
}

#[derive(Deserialize)]
struct SendInput {
    process: Selector,
    input: Input,
}

#[derive(Deserialize)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Deserialize)]
struct SendSignal {
    process: Selector,
    signal: String,
}

#[derive(Deserialize)]
struct Update {
    process: Selector,
    pty: Option<PtyRequest>,
}

/// Serves one `process.Process` method.
pub(super) async fn call(
    e2b: &E2b,
    sandbox: Arc<Sandbox>,
    method: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let stream = connect::is_stream(req.headers());
    let keepalive = req
        .headers()
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .filter(|s| (1..=3600).contains(s))
        .map_or(KEEPALIVE, Duration::from_secs);
    let answer = match method {
        "Start" => start(e2b, sandbox, req, keepalive).await,
        "Connect" => attach(e2b, sandbox, req, keepalive).await,
        "List" => list(e2b, &sandbox, req).await,
        "SendInput" => send_input(e2b, &sandbox, req).await,
        "CloseStdin" => close_stdin(e2b, &sandbox, req).await,
        "Update" => update(e2b, &sandbox, req).await,
        "SendSignal" => signal(e2b, &sandbox, req).await,
        "StreamInput" => Err(Error::Unsupported(
            "StreamInput (a client stream); use SendInput".into(),
        )),
        _ => Err(Error::NotFound),
    };
    answer.unwrap_or_else(|e| connect::error_response(&e, stream))
}

async fn start(
    e2b: &E2b,
    sandbox: Arc<Sandbox>,
    req: Request<Incoming>,
    keepalive: Duration,
) -> Result<Response<Body>> {
    let headers = req.headers().clone();
    let headers = &headers;
    let body: StartRequest = connect::read_stream_request(e2b, req).await?;
    if body.tag.is_some() {
        return Err(Error::Unsupported("process tags".into()));
    }
    let pty = match body.pty {
        Some(p) => {
            let size = p.size.unwrap_or(PtySize { cols: 80, rows: 24 });
            let pty = wire::Pty {
                rows: size.rows,
                cols: size.cols,
                term: None,
            };
            pty.check().map_err(Error::BadRequest)?;
            Some(pty)
        }
        None => None,
    };
    // Sandbox-wide env vars from the create, then the command's own.
    let mut env = record::get(&e2b.node.store, &sandbox.id)?
        .map(|r| r.env_vars)
        .unwrap_or_default();
    env.extend(body.process.envs);
    let is_pty = pty.is_some();
    let mut argv = vec![body.process.cmd];
    argv.extend(body.process.args);
    let verb = Verb::Exec {
        argv,
        cwd: body.process.cwd.filter(|c| !c.is_empty()),
        env: Some(env.into_iter().collect()),
        user: super::basic_user(headers)?,
        stdin: body.stdin.unwrap_or(false) || is_pty,
        timeout_ms: None,
        pty,
        detach: true,
    };
    let (resp, pid) = follow(&sandbox, verb, is_pty, keepalive).await?;
    if is_pty {
        let mut ptys = e2b.ptys.lock().expect("ptys lock");
        ptys.retain(|(id, _)| e2b.node.claims.get(id).is_some());
        ptys.insert((sandbox.id.clone(), pid));
    }
    Ok(resp)
}

async fn attach(
    e2b: &E2b,
    sandbox: Arc<Sandbox>,
    req: Request<Incoming>,
    keepalive: Duration,
) -> Result<Response<Body>> {
    let body: Selected = connect::read_stream_request(e2b, req).await?;
    let pid = body.process.pid()?;
    // Whether it runs under a terminal decides which field its output goes in.
    let is_pty = e2b
        .ptys
        .lock()
        .expect("ptys lock")
        .contains(&(sandbox.id.clone(), pid));
    Ok(follow(&sandbox, Verb::Attach { pid }, is_pty, keepalive)
        .await?
        .0)
}

/// Sends `verb` (an exec or attach), waits for `started` (or the error that replaces
/// it, answered as a stream that only ends), then streams events from a task.
async fn follow(
    sandbox: &Sandbox,
    verb: Verb,
    pty: bool,
    keepalive: Duration,
) -> Result<(Response<Body>, u32)> {
    let (mut conn, first) = files::open(sandbox, verb).await?;
    let Answer::Started { pid } = first else {
        return Err(unexpected(&first));
    };
    let (out, resp) = Stream::open();
    tokio::spawn(async move {
        if out.send(json!({"event": {"start": {"pid": pid}}})).await {
            let end = pump(&mut conn, &out, pty, keepalive).await;
            out.end(end.err().as_ref()).await;
        }
        // Dropping `conn` leaves a detached command running, as E2B does when a client
        // disconnects.
    });
    Ok((resp, pid))
}

/// Turns silkd's frames into events until `exit` (Ok) or a failure; returns early,
/// Ok, when the client leaves.
async fn pump(conn: &mut GuestConn, out: &Stream, pty: bool, keepalive: Duration) -> Result<()> {
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
    loop {
        let frame = tokio::select! {
            f = files::next(conn) => f?,
            _ = tick.tick() => {
                if !out.send(json!({"event": {"keepalive": {}}})).await { return Ok(()) }
                continue;
            }
            () = out.closed() => return Ok(()),
        };
        let event = match frame {
            Answer::Stdout { data } if pty => json!({"data": {"pty": b64(&data)}}),
            Answer::Stdout { data } => json!({"data": {"stdout": b64(&data)}}),
            Answer::Stderr { data } => json!({"data": {"stderr": b64(&data)}}),
            Answer::Exit { code, signal, .. } => {
                let status = match (code, signal) {
                    (Some(c), _) => format!("exit status {c}"),
                    (None, Some(9)) => "signal: killed".to_string(),
                    (None, Some(s)) => format!("signal: {s}"),
                    (None, None) => "exited".to_string(),
                };
                // Go's ExitCode(), which E2B's agent reports: -1 for a signal.
                let mut end = json!({"exitCode": code.unwrap_or(-1), "exited": code.is_some(), "status": status});
                if code.is_none() {
                    end["error"] = Value::from(status);
                }
                out.send(json!({"event": {"end": end}})).await;
                return Ok(());
            }
            other => return Err(unexpected(&other)),
        };
        if !out.send(json!({"event": event})).await {
            return Ok(());
        }
    }
}

async fn list(e2b: &E2b, sandbox: &Sandbox, req: Request<Incoming>) -> Result<Response<Body>> {
    let _: Value = connect::read_unary(e2b, req).await?;
    let procs = match files::open(sandbox, Verb::Ps).await?.1 {
        Answer::Procs { procs } => procs,
        other => return Err(unexpected(&other)),
    };
    let processes: Vec<Value> = procs
        .into_iter()
        .filter(|p| p.state == wire::ProcState::Running)
        .map(|p| {
            let (cmd, args) = p
                .argv
                .split_first()
                .map_or((String::new(), &[][..]), |(c, a)| (c.clone(), a));
            json!({"pid": p.pid, "config": {"cmd": cmd, "args": args, "envs": {}}})
        })
        .collect();
    Ok(connect::ok(json!({"processes": processes})))
}

/// Attaches to `pid`, sends `frames`, and leaves once silkd has taken them (the command
/// keeps running). Why the drain: silkd reads an attached client's frames only after it
/// has replayed the command's retained output to it, so leaving at once would let the
/// frames be dropped with the connection. Half-closing and reading to the end lets silkd
/// replay, take the frames, see the end of input and close.
async fn attach_and_send(sandbox: &Sandbox, pid: u32, frames: Vec<Verb>) -> Result<()> {
    let (mut conn, first) = files::open(sandbox, Verb::Attach { pid }).await?;
    if !matches!(first, Answer::Started { .. }) {
        return Err(unexpected(&first));
    }
    for f in frames {
        conn.send(f).await?;
    }
    conn.close().await?;
    let drained = tokio::time::timeout(DELIVER_WITHIN, async {
        while let Some(frame) = conn.next().await {
            frame?;
        }
        Ok::<_, Error>(())
    });
    match drained.await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            seconds: DELIVER_WITHIN.as_secs_f64(),
        }),
    }
}

async fn send_input(
    e2b: &E2b,
    sandbox: &Sandbox,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let body: SendInput = connect::read_unary(e2b, req).await?;
    let pid = body.process.pid()?;
    let text = body
        .input
        .stdin
        .or(body.input.pty)
        .ok_or_else(|| Error::BadRequest("input.stdin or input.pty is required".into()))?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(text.as_bytes())
        .map_err(|e| Error::BadRequest(format!("input is not base64: {e}")))?;
    attach_and_send(sandbox, pid, vec![Verb::Stdin { data }]).await?;
    Ok(connect::ok(json!({})))
}

async fn close_stdin(
    e2b: &E2b,
    sandbox: &Sandbox,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let body: Selected = connect::read_unary(e2b, req).await?;
    attach_and_send(sandbox, body.process.pid()?, vec![Verb::StdinClose]).await?;
    Ok(connect::ok(json!({})))
}

async fn update(e2b: &E2b, sandbox: &Sandbox, req: Request<Incoming>) -> Result<Response<Body>> {
    let body: Update = connect::read_unary(e2b, req).await?;
    let pid = body.process.pid()?;
    let size = body
        .pty
        .and_then(|p| p.size)
        .ok_or_else(|| Error::BadRequest("pty.size is required".into()))?;
    wire::Pty::check_size(size.rows, size.cols).map_err(Error::BadRequest)?;
    let resize = Verb::Resize {
        rows: size.rows,
        cols: size.cols,
    };
    attach_and_send(sandbox, pid, vec![resize]).await?;
    Ok(connect::ok(json!({})))
}

async fn signal(e2b: &E2b, sandbox: &Sandbox, req: Request<Incoming>) -> Result<Response<Body>> {
    let body: SendSignal = connect::read_unary(e2b, req).await?;
    let pid = body.process.pid()?;
    let signal = match body.signal.as_str() {
        "SIGNAL_SIGKILL" | "9" => libc::SIGKILL,
        "SIGNAL_SIGTERM" | "15" => libc::SIGTERM,
        other => return Err(Error::BadRequest(format!("unknown signal {other:?}"))),
    };
    match files::open(
        sandbox,
        Verb::Kill {
            pid,
            signal: Some(signal),
        },
    )
    .await?
    .1
    {
        Answer::Done => Ok(connect::ok(json!({}))),
        other => Err(unexpected(&other)),
    }
}
