//! Pseudo-terminal execs through a real silkd over a real Unix socket: a controlling
//! terminal, resizes, Ctrl-C, exit codes, one output stream, and hostile sizes and names.

use std::time::Duration;

use testkit::procs::wait_group_gone;
use testkit::pty::{pty_exec_req, pty_exec_with, pty_fds};
use testkit::silkd::Silkd;
use wire::{ErrorKind, Pty, Request, Response};

#[tokio::test]
async fn shell_on_a_terminal_resizes_and_passes_its_exit_code_back() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    c.send(pty_exec_req(&["sh"], 24, 80)).await;
    let pid = c.started().await;
    c.type_in(b"tty; echo TERM=$TERM; echo to-stderr >&2; echo done-$((0+1))\n")
        .await;
    let screen = c.read_until("done-1\r\n").await;
    // The marker is computed by the shell, so the terminal's echo of the typed line
    // (which holds `$((0+1))`, not `1`) cannot satisfy the wait.
    assert!(screen.contains("/dev/pts/"), "{screen:?}");
    assert!(screen.contains("TERM=xterm-256color\r\n"), "{screen:?}");
    assert!(
        screen.contains("to-stderr\r\n"),
        "stderr shares the one stream: {screen:?}"
    );
    c.type_in(b"stty size; echo done-$((0+2))\n").await;
    let screen = c.read_until("done-2\r\n").await;
    assert!(screen.contains("24 80\r\n"), "{screen:?}");
    c.send(Request::Resize {
        rows: 40,
        cols: 132,
    })
    .await;
    c.type_in(b"stty size; echo done-$((0+3))\n").await;
    let screen = c.read_until("done-3\r\n").await;
    assert!(screen.contains("40 132\r\n"), "resize seen: {screen:?}");
    c.type_in(b"exit 3\n").await;
    let out = c.collect(pid).await;
    assert_eq!((out.code, out.signal), (Some(3), None));
    assert!(out.stderr.is_empty());
    // The connection serves on, and silkd kept no terminal open.
    let out = c.run(&["true"]).await;
    assert_eq!(out.code, Some(0));
    assert_eq!(pty_fds(silkd.pid()), 0);
}

#[tokio::test]
async fn ctrl_c_interrupts_the_foreground_command() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    c.send(pty_exec_req(&["sleep", "600"], 24, 80)).await;
    let pid = c.started().await;
    // The child is already the terminal's foreground group when `Started` comes
    // (spawn returns after exec), so the line discipline turns 0x03 into its SIGINT.
    c.type_in(&[0x03]).await;
    let out = c.collect(pid).await;
    assert_eq!((out.code, out.signal), (None, Some(2)));
    wait_group_gone(pid, Duration::from_secs(10)).await;
}

#[tokio::test]
async fn hostile_sizes_and_terms_are_bad_requests() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let pty = |rows, cols, term: Option<&str>| Pty {
        rows,
        cols,
        term: term.map(str::to_string),
    };
    let long = "x".repeat(65);
    for bad in [
        pty(0, 80, None),
        pty(24, 0, None),
        pty(4097, 80, None),
        pty(24, u32::MAX, None),
        pty(24, 80, Some("")),
        pty(24, 80, Some("../../tmp/evil")),
        pty(24, 80, Some("xterm\nX=1")),
        pty(24, 80, Some(&long)),
    ] {
        let answer = c.rpc(pty_exec_with(&["true"], bad.clone())).await;
        match answer {
            Response::Error {
                kind: ErrorKind::BadRequest,
                ..
            } => {}
            other => panic!("{bad:?}: expected bad_request, got {other:?}"),
        }
    }
    // Each was refused before anything was opened; the connection still serves.
    assert_eq!(c.run(&["true"]).await.code, Some(0));
    assert_eq!(pty_fds(silkd.pid()), 0);

    // A resize outside a pty exec is a protocol fault: answered, then the connection closes.
    let mut c = silkd.connect().await;
    let answer = c.rpc(Request::Resize { rows: 1, cols: 1 }).await;
    assert!(
        matches!(
            answer,
            Response::Error {
                kind: ErrorKind::BadRequest,
                ..
            }
        ),
        "{answer:?}"
    );
    assert!(c.recv_or_close().await.is_none());

    // A hostile resize in the middle of a pty exec: bad_request, the command is killed.
    for (rows, cols) in [(0, 80), (24, 100_000)] {
        let mut c = silkd.connect().await;
        c.send(pty_exec_req(&["sleep", "600"], 24, 80)).await;
        let pid = c.started().await;
        c.send(Request::Resize { rows, cols }).await;
        let answer = c.recv().await;
        assert!(
            matches!(
                answer,
                Response::Error {
                    kind: ErrorKind::BadRequest,
                    ..
                }
            ),
            "{answer:?}"
        );
        assert!(c.recv_or_close().await.is_none());
        wait_group_gone(pid, Duration::from_secs(10)).await;
    }
    // A resize during an exec without a pty is refused the same way.
    let mut c = silkd.connect().await;
    c.send(testkit::silkd::exec_req(&["sleep", "600"])).await;
    let pid = c.started().await;
    c.send(Request::Resize { rows: 24, cols: 80 }).await;
    let answer = c.recv().await;
    assert!(
        matches!(
            answer,
            Response::Error {
                kind: ErrorKind::BadRequest,
                ..
            }
        ),
        "{answer:?}"
    );
    wait_group_gone(pid, Duration::from_secs(10)).await;
    testkit::wait::wait_until(
        Duration::from_secs(10),
        "silkd to close its ptys",
        async || match pty_fds(silkd.pid()) {
            0 => Ok(()),
            n => Err(n),
        },
    )
    .await;
}
