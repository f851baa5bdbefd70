//! The SDK against a real sandboxd (process engine, real silkd): claim/exec/release, exact
//! bytes through exec and spawn, stdin, kill on drop and on wait timeout, and the error
//! variant for each status.

use std::time::Duration;

use futures::StreamExt;
use sandbox_sdk::{ClaimOptions, Command, Error, Event, ExitStatus, Signal};
use testkit::sdk::{assert_nothing_runs, running};
use testkit::{bounded, wait_until, Setup, TENANT_A};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes 0..=255 repeated: every byte value, most of them not UTF-8 in context.
fn all_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 256) as u8).collect()
}

#[tokio::test]
async fn claim_exec_release() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let client = d.root();
        let sandbox = client.claim(ClaimOptions::new()).await.unwrap();
        assert!(sandbox.deadline().is_some());
        let listed = client.list().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, sandbox.id());

        let out = sandbox
            .exec(
                &Command::new("sh")
                    .args([
                        "-c",
                        "echo \"$GREETING from $(pwd)\"; echo oops >&2; exit 3",
                    ])
                    .env("GREETING", "hello")
                    .cwd("/tmp"),
            )
            .await
            .unwrap();
        assert_eq!(out.exit, ExitStatus::Code(3));
        assert_eq!(out.stdout, b"hello from /tmp\n");
        assert_eq!(out.stderr, b"oops\n");

        let out = sandbox
            .exec(&Command::new("sh").args(["-c", "kill -TERM $$"]))
            .await
            .unwrap();
        assert_eq!(out.exit, ExitStatus::Signal(Signal::Term.number()));

        sandbox.release().await.unwrap();
        assert!(client.list().await.unwrap().is_empty());
        // Releasing again is success; using it is NotFound.
        sandbox.release().await.unwrap();
        let gone = sandbox.exec(&Command::new("true")).await;
        assert!(matches!(gone, Err(Error::NotFound { .. })), "{gone:?}");
    })
    .await
}

#[tokio::test]
async fn renew_moves_the_deadline() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d
            .root()
            .claim(ClaimOptions::new().ttl(Duration::from_secs(30)))
            .await
            .unwrap();
        let first = sandbox.deadline_unix().unwrap();
        // Renew needs only a shared handle, and every clone sees the new deadline.
        let shared = std::sync::Arc::new(sandbox.clone());
        let granted = shared.renew(Duration::from_secs(300)).await.unwrap();
        assert_eq!(sandbox.deadline(), Some(granted));
        assert!(sandbox.deadline_display().to_string().starts_with("in 4m"));
        assert!(sandbox.deadline_unix().unwrap() >= first + 260);
        // Root acts on any sandbox by id; its renew is clamped to max_ttl_seconds (600).
        let by_id = d.root().sandbox(sandbox.id());
        assert_eq!(by_id.deadline_display().to_string(), "unknown");
        by_id.renew(Duration::from_secs(100_000)).await.unwrap();
        let now = std::time::SystemTime::now();
        let left = by_id.deadline().unwrap().duration_since(now).unwrap();
        assert!(left <= Duration::from_secs(601), "{left:?}");
        sandbox.release().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn exact_binary_output_through_exec_and_spawn() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        // The `base` template's root is the guest image's rootfs.
        let image = testkit::vm::guest_image().join("rootfs/bin/busybox");
        let ls = std::fs::read(image).unwrap();
        let head = Command::new("head").args(["-c", "4096", "/bin/busybox"]);
        let out = sandbox.exec(&head).await.unwrap();
        assert_eq!(out.exit, ExitStatus::Code(0));
        assert_eq!(out.stdout, ls[..4096]);

        let out = sandbox.spawn(&head).await.unwrap().output().await.unwrap();
        assert_eq!(out.stdout, ls[..4096]);

        // A user through both paths (HTTP exec and the relay): root by name; an unknown
        // one is BadRequest either way.
        let whoami = Command::new("sh")
            .args(["-c", "echo $USER $HOME"])
            .user("root");
        let out = sandbox.exec(&whoami).await.unwrap();
        assert_eq!(out.stdout, b"root /root\n");
        let out = sandbox
            .spawn(&whoami)
            .await
            .unwrap()
            .output()
            .await
            .unwrap();
        assert_eq!(out.stdout, b"root /root\n");
        let nobody = Command::new("true").user("nosuchuser");
        let e = sandbox.exec(&nobody).await.unwrap_err();
        assert!(matches!(e, Error::BadRequest(_)), "{e:?}");
        let e = sandbox.spawn(&nobody).await.unwrap_err();
        assert!(matches!(e, Error::BadRequest(_)), "{e:?}");

        // Mixed valid and invalid UTF-8 on both streams, through exec.
        let script = r"printf 'caf\303\251 \377\000\001' ; printf '\200 ok' >&2";
        let out = sandbox
            .exec(&Command::new("sh").args(["-c", script]))
            .await
            .unwrap();
        assert_eq!(out.stdout, b"caf\xc3\xa9 \xff\x00\x01");
        assert_eq!(out.stderr, b"\x80 ok");

        // A larger stream through spawn, read as AsyncRead.
        let mut p = sandbox
            .spawn(&Command::new("head").args(["-c", "1000000", "/dev/urandom"]))
            .await
            .unwrap();
        let mut stdout = p.take_stdout().unwrap();
        let mut got = Vec::new();
        stdout.read_to_end(&mut got).await.unwrap();
        assert_eq!(got.len(), 1_000_000);
        assert_eq!(p.wait().await.unwrap(), ExitStatus::Code(0));
        sandbox.release().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn stdin_round_trip_with_eof() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let data = all_bytes(300 * 1024);

        // `cat` ends only on EOF, so its exit proves the close arrived.
        let mut p = sandbox
            .spawn(&Command::new("cat").stdin(true))
            .await
            .unwrap();
        let mut stdin = p.stdin().unwrap();
        assert!(p.stdin().is_none(), "stdin is taken once");
        let mut stdout = p.take_stdout().unwrap();
        let writer = {
            let data = data.clone();
            tokio::spawn(async move {
                stdin.write_all(&data).await.unwrap();
                stdin.close().await.unwrap();
            })
        };
        let mut echoed = Vec::new();
        stdout.read_to_end(&mut echoed).await.unwrap();
        writer.await.unwrap();
        assert_eq!(p.wait().await.unwrap(), ExitStatus::Code(0));
        assert!(
            echoed == data,
            "echoed {} bytes, sent {}",
            echoed.len(),
            data.len()
        );

        // Through the event stream, with stdin dropped instead of closed.
        let mut p = sandbox
            .spawn(
                &Command::new("sh")
                    .args(["-c", "wc -c; echo done >&2"])
                    .stdin(true),
            )
            .await
            .unwrap();
        let mut stdin = p.stdin().unwrap();
        stdin.write_all(b"12345").await.unwrap();
        drop(stdin);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let exit = loop {
            match p.next_event().await.unwrap().unwrap() {
                Event::Stdout(b) => out.extend_from_slice(&b),
                Event::Stderr(b) => err.extend_from_slice(&b),
                Event::Exit(status) => break status,
            }
        };
        assert_eq!(exit, ExitStatus::Code(0));
        assert_eq!(String::from_utf8(out).unwrap().trim(), "5");
        assert_eq!(err, b"done\n");
        assert!(p.next_event().await.unwrap().is_none());
        sandbox.release().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn output_streams_and_events() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let mut p = sandbox
            .spawn(&Command::new("sh").args(["-c", "echo out; echo err >&2; exit 7"]))
            .await
            .unwrap();
        let stdout = p.take_stdout().unwrap();
        assert!(p.take_stdout().is_none());
        let chunks: Vec<_> = stdout.collect().await;
        assert_eq!(chunks.concat(), b"out\n");
        // stderr was not taken: wait discards it.
        assert_eq!(p.wait().await.unwrap(), ExitStatus::Code(7));
        assert_eq!(
            p.wait().await.unwrap(),
            ExitStatus::Code(7),
            "wait is repeatable"
        );
        sandbox.release().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn dropping_a_running_process_kills_it() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let tree = Command::new("sh").args(["-c", "sleep 600 & sleep 600 & wait"]);

        let p = sandbox.spawn(&tree).await.unwrap();
        assert_eq!(running(&sandbox).await, [p.pid()]);
        drop(p);
        assert_nothing_runs(&sandbox).await;

        // With its stdin writer still held the relay connection stays open, so only the
        // kill sent from Drop on a fresh connection can end it.
        let mut p = sandbox.spawn(&tree.clone().stdin(true)).await.unwrap();
        let stdin = p.stdin().unwrap();
        drop(p);
        assert_nothing_runs(&sandbox).await;
        drop(stdin);

        // Nothing of the process trees is left (not only the group leaders silkd lists);
        // busybox's pidof exits 1 when no process has that name.
        let left = sandbox
            .exec(&Command::new("pidof").arg("sleep"))
            .await
            .unwrap();
        assert_eq!(
            left.exit,
            ExitStatus::Code(1),
            "sleep still runs: {:?}",
            left.stdout
        );
        sandbox.release().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn wait_timeout_kills_and_kill_signals() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let mut p = sandbox
            .spawn(&Command::new("sleep").arg("600"))
            .await
            .unwrap();
        let waited = p.wait_timeout(Duration::from_millis(300)).await;
        assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
        assert_nothing_runs(&sandbox).await;

        // A command that ends in time is not touched.
        let mut p = sandbox.spawn(&Command::new("true")).await.unwrap();
        assert_eq!(
            p.wait_timeout(Duration::from_secs(10)).await.unwrap(),
            ExitStatus::Code(0)
        );

        // The command's own timeout, enforced by silkd.
        let mut p = sandbox
            .spawn(
                &Command::new("sleep")
                    .arg("600")
                    .timeout(Duration::from_millis(200)),
            )
            .await
            .unwrap();
        assert!(matches!(p.wait().await, Err(Error::Timeout { .. })));

        // kill_with sends the signal asked for.
        let mut p = sandbox
            .spawn(&Command::new("sleep").arg("600"))
            .await
            .unwrap();
        p.kill_with(Signal::Term).await.unwrap();
        assert_eq!(
            p.wait().await.unwrap(),
            ExitStatus::Signal(Signal::Term.number())
        );
        // Killing what already ended is fine.
        p.kill().await.unwrap();
        assert_nothing_runs(&sandbox).await;
        sandbox.release().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn spawn_failures_are_typed() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let missing = sandbox.spawn(&Command::new("/nonexistent")).await;
        assert!(matches!(missing, Err(Error::BadRequest(_))), "{missing:?}");
        let missing = sandbox.exec(&Command::new("/nonexistent")).await;
        assert!(matches!(missing, Err(Error::BadRequest(_))), "{missing:?}");
        let empty = sandbox
            .exec(&Command::from_argv(Vec::<String>::new()))
            .await;
        assert!(matches!(empty, Err(Error::BadRequest(_))), "{empty:?}");
        let huge = sandbox
            .exec(&Command::new("echo").arg("x".repeat(2 * 1024 * 1024)))
            .await;
        assert!(matches!(huge, Err(Error::BadRequest(_))), "{huge:?}");
        let stdin = sandbox.exec(&Command::new("cat").stdin(true)).await;
        assert!(matches!(stdin, Err(Error::BadRequest(_))), "{stdin:?}");
        sandbox.release().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn error_variants_per_status() {
    let d = testkit::sdk::start(Setup {
        max_claims: 2,
        max_output_bytes: 1000,
        max_in_flight: 1,
        ..Setup::sdk()
    })
    .await;
    bounded(async {
        let root = d.root();
        // 401: no token, unknown token.
        assert!(matches!(
            d.client().claim(ClaimOptions::new()).await,
            Err(Error::Unauthorized { .. })
        ));
        let stranger = d.client().with_token("not-a-token-anyone-issued");
        assert!(matches!(
            stranger.list().await,
            Err(Error::Unauthorized { .. })
        ));
        // 403: a tenant on a root-only route.
        let tenant = d.client().with_token(TENANT_A);
        assert!(matches!(tenant.info().await, Err(Error::Forbidden(_))));
        // 400: unknown template.
        let bad = root.claim(ClaimOptions::new().template("nope")).await;
        assert!(matches!(bad, Err(Error::BadRequest(_))), "{bad:?}");

        let sandbox = root.claim(ClaimOptions::new()).await.unwrap();
        // 404: unknown id, and a wrong sandbox token (answers like an unknown id).
        let unknown = root
            .sandbox("sb-0000000000000000")
            .exec(&Command::new("true"))
            .await;
        assert!(
            matches!(unknown, Err(Error::NotFound { .. })),
            "{unknown:?}"
        );
        let other = root.claim(ClaimOptions::new()).await.unwrap();
        let wrong = root.sandbox_with_token(sandbox.id(), other.token().unwrap());
        assert!(matches!(
            wrong.exec(&Command::new("true")).await,
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            wrong.spawn(&Command::new("true")).await,
            Err(Error::NotFound { .. })
        ));
        // 429: max_claims (2) reached.
        let over = root.claim(ClaimOptions::new()).await;
        assert!(matches!(over, Err(Error::LimitReached(_))), "{over:?}");
        other.release().await.unwrap();

        // 413: 1001 bytes against a 1000-byte cap; 1000 exactly is fine.
        let exact = sandbox
            .exec(&Command::new("head").args(["-c", "1000", "/dev/zero"]))
            .await;
        assert_eq!(exact.unwrap().stdout.len(), 1000);
        let big = sandbox
            .exec(&Command::new("head").args(["-c", "1001", "/dev/zero"]))
            .await;
        assert!(matches!(big, Err(Error::OutputTooLarge { .. })), "{big:?}");
        // 504: the exec's timeout.
        let slow = sandbox
            .exec(
                &Command::new("sleep")
                    .arg("600")
                    .timeout(Duration::from_millis(300)),
            )
            .await;
        assert!(matches!(slow, Err(Error::Timeout { .. })), "{slow:?}");
        assert_nothing_runs(&sandbox).await;

        // 503: max_in_flight is 1 and one exec runs; without retries the second is Busy.
        let busy_sandbox = sandbox.clone();
        let holder =
            tokio::spawn(async move { busy_sandbox.exec(&Command::new("sleep").arg("1")).await });
        // Wait until the holder's command runs: its exec holds the only slot.
        wait_until(Duration::from_secs(10), "the holder running", async || {
            !running(&sandbox).await.is_empty()
        })
        .await;
        let no_retry = d
            .root()
            .with_busy_retries(0)
            .sandbox_with_token(sandbox.id(), sandbox.token().unwrap());
        let busy = no_retry.exec(&Command::new("true")).await;
        assert!(
            matches!(
                busy,
                Err(Error::Busy {
                    retry_after: Some(_)
                })
            ),
            "{busy:?}"
        );
        // With retries (the default) the same call waits its turn and succeeds.
        let retried = sandbox
            .exec(&Command::new("echo").arg("eventually"))
            .await
            .unwrap();
        assert_eq!(retried.stdout, b"eventually\n");
        assert!(holder.await.unwrap().unwrap().exit.success());
        sandbox.release().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn works_over_tcp_too() {
    let d = testkit::sdk::start_tcp(Setup::sdk()).await;
    bounded(async {
        assert!(d.url().starts_with("http://127.0.0.1:"));
        d.client().health().await.unwrap();
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let out = sandbox
            .exec(&Command::new("echo").arg("tcp"))
            .await
            .unwrap();
        assert_eq!(out.stdout, b"tcp\n");
        let out = sandbox
            .spawn(&Command::new("echo").arg("relay"))
            .await
            .unwrap();
        assert_eq!(out.output().await.unwrap().stdout, b"relay\n");
        assert_eq!(d.root().info().await.unwrap().claims.active, 1);
        sandbox.release().await.unwrap();
    })
    .await
}
