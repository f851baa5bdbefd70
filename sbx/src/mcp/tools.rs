//! The MCP tools and the session's sandboxes: each tool's schema (what `tools/list`
//! shows) and its call through the SDK. Files are read, written and listed through the
//! SDK's [`Files`](sandbox_sdk::Files) (the file routes, as the template's user), not by
//! commands in the sandbox: no shell quoting, no dependence on the image's `cat`/`ls`,
//! and a missing file is a typed error rather than a command's stderr.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use sandbox_sdk::{ClaimOptions, Client, Command, Error, Event, ExitStatus, FileKind, Sandbox};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::AsyncWrite;

/// Output kept per stream of `run_command`, and of a file `read_file` returns: what an
/// assistant's context can take; the rest is counted and marked.
const MAX_TEXT: usize = 64 * 1024;
/// `run_command`'s timeout when none is given, and the longest granted.
const DEFAULT_TIMEOUT: f64 = 60.0;
const MAX_TIMEOUT: f64 = 3600.0;
/// How long releasing the session's sandboxes may take at its end.
const RELEASE_BOUND: Duration = Duration::from_secs(30);

/// Tool errors are text for the assistant; `Err` of the outer result is a malformed call.
pub type Outcome = Result<Result<String, String>, String>;

/// The tools' schemas, as `tools/list` answers them.
pub fn list() -> Value {
    let id = json!({"type": "string", "description": "The sandbox_id create_sandbox returned."});
    json!([
        {
            "name": "create_sandbox",
            "description": "Create a fresh, isolated Linux sandbox. Returns its sandbox_id. It is released when this session ends.",
            "inputSchema": {"type": "object", "properties": {
                "template": {"type": "string", "description": "Template name, e.g. \"default\" (Debian with python3, node, git); the node's default when absent."},
                "ttl_seconds": {"type": "integer", "minimum": 1, "description": "Lifetime in seconds; the node's default when absent."}
            }, "additionalProperties": false}
        },
        {
            "name": "run_command",
            "description": "Run a command in a sandbox and wait for it. Give argv (a program and its arguments) or command (a shell line run with sh -c). Returns exit code, stdout and stderr (each cut at 64 KiB, with a marker).",
            "inputSchema": {"type": "object", "properties": {
                "sandbox_id": id,
                "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "command": {"type": "string", "description": "A shell line, run with sh -c."},
                "cwd": {"type": "string", "description": "Working directory; the template's when absent."},
                "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "description": "Kill the command after this long (default 60, at most 3600)."}
            }, "required": ["sandbox_id"], "additionalProperties": false}
        },
        {
            "name": "read_file",
            "description": "Read a text file from a sandbox (cut at 64 KiB, with a marker).",
            "inputSchema": {"type": "object", "properties": {
                "sandbox_id": id, "path": {"type": "string"}
            }, "required": ["sandbox_id", "path"], "additionalProperties": false}
        },
        {
            "name": "write_file",
            "description": "Write a text file in a sandbox, creating parent directories; replaces the file.",
            "inputSchema": {"type": "object", "properties": {
                "sandbox_id": id, "path": {"type": "string"}, "content": {"type": "string"}
            }, "required": ["sandbox_id", "path", "content"], "additionalProperties": false}
        },
        {
            "name": "list_directory",
            "description": "List a directory in a sandbox: a line per entry with type, mode, size, mtime (Unix seconds), name (-> target for a link).",
            "inputSchema": {"type": "object", "properties": {
                "sandbox_id": id, "path": {"type": "string"}
            }, "required": ["sandbox_id", "path"], "additionalProperties": false}
        },
        {
            "name": "release_sandbox",
            "description": "Destroy a sandbox and everything in it.",
            "inputSchema": {"type": "object", "properties": {"sandbox_id": id},
                "required": ["sandbox_id"], "additionalProperties": false}
        }
    ])
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Create {
    template: Option<String>,
    ttl_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Run {
    sandbox_id: String,
    argv: Option<Vec<String>>,
    command: Option<String>,
    cwd: Option<String>,
    timeout_seconds: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathArgs {
    sandbox_id: String,
    path: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Write {
    sandbox_id: String,
    path: String,
    content: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Release {
    sandbox_id: String,
}

/// The node client and the sandboxes this session created (released at its end).
pub struct Session {
    client: Client,
    created: HashMap<String, Sandbox>,
}

impl Session {
    pub fn new(client: Client) -> Session {
        Session {
            client,
            created: HashMap::new(),
        }
    }

    /// Calls tool `name` with `args`.
    pub async fn call(&mut self, name: &str, args: Value) -> Outcome {
        match name {
            "create_sandbox" => {
                let a: Create = parse(args)?;
                let mut opts = ClaimOptions::new();
                if let Some(t) = a.template {
                    opts = opts.template(t);
                }
                if let Some(ttl) = a.ttl_seconds {
                    opts = opts.ttl(Duration::from_secs(ttl));
                }
                Ok(self.create(opts).await)
            }
            "run_command" => {
                let a: Run = parse(args)?;
                let cmd = run_command(&a)?;
                Ok(run(&self.sandbox(&a.sandbox_id), cmd)
                    .await
                    .map(|r| r.to_string()))
            }
            "read_file" => {
                let a: PathArgs = parse(args)?;
                Ok(read(&self.sandbox(&a.sandbox_id), &a.path).await)
            }
            "list_directory" => {
                let a: PathArgs = parse(args)?;
                Ok(list_dir(&self.sandbox(&a.sandbox_id), &a.path).await)
            }
            "write_file" => {
                let a: Write = parse(args)?;
                Ok(write(&self.sandbox(&a.sandbox_id), &a.path, a.content).await)
            }
            "release_sandbox" => {
                let a: Release = parse(args)?;
                let sandbox = self.sandbox(&a.sandbox_id);
                Ok(match sandbox.release().await {
                    Ok(()) => {
                        self.created.remove(&a.sandbox_id);
                        Ok(format!("released {}", a.sandbox_id))
                    }
                    Err(e) => Err(e.to_string()),
                })
            }
            other => Err(format!("unknown tool {other:?}")),
        }
    }

    async fn create(&mut self, opts: ClaimOptions) -> Result<String, String> {
        let sandbox = self.client.claim(opts).await.map_err(|e| e.to_string())?;
        let answer = json!({"sandbox_id": sandbox.id(), "deadline_unix": sandbox.deadline_unix()});
        self.created.insert(sandbox.id().to_string(), sandbox);
        Ok(answer.to_string())
    }

    /// The session's own handle (with the sandbox's token), else one with the client's.
    fn sandbox(&self, id: &str) -> Sandbox {
        self.created
            .get(id)
            .cloned()
            .unwrap_or_else(|| self.client.sandbox(id))
    }

    /// Releases every sandbox the session created, each bounded; failures go to stderr.
    pub async fn release_all(&mut self) {
        for (id, sandbox) in self.created.drain() {
            match tokio::time::timeout(RELEASE_BOUND, sandbox.release()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("sbx: mcp: releasing {id}: {e}"),
                Err(_) => eprintln!("sbx: mcp: releasing {id}: no answer in {RELEASE_BOUND:?}"),
            }
        }
    }
}

fn parse<T: DeserializeOwned>(args: Value) -> Result<T, String> {
    serde_json::from_value(args).map_err(|e| format!("bad arguments: {e}"))
}

/// The command `run_command` asks for: exactly one of argv and command.
fn run_command(a: &Run) -> Result<Command, String> {
    let mut cmd = match (&a.argv, &a.command) {
        (Some(argv), None) if !argv.is_empty() => Command::from_argv(argv),
        (None, Some(line)) => Command::new("sh").args(["-c", line]),
        _ => return Err("give exactly one of argv (non-empty) and command".into()),
    };
    if let Some(cwd) = &a.cwd {
        cmd = cmd.cwd(cwd);
    }
    let timeout = a.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT);
    if !(timeout > 0.0 && timeout <= MAX_TIMEOUT) {
        return Err(format!("timeout_seconds must be in (0, {MAX_TIMEOUT}]"));
    }
    Ok(cmd.timeout(Duration::from_secs_f64(timeout)))
}

/// Up to [`MAX_TEXT`] bytes of a stream, and how many more there were.
#[derive(Default)]
struct Capped {
    kept: Vec<u8>,
    dropped: u64,
}

impl Capped {
    fn push(&mut self, data: &[u8]) {
        let room = MAX_TEXT.saturating_sub(self.kept.len());
        let take = room.min(data.len());
        self.kept.extend_from_slice(&data[..take]);
        self.dropped += (data.len() - take) as u64;
    }

    fn text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.kept).into_owned();
        if self.dropped > 0 {
            text.push_str(&format!("\n[... truncated: {} more bytes]", self.dropped));
        }
        text
    }
}

/// What a command did, as `run_command` reports it.
struct Ran {
    exit: Option<ExitStatus>,
    timed_out: bool,
    stdout: Capped,
    stderr: Capped,
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (code, signal) = match self.exit {
            Some(ExitStatus::Code(c)) => (Some(c), None),
            Some(ExitStatus::Signal(s)) => (None, Some(s)),
            None => (None, None),
        };
        let v = json!({
            "exit_code": code, "signal": signal, "timed_out": self.timed_out,
            "stdout": self.stdout.text(), "stderr": self.stderr.text(),
        });
        write!(f, "{v}")
    }
}

/// Runs `cmd` streamed (no server-side output cap), keeping the first [`MAX_TEXT`] bytes
/// of each stream; a timeout is reported, not an error.
async fn run(sandbox: &Sandbox, cmd: Command) -> Result<Ran, String> {
    let mut process = sandbox.spawn(&cmd).await.map_err(|e| e.to_string())?;
    let mut ran = Ran {
        exit: None,
        timed_out: false,
        stdout: Capped::default(),
        stderr: Capped::default(),
    };
    loop {
        match process.next_event().await {
            Ok(Some(Event::Stdout(b))) => ran.stdout.push(&b),
            Ok(Some(Event::Stderr(b))) => ran.stderr.push(&b),
            Ok(Some(Event::Exit(status))) => {
                ran.exit = Some(status);
                return Ok(ran);
            }
            Ok(None) => return Ok(ran),
            Err(Error::Timeout { .. }) => {
                ran.timed_out = true;
                return Ok(ran);
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// [`Capped`] as the sink of a download: it takes every byte (counting what it drops),
/// so a big file costs [`MAX_TEXT`] of memory and the marker says exactly how much more
/// there was.
impl AsyncWrite for Capped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A file tool's error as text for the assistant; `not found` alone would not say which.
fn file_error(path: &str, e: Error) -> String {
    match e {
        Error::NotFound { .. } => format!("{path}: No such file or directory (or no such sandbox)"),
        e => format!("{path}: {e}"),
    }
}

/// The file as text, its first [`MAX_TEXT`] bytes then the truncation marker.
async fn read(sandbox: &Sandbox, path: &str) -> Result<String, String> {
    let mut text = Capped::default();
    sandbox
        .files()
        .read_to(path, &mut text)
        .await
        .map_err(|e| file_error(path, e))?;
    Ok(text.text())
}

/// A directory's entries (or one file's), a line each as `sbx ls ID:PATH` prints them.
async fn list_dir(sandbox: &Sandbox, path: &str) -> Result<String, String> {
    let files = sandbox.files();
    let entry = files.stat(path).await.map_err(|e| file_error(path, e))?;
    let entries = if entry.kind == FileKind::Dir {
        files.list(path).await.map_err(|e| file_error(path, e))?
    } else {
        vec![entry]
    };
    Ok(entries
        .iter()
        .map(|e| crate::files::line(e) + "\n")
        .collect())
}

/// Writes `content` to `path`, parents created, replacing the file whole.
async fn write(sandbox: &Sandbox, path: &str, content: String) -> Result<String, String> {
    let len = content.len();
    sandbox
        .files()
        .write(path, content)
        .await
        .map_err(|e| file_error(path, e))?;
    Ok(format!("wrote {len} bytes to {path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_cap_is_counted_and_marked() {
        let mut c = Capped::default();
        c.push(&vec![b'a'; MAX_TEXT - 1]);
        c.push(b"bcd");
        assert_eq!(c.kept.len(), MAX_TEXT);
        assert!(c.text().ends_with("ab\n[... truncated: 2 more bytes]"));
    }

    #[test]
    fn run_command_takes_exactly_one_of_argv_and_command() {
        let run = |v: Value| run_command(&serde_json::from_value::<Run>(v).unwrap());
        assert!(run(json!({"sandbox_id": "x", "argv": ["true"]})).is_ok());
        assert!(run(json!({"sandbox_id": "x", "command": "true"})).is_ok());
        assert!(run(json!({"sandbox_id": "x"})).is_err());
        assert!(run(json!({"sandbox_id": "x", "argv": []})).is_err());
        assert!(run(json!({"sandbox_id": "x", "argv": ["a"], "command": "b"})).is_err());
        assert!(run(json!({"sandbox_id": "x", "command": "b", "timeout_seconds": 0})).is_err());
        assert!(run(json!({"sandbox_id": "x", "command": "b", "timeout_seconds": 1e9})).is_err());
    }
}
