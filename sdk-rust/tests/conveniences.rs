//! The SDK's convenience layer against a real sandboxd (process engine, real silkd): shell
//! lines, text and `check`, lines and `exec_lines`, partial output of a command cut short,
//! scoped and drop-released sandboxes, errors that name what they refer to.

use std::time::Duration;

use sandbox_sdk::{ClaimOptions, Client, Command, Error, ExitStatus, Line, Signal};
use testkit::sdk::assert_nothing_runs;
use testkit::{bounded, wait_until, DaemonProcess, Setup};

/// Waits until the node lists no sandbox: what a leaked claim would break.
async fn assert_none_claimed(d: &DaemonProcess) {
    let root = d.root();
    wait_until(Duration::from_secs(10), "no sandbox claimed", async || {
        testkit::wait::empty(root.list().await.unwrap())
    })
    .await
}

#[tokio::test]
async fn shell_lines_text_and_check() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();

        // A shell line: `cd`, pipes, `&&` and quoting work; the line is one argument.
        let out = sandbox
            .exec(&Command::shell(
                "cd /tmp && echo \"it's $(pwd)\" | tr a-z A-Z && printf 'bad \\377\\n' >&2; exit 3",
            ))
            .await
            .unwrap();
        assert_eq!(out.stdout_text(), "IT'S /TMP\n");
        // Invalid UTF-8 is U+FFFD in the text, exact in the bytes.
        assert_eq!(out.stderr_text(), "bad \u{fffd}\n");
        assert_eq!(out.stderr, b"bad \xff\n");
        assert!(!out.success());
        // A non-zero exit is Ok until `check` says otherwise.
        let e = out.clone().check().unwrap_err();
        assert_eq!(
            e.to_string(),
            "command failed with exit code 3: bad \u{fffd}"
        );
        assert_eq!(e.partial_output(), Some(&out));
        let ok = sandbox.exec(&Command::shell("true")).await.unwrap();
        assert!(ok.check().is_ok());

        // `lines()` over a taken stream: `\r\n` and `\n` end lines, a last line without
        // one still comes, a character split across writes is whole.
        let mut p = sandbox
            .spawn(&Command::shell(
                "printf 'a\\r\\nb'; sleep 0.1; printf '\\303'; printf '\\251\\n\\nlast'",
            ))
            .await
            .unwrap();
        let mut lines = p.take_stdout().unwrap().lines();
        let mut got = Vec::new();
        while let Some(line) = lines.next_line().await {
            got.push(line);
        }
        assert_eq!(got, ["a", "bé", "", "last"]);
        assert_eq!(p.wait().await.unwrap(), ExitStatus::Code(0));

        // `exec_lines`: the closure sees each line of both streams, the Output has all.
        let mut seen = Vec::new();
        let out = sandbox
            .exec_lines(
                &Command::shell("echo one; echo two >&2; printf 'thr'; printf 'ee'"),
                |line| seen.push(line),
            )
            .await
            .unwrap();
        assert_eq!(out.exit, ExitStatus::Code(0));
        assert_eq!(out.stdout, b"one\nthree");
        assert_eq!(out.stderr, b"two\n");
        seen.sort_by_key(|l| l.is_stderr());
        assert_eq!(
            seen,
            [
                Line::Stdout("one".into()),
                Line::Stdout("three".into()),
                Line::Stderr("two".into())
            ]
        );

        // Signals by name, no libc: SIGTERM ends a spawned command, shown by name.
        let p = sandbox
            .spawn(&Command::new("sleep").arg("600"))
            .await
            .unwrap();
        p.kill_with(Signal::Term).await.unwrap();
        let exit = p.output().await.unwrap().exit;
        assert_eq!(exit.to_string(), "killed by SIGTERM (signal 15)");

        assert_nothing_runs(&sandbox).await;
        sandbox.release().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn cut_short_commands_return_what_they_wrote() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();

        // Buffered exec past its timeout: 504 carries the output so far, exact bytes.
        let slow = Command::shell("echo before; printf '\\377' >&2; sleep 600")
            .timeout(Duration::from_secs(1));
        let e = sandbox.exec(&slow).await.unwrap_err();
        assert!(matches!(e, Error::Timeout { partial: Some(_) }), "{e:?}");
        let partial = e.partial_output().unwrap();
        assert_eq!(partial.stdout, b"before\n");
        assert_eq!(partial.stderr, [0xff]);
        assert_eq!(partial.exit, ExitStatus::Signal(Signal::Kill.number()));

        // Over the 4 MiB output cap: 413 with exactly the first 4 MiB, the rest cut.
        let cap = 4 * 1024 * 1024;
        let e = sandbox
            .exec(&Command::shell("yes abc | head -c 5000000; sleep 600"))
            .await
            .unwrap_err();
        let Error::OutputTooLarge { partial: Some(p) } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(p.stdout.len(), cap);
        assert!(p.stdout.starts_with(b"abc\nabc\n"));

        // A spawned command's own timeout through `exec_lines` keeps what it saw too.
        let mut seen = Vec::new();
        let e = sandbox
            .exec_lines(&slow, |line| seen.push(line.to_string()))
            .await
            .unwrap_err();
        assert_eq!(seen, ["before"]);
        assert_eq!(e.partial_output().unwrap().stdout, b"before\n");

        assert_nothing_runs(&sandbox).await;
        sandbox.release().await.unwrap();
    })
    .await
}

#[derive(Debug)]
enum AppError {
    Sdk(Error),
    /// The caller's own failure, never reached here.
    Unreachable,
}

impl From<Error> for AppError {
    fn from(e: Error) -> AppError {
        AppError::Sdk(e)
    }
}

#[tokio::test]
async fn scoped_sandboxes_are_released_however_they_end() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let client = d.root();

        // Success: the value comes back, the sandbox is gone.
        let text = client
            .with_sandbox(ClaimOptions::new(), |sb| async move {
                let out = sb.exec(&Command::shell("echo scoped")).await?.check()?;
                Ok::<_, Error>(out.stdout_text().into_owned())
            })
            .await
            .unwrap();
        assert_eq!(text, "scoped\n");
        assert!(client.list().await.unwrap().is_empty());

        // An early `?` return with the caller's own error type: returned as is, and
        // the sandbox is released (checked through the API, by id).
        let mut id = String::new();
        let failed = client
            .with_sandbox(ClaimOptions::new(), |sb| {
                id = sb.id().to_string();
                async move {
                    sb.exec(&Command::shell("exit 4")).await?.check()?;
                    Err::<(), _>(AppError::Unreachable)
                }
            })
            .await;
        assert!(
            matches!(&failed, Err(AppError::Sdk(Error::Failed(out))) if out.exit == ExitStatus::Code(4)),
            "{failed:?}"
        );
        let gone = client.sandbox_info(&id).await.unwrap_err();
        assert_eq!(
            gone.to_string(),
            format!("sandbox {id} not found (released or expired)")
        );
        assert!(client.list().await.unwrap().is_empty());

        // A panic inside the scope: the guard releases it from a task.
        let panicking = client.clone();
        let joined = tokio::spawn(async move {
            panicking
                .with_sandbox(ClaimOptions::new(), |sb| async move {
                    // Always true; written so that the closure still has a type.
                    if !sb.id().is_empty() {
                        panic!("the caller's bug in {}", sb.id());
                    }
                    Ok::<(), Error>(())
                })
                .await
        })
        .await;
        assert!(joined.unwrap_err().is_panic());
        assert_none_claimed(&d).await;

        // The opt-in guard: dropped on an early return, released.
        let guard = client
            .claim(ClaimOptions::new())
            .await
            .unwrap()
            .release_on_drop();
        let out = guard.exec(&Command::shell("echo guarded")).await.unwrap();
        assert_eq!(out.stdout, b"guarded\n");
        let kept_id = guard.id().to_string();
        drop(guard);
        assert_none_claimed(&d).await;

        // Errors name what they refer to.
        let e = client
            .sandbox(&kept_id)
            .exec(&Command::new("true"))
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("sandbox {kept_id} not found (released or expired)")
        );
        let e = d.client().with_token("nobody").list().await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "unauthorized: missing or unknown token for /v1/sandboxes"
        );
        let e = Client::new("http://localhost").unwrap_err();
        assert!(matches!(e, Error::InvalidUrl(_)), "{e:?}");
        assert!(e.to_string().contains("no port"), "{e}");
    })
    .await
}
