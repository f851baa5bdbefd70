//! A fresh cgroup2 directory for one test, under the host's cgroup2 mount (found in
//! `/proc/mounts`: `/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified` on a
//! hybrid one). Dropping it kills whatever is still inside and removes it and every
//! cgroup created in it, even when the test panics.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A cgroup2 directory owned by one test.
pub struct Cgroup2Dir {
    path: PathBuf,
}

/// Where cgroup2 is mounted on this host, if anywhere.
pub fn mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
    })
}

impl Cgroup2Dir {
    /// Creates `<cgroup2 mount>/testkit-<name>-<pid>`; panics, naming the fix, when the host
    /// has no writable cgroup2 mount (the tests run as root).
    pub fn fresh(name: &str) -> Cgroup2Dir {
        let root = mount().expect(
            "no cgroup2 mount in /proc/mounts: mount one (mount -t cgroup2 none /sys/fs/cgroup/unified)",
        );
        let path = root.join(format!("testkit-{name}-{}", std::process::id()));
        // A crashed earlier run with the same pid may have left it.
        if path.exists() {
            remove_tree(&path);
        }
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("creating {} (run as root): {e}", path.display()));
        Cgroup2Dir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cgroups created inside it (one level).
    pub fn children(&self) -> Vec<PathBuf> {
        children(&self.path)
    }

    /// Every pid in it and in the cgroups below it.
    pub fn pids(&self) -> Vec<u32> {
        let mut out = Vec::new();
        collect_pids(&self.path, &mut out);
        out
    }
}

impl Drop for Cgroup2Dir {
    fn drop(&mut self) {
        remove_tree(&self.path);
    }
}

fn children(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

fn collect_pids(dir: &Path, out: &mut Vec<u32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    for child in children(dir) {
        collect_pids(&child, out);
    }
}

/// Kills everything in `dir` and below, then removes the cgroups bottom up. The kernel
/// refuses to remove a cgroup until its killed processes are gone: a few ms, bounded.
fn remove_tree(dir: &Path) {
    for child in children(dir) {
        remove_tree(&child);
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if Instant::now() > deadline => {
                eprintln!("testkit: could not remove {}: {e}", dir.display());
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
