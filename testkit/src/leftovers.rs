//! What a process-engine daemon leaves on the host, counted so an attack test can show
//! the node is back where it started: processes (command lines naming its data dir, or
//! running as one of its sandbox uids), sandbox directories, sockets, and cgroups.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::procs::{self, procs_with};
use crate::wait::wait_until;

/// One look at the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Count {
    /// The daemon's sandbox processes (bwrap, silkd, what they started).
    pub processes: usize,
    /// `data_dir/sandboxes/*`.
    pub sandbox_dirs: usize,
    /// Sockets under `data_dir/sandboxes`.
    pub sockets: usize,
    /// Per-sandbox cgroups under the daemon's parent groups.
    pub cgroups: usize,
}

/// Counts one daemon's leftovers.
pub struct Census {
    data_dir: PathBuf,
    uids: Range<u32>,
    cgroup_parents: Vec<PathBuf>,
}

impl Census {
    /// For the daemon with `data_dir` whose sandboxes run as `uids`. Call it while one of
    /// its sandboxes runs: their cgroups tell where the daemon's parent groups are.
    pub fn new(data_dir: &Path, uids: Range<u32>) -> Census {
        let pid = *procs_with(&data_dir.to_string_lossy())
            .first()
            .expect("a running sandbox of this daemon");
        let cgroup_parents = cgroup_parents(pid);
        Census {
            data_dir: data_dir.to_path_buf(),
            uids,
            cgroup_parents,
        }
    }

    /// Counts now.
    pub fn count(&self) -> Count {
        let mut processes = procs_with(&self.data_dir.to_string_lossy());
        processes.extend(
            procs::pids()
                .filter(|&pid| procs::alive(pid))
                .filter(|&pid| {
                    procs::status_field(pid, "Uid:")
                        .is_some_and(|uid| self.uids.contains(&(uid as u32)))
                }),
        );
        processes.sort_unstable();
        processes.dedup();
        let dirs: Vec<PathBuf> = std::fs::read_dir(self.data_dir.join("sandboxes"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        let sockets = dirs
            .iter()
            .filter(|d| d.join("sock/silkd.sock").exists())
            .count();
        let cgroups = self
            .cgroup_parents
            .iter()
            .map(|p| {
                std::fs::read_dir(p)
                    .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
                    .unwrap_or(0)
            })
            .sum();
        Count {
            processes: processes.len(),
            sandbox_dirs: dirs.len(),
            sockets,
            cgroups,
        }
    }

    /// Waits (10 s at most) until the count equals `before`: teardown and pool refill
    /// settle on their own, then nothing extra may remain.
    pub async fn wait_back_to(&self, before: &Count) {
        wait_until(
            Duration::from_secs(10),
            "leftovers back to before",
            async || {
                let now = self.count();
                if now == *before {
                    Ok(())
                } else {
                    Err(format!("before {before:?}, now {now:?}"))
                }
            },
        )
        .await
    }
}

/// The parent groups (sandboxd's per-daemon groups, one per controller mount) of the
/// sandbox or VM process `pid`, from `/proc/PID/cgroup`; a pid in none of sandboxd's
/// groups fails the test.
pub fn cgroup_parents(pid: u32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let mut parents = Vec::new();
    for line in text.lines() {
        // "4:pids:/sandboxd/INSTANCE/ID" (v1) or "0::/sandboxd/INSTANCE/ID" (v2).
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        if !path.starts_with("/sandboxd/") {
            continue;
        }
        let mount = match controllers {
            // cgroup2: the whole tree on a pure v2 host, `unified` on a hybrid one.
            "" if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() => {
                PathBuf::from("/sys/fs/cgroup")
            }
            "" => PathBuf::from("/sys/fs/cgroup/unified"),
            c => Path::new("/sys/fs/cgroup").join(c),
        };
        let parent = Path::new(path).parent().unwrap().strip_prefix("/").unwrap();
        parents.push(mount.join(parent));
    }
    assert!(
        !parents.is_empty(),
        "pid {pid} in no sandboxd cgroup:\n{text}"
    );
    parents
}
