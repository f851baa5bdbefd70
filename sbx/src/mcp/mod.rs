//! `sbx mcp`: a Model Context Protocol server over stdio (newline-delimited JSON-RPC 2.0)
//! whose tools ([`tools`]) create sandboxes, run commands, read, write and list files,
//! and release sandboxes. This module owns the protocol loop and the session: every
//! sandbox created in it is released when it ends (stdin EOF, SIGINT, SIGTERM, SIGHUP).
//!
//! Hand-written rather than on `rmcp`: the server needs four methods of one transport
//! (`initialize`, `ping`, `tools/list`, `tools/call`), and rmcp would bring a schema
//! generator and proc macros into every build of the CLI for that.

mod tools;

use futures::StreamExt;
use sandbox_sdk::Client;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use self::tools::Session;

/// Longest request line: a `write_file` carries the file's text inline.
const MAX_LINE: usize = 16 * 1024 * 1024;
/// Protocol revisions this server speaks; the newest is offered to a client asking for
/// another.
const VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];

// JSON-RPC 2.0 error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// Serves stdin/stdout until EOF or a signal, then releases the session's sandboxes.
/// Returns sbx's exit code.
pub async fn mcp_cmd(client: Client) -> u8 {
    let mut session = Session::new(client);
    let code = match serve(&mut session).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sbx: mcp: {e}");
            1
        }
    };
    session.release_all().await;
    code
}

async fn serve(session: &mut Session) -> std::io::Result<()> {
    let mut lines = FramedRead::new(
        tokio::io::stdin(),
        LinesCodec::new_with_max_length(MAX_LINE),
    );
    let mut stdout = tokio::io::stdout();
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        let line = tokio::select! {
            line = lines.next() => line,
            _ = int.recv() => return Ok(()),
            _ = term.recv() => return Ok(()),
            _ = hup.recv() => return Ok(()),
        };
        let answer = match line {
            None => return Ok(()),
            Some(Err(LinesCodecError::Io(e))) => return Err(e),
            Some(Err(LinesCodecError::MaxLineLengthExceeded)) => Some(error(
                Value::Null,
                PARSE_ERROR,
                &format!("request line over {MAX_LINE} bytes"),
            )),
            Some(Ok(line)) if line.trim().is_empty() => None,
            Some(Ok(line)) => match serde_json::from_str::<Value>(&line) {
                Ok(msg) => handle(session, msg).await,
                Err(e) => Some(error(Value::Null, PARSE_ERROR, &format!("not JSON: {e}"))),
            },
        };
        if let Some(answer) = answer {
            let mut bytes = serde_json::to_vec(&answer).expect("JSON values serialize");
            bytes.push(b'\n');
            stdout.write_all(&bytes).await?;
            stdout.flush().await?;
        }
    }
}

/// One message's answer; `None` for a notification (or a response sent to us).
async fn handle(session: &mut Session, msg: Value) -> Option<Value> {
    let id = msg.get("id").cloned();
    let Some(method) = msg.get("method").and_then(Value::as_str) else {
        // A response to a request we never make, or garbage with an id.
        return id.map(|id| error(id, INVALID_REQUEST, "not a JSON-RPC request"));
    };
    let id = id?; // notifications (`notifications/initialized`, cancellations) need no answer
    if msg.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(error(id, INVALID_REQUEST, "jsonrpc must be \"2.0\""));
    }
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let result = match method {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({ "tools": tools::list() })),
        "tools/call" => call(session, &params).await,
        other => Err((METHOD_NOT_FOUND, format!("unknown method {other:?}"))),
    };
    Some(match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => error(id, code, &message),
    })
}

fn initialize(params: &Value) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = VERSIONS
        .iter()
        .find(|v| Some(**v) == asked)
        .unwrap_or(&VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "sbx", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Create a sandbox with create_sandbox, use its sandbox_id with the other tools, and release it when done; sandboxes left are released when this session ends."
    })
}

/// `tools/call`: an unknown tool or malformed arguments is a JSON-RPC error; a tool that
/// ran and failed (unknown sandbox, missing file) is a result with `isError`.
async fn call(session: &mut Session, params: &Value) -> Result<Value, (i64, String)> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or((INVALID_PARAMS, "tools/call needs a tool name".to_string()))?;
    let args = params.get("arguments").cloned().unwrap_or(json!({}));
    let outcome = session
        .call(name, args)
        .await
        .map_err(|e| (INVALID_PARAMS, e))?;
    let (text, is_error) = match outcome {
        Ok(text) => (text, false),
        Err(text) => (text, true),
    };
    Ok(json!({"content": [{"type": "text", "text": text}], "isError": is_error}))
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}
