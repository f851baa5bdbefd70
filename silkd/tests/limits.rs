//! silkd's own limits against a hostile peer: the process table cap (`--max-procs`),
//! strings the kernel would refuse (NUL bytes, `=` in env keys, one string over
//! `MAX_ARG_STRLEN`, argv + env over `ARG_MAX`, a cwd over `PATH_MAX`) answered
//! `bad_request` rather than `internal`, and frames built to cost memory refused before
//! they do.

use testkit::procs::{assert_gone, marker};
use testkit::silkd::{exec_req, Silkd};
use tokio::io::AsyncWriteExt;
use wire::{ErrorKind, Request, Response};

fn exec(argv: Vec<String>, env: Option<Vec<(String, String)>>, cwd: Option<String>) -> Request {
    Request::Exec {
        detach: false,
        pty: None,
        argv,
        cwd,
        env,
        stdin: false,
        timeout_ms: None,
        user: None,
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn the_process_table_is_capped() {
    let silkd = Silkd::start_with(env!("CARGO_BIN_EXE_silkd"), &["--max-procs", "3"]).await;
    let m = marker(1);
    // Short commands never fill it: exited entries are forgotten oldest first.
    let mut c = silkd.connect().await;
    for _ in 0..10 {
        assert_eq!(c.run(&["true"]).await.code, Some(0));
    }
    let Response::Procs { procs } = c.rpc(Request::Ps).await else {
        panic!("Ps")
    };
    assert_eq!(procs.len(), 3, "{procs:?}");
    // Three running commands fill it; a fourth is refused, and retryable.
    let mut runners = Vec::new();
    for _ in 0..3 {
        let mut r = silkd.connect().await;
        r.send(exec_req(&["sleep", &m])).await;
        let pid = r.started().await;
        runners.push((r, pid));
    }
    match c.rpc(exec_req(&["true"])).await {
        Response::Error {
            kind: ErrorKind::ResourceExhausted,
            message,
        } => assert!(message.contains("--max-procs 3"), "{message}"),
        other => panic!("expected resource_exhausted, got {other:?}"),
    }
    // The connection stays usable, and once one command ends there is room again.
    let (mut r, pid) = runners.pop().unwrap();
    assert_eq!(
        c.rpc(Request::Kill { pid, signal: None }).await,
        Response::Done
    );
    assert_eq!(r.collect(pid).await.signal, Some(9));
    assert_eq!(c.run(&["true"]).await.code, Some(0));
    drop(runners);
    assert_gone(&m).await;
}

#[tokio::test]
async fn strings_the_kernel_refuses_are_bad_requests() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let env = |k: &str, v: &str| Some(vec![(k.to_string(), v.to_string())]);
    // MAX_ARG_STRLEN is 128 KiB with the NUL; ARG_MAX is a quarter of the stack limit.
    let longest = "x".repeat(128 * 1024 - 1);
    let stack = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_STACK)
        .unwrap()
        .0;
    let over_total = vec!["y".repeat(100 * 1024); (stack / 4 / (100 * 1024) + 1) as usize];
    let cases: Vec<(Request, &str)> = vec![
        (
            exec(strings(&["echo", "a\0b"]), None, None),
            "argv[1] contains a NUL",
        ),
        (
            exec(strings(&["ec\0ho"]), None, None),
            "argv[0] contains a NUL",
        ),
        (exec(strings(&["true"]), env("K", "v\0"), None), "NUL"),
        (exec(strings(&["true"]), env("K\0", "v"), None), "NUL"),
        (exec(strings(&["true"]), env("A=B", "v"), None), "'='"),
        (exec(strings(&["true"]), env("", "v"), None), "non-empty"),
        (
            exec(strings(&["true"]), None, Some("/tmp\0/x".into())),
            "cwd contains a NUL",
        ),
        (
            exec(strings(&["true"]), None, Some("/".repeat(5000))),
            "cwd is 5000 bytes",
        ),
        (
            exec(vec!["echo".into(), format!("{longest}x")], None, None),
            "argv[1] is 131072 bytes",
        ),
        (
            exec(strings(&["true"]), env("BIG", &longest), None),
            "per string",
        ),
        (
            exec([vec!["true".to_string()], over_total].concat(), None, None),
            "ARG_MAX",
        ),
    ];
    for (req, needle) in cases {
        match c.rpc(req).await {
            Response::Error {
                kind: ErrorKind::BadRequest,
                message,
            } => {
                assert!(
                    message.contains(needle),
                    "{message:?} should say {needle:?}"
                );
                assert!(message.len() <= 4096, "{} bytes of message", message.len());
            }
            other => panic!("{needle}: expected bad_request, got {other:?}"),
        }
    }
    // Just under the per-string limit still runs, and the connection is still good.
    let out = c
        .exec(exec(
            vec![
                "sh".into(),
                "-c".into(),
                "echo ${#1}".into(),
                "sh".into(),
                longest[..longest.len() - 1].into(),
            ],
            None,
            None,
        ))
        .await;
    assert_eq!(out.code, Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (128 * 1024 - 2).to_string()
    );
}

/// An Exec whose env holds the most one-byte pairs an 8 MiB frame can carry: ~1.7 M
/// pairs, 262 MiB of heap once decoded (`cargo run -p wire --example hostile_frame_rss`).
fn env_flood() -> Vec<u8> {
    let pairs = ((wire::MAX_FRAME - 64) / 5) as u32;
    let mut b = vec![0x83, 0xa4];
    b.extend_from_slice(b"type");
    b.push(0xa4);
    b.extend_from_slice(b"exec");
    b.push(0xa4);
    b.extend_from_slice(b"argv");
    b.extend_from_slice(&[0x91, 0xa4]);
    b.extend_from_slice(b"true");
    b.push(0xa3);
    b.extend_from_slice(b"env");
    b.push(0xdd);
    b.extend_from_slice(&pairs.to_be_bytes());
    for _ in 0..pairs {
        b.extend_from_slice(&[0x92, 0xa1, b'k', 0xa1, b'v']);
    }
    let mut frame = (b.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&b);
    frame
}

#[tokio::test]
async fn a_frame_of_millions_of_tiny_values_costs_no_heap() {
    let mut silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let peak_before = silkd.peak_rss_kib();
    let frame = env_flood();
    // Four at once: each connection holds its 8 MiB frame, none decodes it.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut c = silkd.connect().await;
        let frame = frame.clone();
        tasks.push(tokio::spawn(async move {
            c.framed.get_mut().write_all(&frame).await.unwrap();
            c.recv().await
        }));
    }
    for t in tasks {
        match t.await.unwrap() {
            Response::Error {
                kind: ErrorKind::BadRequest,
                message,
            } => assert!(message.contains("65536 values"), "{message}"),
            other => panic!("expected bad_request, got {other:?}"),
        }
    }
    let grew_mib = (silkd.peak_rss_kib() - peak_before) / 1024;
    // The frames themselves (4 × 8 MiB) and nothing like 4 × 262 MiB of decoded env.
    assert!(grew_mib < 64, "silkd's peak RSS grew {grew_mib} MiB");
    assert!(silkd.is_running());
    let mut c = silkd.connect().await;
    assert_eq!(c.run(&["true"]).await.code, Some(0));
}
