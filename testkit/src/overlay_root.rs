//! A throwaway copy of this host's root to install packages into: a shell script runs,
//! chrooted, on an overlay whose lower layer is `/` and whose upper layer is a tmpfs, in
//! a private mount namespace (`unshare --mount`). Everything it writes (dpkg's database,
//! /etc/passwd, /usr/bin) lands in the tmpfs and vanishes with the namespace: the host's
//! real /etc and /usr are never touched. Needs root (mounts).

use std::io::Write;
use std::process::{Command, Stdio};

/// What the script printed, and how it ended.
pub struct ScriptRun {
    /// Exit status, as `sh` reported it.
    pub status: std::process::ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl ScriptRun {
    /// The lines printed after `== name` up to the next `== ` marker.
    pub fn section(&self, name: &str) -> String {
        let marker = format!("== {name}");
        let mut lines = self.stdout.lines().skip_while(|l| *l != marker);
        assert!(
            lines.next().is_some(),
            "section `{name}` missing; stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        lines
            .take_while(|l| !l.starts_with("== "))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The outer script: tmpfs + overlay + the API filesystems, then `chroot` into it. `/run`,
/// `/tmp` and `/dev/shm` are the namespace's own tmpfs, so nothing the inner script starts
/// leaves files in the host's. `$1` is the file copied to `/tmp/input` inside.
const SETUP: &str = r#"set -eu
S=$(mktemp -d /tmp/overlay-root.XXXXXX)
mount -t tmpfs -o size=4g,mode=0700 overlay-root "$S"
mkdir "$S/upper" "$S/work" "$S/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$S/upper,workdir=$S/work" "$S/root"
for d in proc dev sys; do mount --rbind "/$d" "$S/root/$d"; done
for d in run tmp dev/shm; do mount -t tmpfs "scratch-$d" "$S/root/$d"; done
chmod 1777 "$S/root/tmp" "$S/root/dev/shm"
if [ -n "${1:-}" ]; then cp "$1" "$S/root/tmp/input"; fi
chroot "$S/root" /bin/sh -s
"#;

/// Runs `script` (POSIX sh, read from stdin) as root in a fresh overlay of `/`, with
/// `input` (if any) at `/tmp/input`. The namespace, its mounts and the tmpfs end when the
/// script does; the empty mount point under /tmp is removed.
pub fn run(script: &str, input: Option<&std::path::Path>) -> ScriptRun {
    assert!(
        nix::unistd::geteuid().is_root(),
        "overlay_root needs root (mount namespaces, overlayfs)"
    );
    let before: Vec<_> = mount_points();
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "--fork",
        "sh",
        "-c",
        SETUP,
        "setup",
    ]);
    if let Some(input) = input {
        cmd.arg(input);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning unshare");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(script.as_bytes())
        .expect("writing the script to sh");
    let out = child.wait_with_output().expect("waiting for unshare");
    for dir in mount_points() {
        if !before.contains(&dir) {
            let _ = std::fs::remove_dir(&dir);
        }
    }
    ScriptRun {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The `/tmp/overlay-root.*` directories that exist now.
fn mount_points() -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/tmp")
        .map(|dir| {
            dir.flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().starts_with("/tmp/overlay-root."))
                .collect()
        })
        .unwrap_or_default()
}
