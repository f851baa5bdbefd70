//! Exec through a real silkd over a real Unix socket: output, exit codes, signals,
//! stdin, exact bytes, environment, spawn errors, timeouts, concurrency.

use sha2::{Digest, Sha256};
use testkit::procs::wait_group_gone;
use testkit::silkd::{exec_req, Silkd};
use wire::{ErrorKind, Request, Response};

#[tokio::test]
async fn echo_and_exit_codes() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let out = c.run(&["echo", "hello", "world"]).await;
    assert_eq!(out.stdout, b"hello world\n");
    assert_eq!(out.code, Some(0));
    assert!(!out.timed_out);
    // Several RPCs back to back on one connection.
    let out = c.run(&["sh", "-c", "echo err >&2; exit 7"]).await;
    assert_eq!(out.stderr, b"err\n");
    assert_eq!((out.code, out.signal), (Some(7), None));
    let info = c.rpc(Request::Info).await;
    assert!(matches!(info, Response::Info { proto: 1, .. }), "{info:?}");
}

#[tokio::test]
async fn exit_by_signal() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let out = c.run(&["sh", "-c", "kill -TERM $$"]).await;
    assert_eq!((out.code, out.signal), (None, Some(15)));
}

#[tokio::test]
async fn stdin_round_trip_with_eof() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    c.send(Request::Exec {
        detach: false,
        pty: None,
        argv: vec!["cat".into()],
        cwd: None,
        env: None,
        stdin: true,
        timeout_ms: None,
        user: None,
    })
    .await;
    let pid = c.started().await;
    let payload: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    for chunk in payload.chunks(70_000) {
        c.send(Request::Stdin {
            data: chunk.to_vec(),
        })
        .await;
    }
    c.send(Request::StdinClose).await;
    let out = c.collect(pid).await;
    assert_eq!(out.code, Some(0), "cat exits once stdin reaches EOF");
    assert_eq!(out.stdout, payload);
}

#[tokio::test]
async fn stdin_is_dev_null_by_default() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let out = c.run(&["cat"]).await;
    assert_eq!((out.code, out.stdout.len()), (Some(0), 0));
}

#[tokio::test]
async fn exact_binary_output() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let out = c
        .run(&[
            "sh",
            "-c",
            "head -c 4096 /dev/urandom | tee /dev/stderr | sha256sum",
        ])
        .await;
    assert_eq!(out.code, Some(0));
    assert_eq!(out.stderr.len(), 4096);
    let ours = hex::encode(Sha256::digest(&out.stderr));
    let theirs = String::from_utf8(out.stdout).unwrap();
    assert_eq!(theirs.split_whitespace().next().unwrap(), ours);
}

#[tokio::test]
async fn environment_is_cleared_and_cwd_applies() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let out = c
        .exec(Request::Exec {
            detach: false,
            pty: None,
            argv: vec!["sh".into(), "-c".into(), "env | sort; pwd".into()],
            cwd: Some("/usr".into()),
            env: Some(vec![("GREETING".into(), "hi there".into())]),
            stdin: false,
            timeout_ms: None,
            user: None,
        })
        .await;
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.pop(), Some("/usr"));
    // sh itself adds PWD (and sometimes SHLVL); nothing from silkd's own environment.
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l.split('=').next().unwrap())
        .filter(|n| !matches!(*n, "PWD" | "SHLVL" | "OLDPWD" | "_"))
        .collect();
    assert_eq!(
        names,
        ["GREETING", "HOME", "LANG", "LOGNAME", "PATH", "SHELL", "TERM", "USER"],
        "{text}"
    );
    assert!(text.contains("GREETING=hi there"));
}

#[tokio::test]
async fn spawn_errors_are_typed_and_name_the_path() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let dir = tempfile::tempdir().unwrap();
    let not_exec = dir.path().join("script");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    let file = not_exec.to_str().unwrap().to_string();
    let cases: Vec<(Request, &str)> = vec![
        (exec_req(&["no-such-command-xyz"]), "no-such-command-xyz"),
        (
            exec_req(&["/nonexistent/bin/tool"]),
            "/nonexistent/bin/tool",
        ),
        (exec_req(&[&file]), &file),
        (exec_req(&["/tmp"]), "/tmp"),
        (
            Request::Exec {
                detach: false,
                pty: None,
                argv: vec!["true".into()],
                cwd: Some("/no/such/dir".into()),
                env: None,
                stdin: false,
                timeout_ms: None,
                user: None,
            },
            "/no/such/dir",
        ),
        (
            Request::Exec {
                detach: false,
                pty: None,
                argv: vec!["true".into()],
                cwd: Some(file.clone()),
                env: None,
                stdin: false,
                timeout_ms: None,
                user: None,
            },
            "not a directory",
        ),
        (exec_req(&[]), "argv is empty"),
    ];
    for (req, needle) in cases {
        match c.rpc(req.clone()).await {
            Response::Error {
                kind: ErrorKind::BadRequest,
                message,
            } => assert!(
                message.contains(needle),
                "{message:?} should name {needle:?}"
            ),
            other => panic!("{req:?}: expected bad_request, got {other:?}"),
        }
    }
    // The connection is still good after RPC-level errors.
    assert_eq!(c.run(&["true"]).await.code, Some(0));
}

#[tokio::test]
async fn timeout_kills_the_group() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let out = c
        .exec(Request::Exec {
            detach: false,
            pty: None,
            argv: vec![
                "sh".into(),
                "-c".into(),
                "sleep 600 & sleep 600; wait".into(),
            ],
            cwd: None,
            env: None,
            stdin: false,
            timeout_ms: Some(300),
            user: None,
        })
        .await;
    assert!(out.timed_out);
    assert_eq!(out.signal, Some(9));
    wait_group_gone(out.pid, std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn hundred_concurrent_execs_on_hundred_connections() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut tasks = Vec::new();
    for i in 0..100 {
        let mut c = silkd.connect().await;
        tasks.push(tokio::spawn(async move {
            let out = c
                .run(&["sh", "-c", &format!("echo {i}; exit {}", i % 5)])
                .await;
            (i, out)
        }));
    }
    for t in tasks {
        let (i, out) = t.await.unwrap();
        assert_eq!(out.stdout, format!("{i}\n").into_bytes());
        assert_eq!(out.code, Some(i % 5));
    }
}

#[tokio::test]
async fn ps_lists_live_and_recent() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let done = c.run(&["true"]).await;
    let mut bg = silkd.connect().await;
    bg.send(exec_req(&["sleep", "600"])).await;
    let live = bg.started().await;
    let Response::Procs { procs } = c.rpc(Request::Ps).await else {
        panic!("expected Procs")
    };
    let find = |pid| procs.iter().find(|p| p.pid == pid).expect("listed");
    assert_eq!(find(done.pid).state, wire::ProcState::Exited);
    assert_eq!(find(done.pid).code, Some(0));
    assert_eq!(find(live).state, wire::ProcState::Running);
    assert_eq!(find(live).argv, ["sleep", "600"]);
    assert_eq!(
        c.rpc(Request::Kill {
            pid: live,
            signal: None
        })
        .await,
        Response::Done
    );
}
