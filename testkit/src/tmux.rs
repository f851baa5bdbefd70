//! A private tmux server for terminal tests: one session running a command on a real
//! pty, keys typed into it, its screen read back, its window resized; the server is
//! killed on drop (also on panic), with everything running in it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::wait::wait_until;

/// A tmux server on its own socket with one session.
pub struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    /// Starts `tmux` with one `cols` x `rows` session running `sh -c script`, with `env`
    /// set for it. Fails loudly when tmux is missing (`cargo xtask deps` installs it).
    pub fn start(dir: &Path, cols: u16, rows: u16, env: &[(&str, &str)], script: &str) -> Tmux {
        let tmux = Tmux {
            socket: dir.join("tmux.sock"),
        };
        let (x, y) = (cols.to_string(), rows.to_string());
        let mut args = vec!["new-session", "-d", "-x", &x, "-y", &y];
        let pairs: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for p in &pairs {
            args.extend(["-e", p.as_str()]);
        }
        args.extend(["sh", "-c", script]);
        tmux.run(&args);
        // Keep the pane (and its last screen) after the command exits.
        tmux.run(&["set-option", "-g", "remain-on-exit", "on"]);
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-f")
            .arg("/dev/null")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("running tmux (installed by `cargo xtask deps`)");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `text` literally, then Enter.
    pub fn type_line(&self, text: &str) {
        self.run(&["send-keys", "-l", text]);
        self.run(&["send-keys", "Enter"]);
    }

    /// The visible screen, lines joined by `\n`.
    pub fn screen(&self) -> String {
        self.run(&["capture-pane", "-p"])
    }

    /// Waits until the screen contains `needle`; returns the screen.
    pub async fn wait_for(&self, needle: &str) -> String {
        let what = format!("{needle:?} on the tmux screen");
        wait_until(Duration::from_secs(30), &what, async || {
            let s = self.screen();
            if s.contains(needle) {
                Ok(s)
            } else {
                Err(s)
            }
        })
        .await
    }

    /// The pane's terminal device (`/dev/pts/N` on the host).
    pub fn pane_tty(&self) -> String {
        self.run(&["display-message", "-p", "#{pane_tty}"])
            .trim()
            .to_string()
    }

    /// The pid of the pane's process (the `sh -c script`).
    pub fn pane_pid(&self) -> u32 {
        let out = self.run(&["display-message", "-p", "#{pane_pid}"]);
        out.trim().parse().expect("pane_pid")
    }

    /// Resizes the window; the program in front gets SIGWINCH.
    pub fn resize(&self, cols: u16, rows: u16) {
        let (x, y) = (cols.to_string(), rows.to_string());
        self.run(&["resize-window", "-x", &x, "-y", &y]);
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

impl Tmux {
    /// Waits until the pane's terminal settings differ from `before` (a program in it
    /// switched to raw mode), so typed keys reach that program rather than the line
    /// discipline's queue, which entering raw mode flushes.
    pub async fn wait_settings_change(&self, before: &Path) {
        let tty = self.pane_tty();
        wait_until(
            Duration::from_secs(30),
            "the pane's terminal to go raw",
            async || {
                let before = std::fs::read_to_string(before).unwrap_or_default();
                let now = stty_of(&tty);
                if !before.is_empty() && before.trim() != now {
                    Ok(())
                } else {
                    Err(now)
                }
            },
        )
        .await
    }
}

/// `stty -g` of a terminal device: its settings, comparable before and after.
pub fn stty_of(tty: &str) -> String {
    let out = Command::new("stty")
        .args(["-g", "-F", tty])
        .output()
        .expect("stty");
    assert!(out.status.success(), "stty -F {tty}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
