//! `sbx mcp` driven by a scripted JSON-RPC client over its stdio, against a real sandboxd
//! with the `default` template: initialize, list tools, create a sandbox, write a Python
//! file, run `python3` on it, read and list what it wrote, truncated output, a timeout,
//! hostile and malformed calls; then sessions that end (release, stdin EOF, SIGTERM)
//! leave no sandbox behind.

use std::process::Stdio;

use sandbox_sdk::Client;
use serde_json::{json, Value};
use testkit::images::template_image;
use testkit::{bounded, DaemonProcess, Setup, ROOT};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// One `sbx mcp` and its pipes.
struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl Mcp {
    fn start(d: &DaemonProcess) -> Mcp {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sbx"))
            .arg("mcp")
            .env("SANDBOXD_URL", d.url())
            .env("SANDBOXD_TOKEN", ROOT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting sbx mcp");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Mcp {
            child,
            stdin,
            stdout,
            next_id: 0,
        }
    }

    async fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    async fn read(&mut self) -> Value {
        let line = self
            .stdout
            .next_line()
            .await
            .unwrap()
            .expect("an answer line");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// A request and its answer (checked to carry the same id).
    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_line(&msg.to_string()).await;
        let answer = self.read().await;
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }

    /// `tools/call`: the text and whether the tool reported an error.
    async fn tool(&mut self, name: &str, arguments: Value) -> (String, bool) {
        let answer = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        let result = &answer["result"];
        assert_eq!(result["content"][0]["type"], "text", "{answer}");
        let text = result["content"][0]["text"].as_str().unwrap().to_string();
        (text, result["isError"].as_bool().unwrap())
    }

    async fn ok(&mut self, name: &str, arguments: Value) -> String {
        let (text, is_error) = self.tool(name, arguments).await;
        assert!(!is_error, "{name}: {text}");
        text
    }

    async fn initialize(&mut self) {
        let init = self
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}),
            )
            .await;
        assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
        assert!(
            init["result"]["capabilities"]["tools"].is_object(),
            "{init}"
        );
        self.send_line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
    }

    async fn create(&mut self) -> String {
        let text = self
            .ok(
                "create_sandbox",
                json!({"template": "default", "ttl_seconds": 300}),
            )
            .await;
        let v: Value = serde_json::from_str(&text).unwrap();
        v["sandbox_id"].as_str().unwrap().to_string()
    }

    /// Closes stdin and waits for sbx to exit; its exit code.
    async fn finish(mut self) -> Option<i32> {
        drop(self.stdin.take());
        self.child.wait().await.unwrap().code()
    }
}

fn setup() -> Setup {
    Setup {
        image: Some(template_image("default")),
        warmup: Some(r#"["python3", "-c", "print(1)"]"#.into()),
        ..Setup::sdk()
    }
}

async fn sandboxes(root: &Client) -> Vec<String> {
    root.list()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_assistant_session_runs_python_and_leaves_no_sandbox() {
    let d = testkit::sdk::start(setup()).await;
    let root = d.root();
    bounded(async {
        let mut mcp = Mcp::start(&d);
        mcp.initialize().await;
        let tools = mcp.request("tools/list", json!({})).await;
        let mut names: Vec<&str> = tools["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["create_sandbox", "list_directory", "read_file", "release_sandbox", "run_command", "write_file"]
        );

        let id = mcp.create().await;
        let script = "import pathlib\nprint(6 * 7)\npathlib.Path('/tmp/work/out.txt').write_text('written by python')\n";
        mcp.ok("write_file", json!({"sandbox_id": id, "path": "/tmp/work/hello.py", "content": script}))
            .await;
        let ran = mcp
            .ok("run_command", json!({"sandbox_id": id, "argv": ["python3", "/tmp/work/hello.py"]}))
            .await;
        let ran: Value = serde_json::from_str(&ran).unwrap();
        assert_eq!((ran["exit_code"].as_i64(), ran["stdout"].as_str()), (Some(0), Some("42\n")), "{ran}");
        let text = mcp.ok("read_file", json!({"sandbox_id": id, "path": "/tmp/work/out.txt"})).await;
        assert_eq!(text, "written by python");
        let listing = mcp.ok("list_directory", json!({"sandbox_id": id, "path": "/tmp/work"})).await;
        assert!(listing.contains("hello.py") && listing.contains("out.txt"), "{listing}");

        // A shell line: exit code and stderr; output past 64 KiB cut with a marker.
        let ran = mcp
            .ok("run_command", json!({"sandbox_id": id, "command": "echo oops >&2; head -c 100000 /dev/zero | tr '\\0' x; exit 3"}))
            .await;
        let ran: Value = serde_json::from_str(&ran).unwrap();
        assert_eq!(ran["exit_code"], 3);
        assert_eq!(ran["stderr"], "oops\n");
        let out = ran["stdout"].as_str().unwrap();
        assert!(out.ends_with("\n[... truncated: 34464 more bytes]"), "{}", &out[out.len() - 60..]);
        // A file past 64 KiB: read_file keeps its start and counts the rest exactly.
        mcp.ok("run_command", json!({"sandbox_id": id, "command": "head -c 70000 /dev/zero | tr '\\0' y > /tmp/work/big.txt"}))
            .await;
        let big = mcp.ok("read_file", json!({"sandbox_id": id, "path": "/tmp/work/big.txt"})).await;
        assert!(big.starts_with("yyyy") && big.ends_with("y\n[... truncated: 4464 more bytes]"), "{}", &big[big.len() - 60..]);
        // A command past its timeout is reported as such, not as a failed call.
        let ran = mcp
            .ok("run_command", json!({"sandbox_id": id, "argv": ["sleep", "60"], "timeout_seconds": 0.5}))
            .await;
        assert_eq!(serde_json::from_str::<Value>(&ran).unwrap()["timed_out"], true, "{ran}");

        // Hostile and malformed calls: typed answers, and the session goes on.
        let (text, is_error) = mcp.tool("read_file", json!({"sandbox_id": id, "path": "/nope"})).await;
        assert!(is_error && text.contains("No such file"), "{text}");
        let (_, is_error) = mcp.tool("run_command", json!({"sandbox_id": "sb-nope", "argv": ["true"]})).await;
        assert!(is_error);
        let bad = mcp.request("tools/call", json!({"name": "format_disk", "arguments": {}})).await;
        assert_eq!(bad["error"]["code"], -32602, "{bad}");
        let bad = mcp.request("tools/call", json!({"name": "run_command", "arguments": {"sandbox_id": id, "argv": ["a"], "command": "b"}})).await;
        assert_eq!(bad["error"]["code"], -32602, "{bad}");
        let bad = mcp.request("resources/list", json!({})).await;
        assert_eq!(bad["error"]["code"], -32601, "{bad}");
        mcp.send_line("{not json").await;
        assert_eq!(mcp.read().await["error"]["code"], -32700);
        assert_eq!(mcp.request("ping", json!({})).await["result"], json!({}));

        mcp.ok("release_sandbox", json!({"sandbox_id": id})).await;
        assert!(!sandboxes(&root).await.contains(&id));
        assert_eq!(mcp.finish().await, Some(0));

        // A session that ends by stdin EOF, and one by SIGTERM, with a sandbox each.
        let mut mcp = Mcp::start(&d);
        mcp.initialize().await;
        let id = mcp.create().await;
        assert!(sandboxes(&root).await.contains(&id));
        assert_eq!(mcp.finish().await, Some(0));
        assert_eq!(sandboxes(&root).await, Vec::<String>::new());

        let mut mcp = Mcp::start(&d);
        mcp.initialize().await;
        let id = mcp.create().await;
        assert!(sandboxes(&root).await.contains(&id));
        let pid = mcp.child.id().unwrap() as i32;
        // SAFETY: a plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        assert_eq!(mcp.child.wait().await.unwrap().code(), Some(0));
        assert_eq!(sandboxes(&root).await, Vec::<String>::new());
    })
    .await;
}
