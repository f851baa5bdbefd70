//! The `sbx` binary against a real sandboxd: exit codes, stdin forwarding, release on
//! success, failure and Ctrl-C, one-line errors, the config file.

use std::process::Output;
use std::time::Duration;

use sandbox_sdk::ClaimOptions;
use testkit::sdk::{assert_nothing_runs, running};
use testkit::{bounded, wait_until, DaemonProcess, Setup, ROOT, TENANT_A};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// `sbx` with this daemon's URL and root token in its environment.
fn sbx_command(d: &DaemonProcess) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sbx"));
    cmd.env("SANDBOXD_URL", d.url())
        .env("SANDBOXD_TOKEN", ROOT)
        .stdin(std::process::Stdio::null());
    cmd
}

/// Runs an `sbx` command line to completion.
async fn sbx(d: &DaemonProcess, args: &[&str]) -> Output {
    let mut cmd = Command::from(sbx_command(d));
    cmd.args(args).kill_on_drop(true);
    cmd.output().await.expect("running sbx")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn exec_streams_and_propagates_exit_codes() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let id = sandbox.id();

        let out = sbx(&d, &["exec", id, "--", "sh", "-c", "exit 7"]).await;
        assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
        let out = sbx(&d, &["exec", id, "--", "sh", "-c", "kill -KILL $$"]).await;
        assert_eq!(out.status.code(), Some(128 + 9));

        // Output goes to the matching stream, byte for byte.
        let out = sbx(
            &d,
            &[
                "exec",
                id,
                "-e",
                "X=1",
                "--cwd",
                "/tmp",
                "--",
                "sh",
                "-c",
                "printf 'out %s %s\\377' $X $(pwd); printf err >&2",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(out.stdout, b"out 1 /tmp\xff");
        assert_eq!(out.stderr, b"err");

        // --user: the sandbox's root by name; an unknown user is sbx's one-line 125.
        let out = sbx(
            &d,
            &["exec", id, "--user", "root", "--", "sh", "-c", "echo $USER"],
        )
        .await;
        assert_eq!(out.stdout, b"root\n", "{}", stderr(&out));
        let out = sbx(&d, &["exec", id, "-u", "nosuchuser", "--", "true"]).await;
        assert_eq!(out.status.code(), Some(125));
        assert!(stderr(&out).contains("unknown user"), "{}", stderr(&out));
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));

        // stdin is forwarded when it is not a terminal, EOF included; the sandbox's own
        // token works as well as root's.
        let mut cmd = Command::from(sbx_command(&d));
        cmd.args([
            "--token",
            sandbox.token().unwrap(),
            "exec",
            id,
            "--",
            "sh",
            "-c",
            "cat; echo end",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
        let mut child = cmd.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"line one\nline two\n").await.unwrap();
        drop(stdin);
        let out = child.wait_with_output().await.unwrap();
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(out.stdout, b"line one\nline two\nend\n");

        // The command's timeout exits 124; sbx's own failures 125, as one line.
        let out = sbx(&d, &["exec", id, "--timeout", "0.3", "--", "sleep", "600"]).await;
        assert_eq!(out.status.code(), Some(124));
        let out = sbx(&d, &["exec", id, "--", "/nonexistent"]).await;
        assert_eq!(out.status.code(), Some(125));
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
        assert!(
            stderr(&out).starts_with("sbx: bad request: "),
            "{}",
            stderr(&out)
        );

        // A reader that goes away (`sbx exec ... yes | head`) ends the command: SIGPIPE.
        let mut child = Command::from(sbx_command(&d))
            .args(["exec", id, "--", "yes"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 4];
        tokio::io::AsyncReadExt::read_exact(&mut stdout, &mut first)
            .await
            .unwrap();
        assert_eq!(&first, b"y\ny\n");
        drop(stdout);
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(128 + libc::SIGPIPE));

        assert_nothing_runs(&sandbox).await;
        sandbox.release().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn run_releases_on_success_and_on_failure() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let out = sbx(&d, &["run", "--", "echo", "hello"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(out.stdout, b"hello\n");
        assert!(d.root().list().await.unwrap().is_empty());

        let out = sbx(
            &d,
            &[
                "run",
                "--template",
                "base",
                "--size",
                "small",
                "--",
                "sh",
                "-c",
                "exit 3",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(3));
        assert!(d.root().list().await.unwrap().is_empty());

        let out = sbx(&d, &["run", "--", "/nonexistent"]).await;
        assert_eq!(out.status.code(), Some(125));
        assert!(d.root().list().await.unwrap().is_empty());

        // A claim that fails leaves nothing to release and says why.
        let out = sbx(&d, &["run", "--template", "nope", "--", "true"]).await;
        assert_eq!(out.status.code(), Some(125));
        assert!(
            stderr(&out).starts_with("sbx: bad request"),
            "{}",
            stderr(&out)
        );
    })
    .await
}

#[tokio::test]
async fn run_releases_on_interrupt() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let mut child = Command::from(sbx_command(&d))
            .args(["run", "--", "sleep", "600"])
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Wait until the command runs in a claimed sandbox.
        wait_until(
            Duration::from_secs(10),
            "sbx run running sleep",
            async || match d.root().list().await.unwrap().first() {
                Some(s) => !running(&d.root().sandbox(&s.id)).await.is_empty(),
                None => false,
            },
        )
        .await;
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(child.id().unwrap() as libc::pid_t, libc::SIGINT) };
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(128 + libc::SIGINT));
        assert!(d.root().list().await.unwrap().is_empty());
    })
    .await
}

#[tokio::test]
async fn claim_ls_info_release() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let out = sbx(&d, &["claim", "--ttl", "90", "--json"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let claim: api::ClaimResponse = serde_json::from_slice(&out.stdout).unwrap();

        let out = sbx(&d, &["ls"]).await;
        let table = String::from_utf8(out.stdout).unwrap();
        assert!(
            table.lines().nth(1).unwrap().starts_with(&claim.id),
            "{table}"
        );
        let out = sbx(&d, &["ls", "--json"]).await;
        let list: api::SandboxList = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(list.sandboxes.len(), 1);

        let out = sbx(&d, &["info"]).await;
        let info: api::InfoResponse = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(info.claims.active, 1);
        let out = sbx(&d, &["info", &claim.id]).await;
        let one: api::SandboxSummary = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(one.id, claim.id);

        let out = sbx(&d, &["renew", &claim.id, "--ttl", "200"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let out = sbx(&d, &["release", &claim.id]).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        // Releasing again succeeds; renewing what is gone does not.
        assert_eq!(
            sbx(&d, &["release", &claim.id]).await.status.code(),
            Some(0)
        );
        let out = sbx(&d, &["renew", &claim.id, "--ttl", "5"]).await;
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            stderr(&out),
            format!(
                "sbx: sandbox {} not found (released or expired)\n",
                claim.id
            )
        );
    })
    .await
}

#[tokio::test]
async fn errors_are_one_line() {
    let d = testkit::sdk::start(Setup {
        tenant_a_max_claims: 0,
        ..Setup::sdk()
    })
    .await;
    bounded(async {
        let out = sbx(&d, &["--token", "not-a-token-anyone-issued", "ls"]).await;
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            stderr(&out),
            "sbx: unauthorized: missing or unknown token for /v1/sandboxes\n"
        );

        let out = sbx(&d, &["--token", TENANT_A, "claim"]).await;
        assert_eq!(out.status.code(), Some(1));
        assert!(
            stderr(&out).starts_with("sbx: limit reached: "),
            "{}",
            stderr(&out)
        );
        assert_eq!(stderr(&out).lines().count(), 1);

        let out = sbx(&d, &["--url", "unix:/nonexistent/sock", "ls"]).await;
        assert_eq!(out.status.code(), Some(1));
        assert!(
            stderr(&out).starts_with("sbx: transport: "),
            "{}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains("/nonexistent/sock"),
            "{}",
            stderr(&out)
        );
        assert_eq!(stderr(&out).lines().count(), 1);
    })
    .await
}

#[tokio::test]
async fn url_and_token_fall_back_to_the_config_file() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    let config_home = tempfile::tempdir().unwrap();
    let file = config_home.path().join("sbx/config.toml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    // Neither flags nor environment: everything comes from the file.
    let bare = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sbx"));
        cmd.args(args)
            .env_remove("SANDBOXD_URL")
            .env_remove("SANDBOXD_TOKEN")
            .env("XDG_CONFIG_HOME", config_home.path())
            .kill_on_drop(true);
        cmd
    };
    bounded(async {
        std::fs::write(&file, format!("url = {:?}\ntoken = {:?}\n", d.url(), ROOT)).unwrap();
        let out = bare(&["run", "--", "echo", "hello"])
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(out.stdout, b"hello\n");
        assert!(d.root().list().await.unwrap().is_empty());

        // A flag, then the environment, beats the file, key by key.
        let out = bare(&["--token", "not-a-token-anyone-issued", "ls"])
            .output()
            .await
            .unwrap();
        assert_eq!(
            stderr(&out),
            "sbx: unauthorized: missing or unknown token for /v1/sandboxes\n"
        );
        let out = bare(&["ls"])
            .env("SANDBOXD_TOKEN", "not-a-token-anyone-issued")
            .output()
            .await
            .unwrap();
        assert_eq!(
            stderr(&out),
            "sbx: unauthorized: missing or unknown token for /v1/sandboxes\n"
        );
        let out = bare(&["ls"])
            .env("SANDBOXD_URL", "unix:/nonexistent/sock")
            .output()
            .await
            .unwrap();
        assert!(
            stderr(&out).contains("/nonexistent/sock"),
            "{}",
            stderr(&out)
        );
        // With both given the file is not read at all, not even when it is broken.
        std::fs::write(&file, "url = [\n").unwrap();
        let out = bare(&["ls"])
            .env("SANDBOXD_URL", d.url())
            .env("SANDBOXD_TOKEN", ROOT)
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        // Otherwise a broken file is one line naming it; an unknown key is refused too.
        let out = bare(&["ls"]).output().await.unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
        assert!(
            stderr(&out).starts_with(&format!("sbx: {}: ", file.display())),
            "{}",
            stderr(&out)
        );
        std::fs::write(&file, "urll = \"x\"\n").unwrap();
        let out = bare(&["ls"]).output().await.unwrap();
        assert!(stderr(&out).contains("unknown field"), "{}", stderr(&out));
    })
    .await
}
