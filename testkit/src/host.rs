//! What isolation tests check about host objects from outside: a process's cgroup limits,
//! whether another user can read a file, and which files a process maps.

use std::path::Path;

/// The value of `file` (e.g. `memory.limit_in_bytes`) in the cgroup `pid` belongs to for
/// `controller`, under the cgroup v1 hierarchy at `/sys/fs/cgroup/CONTROLLER`, or the
/// unified one (`file` named as in v2, e.g. `memory.max`).
pub fn cgroup_value(pid: u32, controller: &str, file: &str) -> Option<String> {
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
        let base = if names.split(',').any(|n| n == controller) {
            format!("/sys/fs/cgroup/{controller}")
        } else if names.is_empty() {
            "/sys/fs/cgroup/unified".to_string()
        } else {
            continue;
        };
        if let Ok(v) = std::fs::read_to_string(format!("{base}{path}/{file}")) {
            return Some(v.trim().to_string());
        }
    }
    None
}

/// True when `cat path` succeeds as `uid`/`gid` with supplementary `groups` (run through
/// `setpriv`, as a real process of that user would).
pub fn readable_as(uid: u32, gid: u32, groups: &[u32], path: &Path) -> bool {
    let groups = if groups.is_empty() {
        "--clear-groups".to_string()
    } else {
        format!(
            "--groups={}",
            groups
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            &groups,
            "cat",
        ])
        .arg(path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running setpriv (util-linux)")
        .success()
}

/// True when `pid` maps the file with inode number `ino` (`/proc/PID/maps`).
pub fn maps_inode(pid: u32, ino: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
        maps.lines()
            .any(|l| l.split_whitespace().nth(4) == Some(&ino.to_string()))
    })
}
