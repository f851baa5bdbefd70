//! `sbx` as scripts drive it, against a real sandboxd: `exec -n` in a `while read` loop,
//! a timed-out command's output before exit 124, a gone sandbox named in the error.

use std::process::Stdio;

use sandbox_sdk::ClaimOptions;
use testkit::sdk::assert_nothing_runs;
use testkit::{bounded, DaemonProcess, Setup, ROOT};
use tokio::process::Command;

/// `sh -c SCRIPT` with `$SBX` the binary and this daemon's URL and root token set.
fn shell(d: &DaemonProcess, script: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script])
        .env("SBX", env!("CARGO_BIN_EXE_sbx"))
        .env("SANDBOXD_URL", d.url())
        .env("SANDBOXD_TOKEN", ROOT)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn scripts_loop_time_out_and_name_what_is_gone() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let id = sandbox.id();

        // `-n` leaves the loop's input to the loop: one exec per line.
        let out = shell(
            &d,
            &format!(
                "printf 'a\\nb\\nc\\n' | while read l; do \"$SBX\" exec -n {id} -- echo \"got $l\"; done"
            ),
        )
        .output()
        .await
        .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "got a\ngot b\ngot c\n");

        // With `-n` a command that reads stdin sees EOF at once, even though sbx's own
        // stdin is a pipe that never closes.
        let mut child = shell(&d, &format!("\"$SBX\" exec -n {id} -- cat"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let held_open = child.stdin.take().unwrap();
        let out = child.wait_with_output().await.unwrap();
        drop(held_open);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(out.stdout.is_empty());

        // A timeout: what the command wrote comes first, then the one-line error, 124.
        let out = shell(
            &d,
            &format!(
                "\"$SBX\" exec --timeout 1 {id} -- sh -c 'echo before; printf err >&2; sleep 600'"
            ),
        )
        .output()
        .await
        .unwrap();
        assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "before\n");
        assert_eq!(
            text(&out.stderr),
            "errsbx: timed out: the command was killed\n"
        );
        assert_nothing_runs(&sandbox).await;

        // A released sandbox is named, with why it may be gone.
        sandbox.release().await.unwrap();
        let out = shell(&d, &format!("\"$SBX\" exec -n {id} -- true"))
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(125));
        assert_eq!(
            text(&out.stderr),
            format!("sbx: sandbox {id} not found (released or expired)\n")
        );
    })
    .await
}
