//! `sbx exec --detach`, `sbx ps` and `sbx attach` against a real sandboxd: the command
//! outlives sbx, is listed, is followed from its first line, and its exit code comes
//! back through `attach`; what is refused.

use sandbox_sdk::ClaimOptions;
use testkit::sdk::{assert_nothing_runs, running};
use testkit::{bounded, Setup, ROOT};

fn sbx(d: &testkit::DaemonProcess, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_sbx"))
        .env("SANDBOXD_URL", d.url())
        .env("SANDBOXD_TOKEN", ROOT)
        .stdin(std::process::Stdio::null())
        .args(args)
        .output()
        .expect("running sbx")
}

#[tokio::test]
async fn detach_ps_attach() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let id = sandbox.id();
        // Waits for a line on stdin, so `attach` below sees it running, then exits 3.
        let out = sbx(
            &d,
            &[
                "exec",
                "--detach",
                id,
                "--",
                "sh",
                "-c",
                "echo first; read x; echo got-$x; exit 3",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pid: u32 = String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(running(&sandbox).await, [pid], "outlived sbx");

        let out = sbx(&d, &["ps", id]);
        let listing = String::from_utf8(out.stdout).unwrap();
        let line = listing
            .lines()
            .find(|l| l.starts_with(&format!("{pid}\t")))
            .unwrap_or_else(|| panic!("{listing}"));
        assert!(
            line.contains("\trunning\t") && line.contains("\tyes\t0\t"),
            "{line}"
        );
        assert!(
            line.ends_with("sh -c echo first; read x; echo got-$x; exit 3"),
            "{line}"
        );

        // attach: retained output, stdin forwarded (not a terminal), exit code back.
        let mut attach = std::process::Command::new(env!("CARGO_BIN_EXE_sbx"))
            .env("SANDBOXD_URL", d.url())
            .env("SANDBOXD_TOKEN", ROOT)
            .args(["attach", id, &pid.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        attach.stdin.take().unwrap().write_all(b"hello\n").unwrap();
        let out = attach.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "first\ngot-hello\n");
        assert_nothing_runs(&sandbox).await;

        // Refused: attaching an unknown pid; --detach with --timeout.
        let out = sbx(&d, &["attach", id, "999999"]);
        assert_eq!(out.status.code(), Some(125));
        let out = sbx(
            &d,
            &["exec", "--detach", "--timeout", "5", id, "--", "true"],
        );
        assert_eq!(out.status.code(), Some(125));
        assert!(running(&sandbox).await.is_empty());
        sandbox.release().await.unwrap();
    })
    .await
}
