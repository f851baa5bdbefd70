//! The MCP tools and the session's sandboxes: each tool's schema (what `tools/list`
//! shows) and its call through the SDK. Files are read, written and listed by commands
//! in the sandbox (`cat`, `ls`), streamed over the relay, so the tools need nothing the
//! sandbox's user could not do itself.

use std::collections::HashMap;
use std::time::Duration;

use sandbox_sdk::{ClaimOptions, Client, Command, Error, Event, ExitStatus, Sandbox};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

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
            "description": "List a directory in a sandbox (ls -la).",
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
                let cmd = Command::new("cat").args(["--", &a.path]);
                Ok(checked(run(&self.sandbox(&a.sandbox_id), cmd).await))
            }
            "list_directory" => {
                let a: PathArgs = parse(args)?;
                let cmd = Command::new("ls").args(["-la", "--", &a.path]);
                Ok(checked(run(&self.sandbox(&a.sandbox_id), cmd).await))
            }
            "write_file" => {
                let a: Write = parse(args)?;
                Ok(write(&self.sandbox(&a.sandbox_id), &a.path, a.content.as_bytes()).await)
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
            Err(Error::Timeout) => {
                ran.timed_out = true;
                return Ok(ran);
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// A helper command's stdout when it succeeded, else its stderr as the tool's error.
fn checked(ran: Result<Ran, String>) -> Result<String, String> {
    let ran = ran?;
    match ran.exit {
        Some(ExitStatus::Code(0)) => Ok(ran.stdout.text()),
        _ => Err(ran.stderr.text()),
    }
}

/// Writes `content` to `path` through `cat`'s stdin, parents created first.
async fn write(sandbox: &Sandbox, path: &str, content: &[u8]) -> Result<String, String> {
    let script = r#"mkdir -p -- "$(dirname -- "$1")" && cat > "$1""#;
    let cmd = Command::new("sh")
        .args(["-c", script, "sh", path])
        .stdin(true);
    let mut process = sandbox.spawn(&cmd).await.map_err(|e| e.to_string())?;
    let mut stdin = process.stdin().expect("spawned with stdin");
    stdin.send(content).await.map_err(|e| e.to_string())?;
    stdin.close().await.map_err(|e| e.to_string())?;
    let out = process.output().await.map_err(|e| e.to_string())?;
    match out.exit {
        ExitStatus::Code(0) => Ok(format!("wrote {} bytes to {path}", content.len())),
        _ => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
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
