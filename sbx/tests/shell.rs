//! `sbx shell` in a real terminal (tmux) against a real sandboxd: typing a command and
//! reading the screen, the window size passed on and followed, the exit code, and our
//! terminal restored afterwards, also when sbx is killed by a signal mid-session.

use sandbox_sdk::ClaimOptions;
use testkit::sdk::assert_nothing_runs;
use testkit::tmux::{stty_of, Tmux};
use testkit::{bounded, wait_until, Setup, ROOT};

/// The file's content once it holds a whole line (the shell may be writing it).
fn complete_line(path: &std::path::Path) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(s) if s.ends_with('\n') => Ok(s),
        Ok(s) => Err(s),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test]
async fn shell_in_tmux_types_reads_resizes_and_restores_the_terminal() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let url = d.url();
        let env = [("SANDBOXD_URL", url.as_str()), ("SANDBOXD_TOKEN", ROOT)];
        let sbx = env!("CARGO_BIN_EXE_sbx");
        let script = format!(
            "stty -g > before; '{sbx}' shell {id}; echo sbx-rc=$?; stty -g > after; exec sleep 600",
            id = sandbox.id()
        );
        let script = format!("cd '{}' && {script}", dir.path().display());
        let tmux = Tmux::start(dir.path(), 100, 30, &env, &script);
        let tty = tmux.pane_tty();

        tmux.wait_settings_change(&dir.path().join("before")).await;
        // Markers are computed remotely, so the echo of the typed line does not match.
        tmux.type_line("echo hello-$((20+1)); stty size");
        // `stty size` prints last: once its answer is there, so is the echo's.
        let screen = tmux.wait_for("30 100").await;
        assert!(screen.contains("hello-21"), "typed command ran:\n{screen}");
        let before = std::fs::read_to_string(dir.path().join("before")).unwrap();

        tmux.resize(120, 40);
        tmux.type_line("echo size-$((1+1)); stty size");
        let screen = tmux
            .wait_for("40 120")
            .await;
        assert!(screen.contains("size-2"), "{screen}");

        tmux.type_line("exit 7");
        tmux.wait_for("sbx-rc=7").await;
        let after = wait_until(std::time::Duration::from_secs(10), "stty -g after", async || {
            complete_line(&dir.path().join("after"))
        })
        .await;
        assert_eq!(before, after, "terminal restored");
        assert_eq!(stty_of(&tty), before.trim());
        assert_nothing_runs(&sandbox).await;

        // Killed by a signal in the middle of a session: terminal restored all the same,
        // exit 128 + SIGTERM, and the shell in the sandbox is killed.
        let dir2 = tempfile::tempdir().unwrap();
        let script = format!(
            "cd '{}' && stty -g > before; '{sbx}' shell {id}; echo sbx-rc=$?; stty -g > after; exec sleep 600",
            dir2.path().display(),
            id = sandbox.id()
        );
        let tmux2 = Tmux::start(dir2.path(), 80, 24, &env, &script);
        tmux2.wait_settings_change(&dir2.path().join("before")).await;
        tmux2.type_line("echo in-$((2+2))");
        tmux2.wait_for("in-4").await;
        let shell_pid = tmux2.pane_pid();
        let children = std::fs::read_to_string(format!(
            "/proc/{shell_pid}/task/{shell_pid}/children"
        ))
        .unwrap();
        let sbx_pid: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
        // SAFETY: kill(2) on the pid of the sbx this test started.
        assert_eq!(unsafe { libc::kill(sbx_pid, libc::SIGTERM) }, 0);
        tmux2.wait_for("sbx-rc=143").await;
        let before = std::fs::read_to_string(dir2.path().join("before")).unwrap();
        let after = wait_until(std::time::Duration::from_secs(10), "stty -g after", async || {
            complete_line(&dir2.path().join("after"))
        })
        .await;
        assert_eq!(before, after, "terminal restored after SIGTERM");
        assert_nothing_runs(&sandbox).await;

        // `exec -t`: a command under a pty sized like ours, its code passed back.
        let dir3 = tempfile::tempdir().unwrap();
        let script = format!(
            "'{sbx}' exec -t {id} -- sh -c 'tty; stty size; exit 5'; echo sbx-rc=$?; exec sleep 600",
            id = sandbox.id()
        );
        let tmux3 = Tmux::start(dir3.path(), 90, 20, &env, &script);
        let screen = tmux3.wait_for("sbx-rc=5").await;
        assert!(screen.contains("/dev/pts/"), "{screen}");
        assert!(screen.contains("20 90"), "{screen}");
        sandbox.release().await.unwrap();
    })
    .await
}
