//! Per-sandbox cgroups for the process engine: cpu, memory and pids limits, and "kill every
//! process in this sandbox". v2 where the host runs the unified hierarchy, v1 per controller
//! otherwise; whatever cannot be applied becomes a plain warning for `/v1/info`.
//!
//! Each sandbox's cgroup2 directory (its v2 group, or on a hybrid host a group in the
//! `unified` hierarchy, which carries no limits) can be delegated to the sandbox's uid:
//! silkd then runs each command in a child cgroup of it and kills the cgroup, so a
//! command's `setsid` escapees die with it.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::config::SizeConfig;

/// Our top group under each hierarchy; each daemon (data_dir) gets its own group below it,
/// so cleaning up after a crash never touches another daemon's sandboxes.
const TOP: &str = "sandboxd";
const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];
/// CFS period; the quota is `cpus` times this.
const CPU_PERIOD_US: u64 = 100_000;

/// Where each controller lives on this host, found once at engine start.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// (controller, our parent directory, hierarchy version).
    places: Vec<(&'static str, PathBuf, Version)>,
    warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// One sandbox's groups (one directory per v1 controller, or one v2 directory).
#[derive(Debug, Clone)]
pub struct Cgroup {
    dirs: Vec<PathBuf>,
    /// The cgroup2 directory among `dirs`, if the host has a cgroup2 hierarchy.
    v2: Option<PathBuf>,
}

impl Cgroups {
    /// Finds the hierarchies under `root` and creates this daemon's parent groups
    /// (`sandboxd/INSTANCE`) in them.
    pub fn probe(root: &Path, instance: &str) -> Cgroups {
        let mut places = Vec::new();
        let mut warnings = Vec::new();
        let unified = root.join("cgroup.controllers");
        if let Ok(available) = fs::read_to_string(&unified) {
            let parent = root.join(TOP).join(instance);
            let enabled = fs::create_dir_all(&parent).and_then(|()| {
                let wanted: Vec<String> = CONTROLLERS
                    .iter()
                    .filter(|c| available.split_whitespace().any(|a| a == **c))
                    .map(|c| format!("+{c}"))
                    .collect();
                // Controllers must be enabled at every level down to our groups.
                for dir in [root, root.join(TOP).as_path(), parent.as_path()] {
                    fs::write(dir.join("cgroup.subtree_control"), wanted.join(" "))?;
                }
                fs::read_to_string(parent.join("cgroup.subtree_control"))
            });
            match enabled {
                Ok(on) => {
                    for c in CONTROLLERS {
                        if on.split_whitespace().any(|a| a == c) {
                            places.push((c, parent.clone(), Version::V2));
                        } else {
                            warnings.push(format!(
                                "no {c} limit: the cgroup v2 {c} controller is not available"
                            ));
                        }
                    }
                }
                Err(e) => warnings.push(format!(
                    "no cpu, memory or pids limits: cannot set up cgroup v2 group {}: {e}",
                    parent.display()
                )),
            }
            return Cgroups { places, warnings };
        }
        for c in CONTROLLERS {
            let mount = root.join(c);
            if !mount.join("cgroup.procs").exists() {
                warnings.push(format!(
                    "no {c} limit: no cgroup v1 {c} hierarchy at {}",
                    mount.display()
                ));
                continue;
            }
            let parent = mount.join(TOP).join(instance);
            match fs::create_dir_all(&parent) {
                Ok(()) => places.push((c, parent, Version::V1)),
                Err(e) => warnings.push(format!(
                    "no {c} limit: cannot create {}: {e}",
                    parent.display()
                )),
            }
        }
        // A hybrid host's cgroup2 hierarchy holds no controllers, but it is where silkd can
        // give each command a cgroup of its own (optional: without it kills reach process
        // groups only).
        let unified = root.join("unified");
        if unified.join("cgroup.procs").exists() {
            let parent = unified.join(TOP).join(instance);
            if fs::create_dir_all(&parent).is_ok() {
                places.push(("cgroup2", parent, Version::V2));
            }
        }
        Cgroups { places, warnings }
    }

    /// Limits this host cannot apply, said plainly.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Creates the groups for one sandbox with `size`'s limits. Returns the groups and
    /// their `cgroup.procs` files opened for writing, so the launcher can move its child in
    /// before exec (writing "0" moves the writer).
    pub fn create(&self, id: &str, size: &SizeConfig) -> std::io::Result<(Cgroup, Vec<File>)> {
        let mut group = Cgroup {
            dirs: Vec::new(),
            v2: None,
        };
        let mut procs = Vec::new();
        for (controller, parent, version) in &self.places {
            let dir = parent.join(id);
            if !group.dirs.contains(&dir) {
                fs::create_dir(&dir)?;
                group.dirs.push(dir.clone());
                if *version == Version::V2 {
                    group.v2 = Some(dir.clone());
                }
                procs.push(
                    OpenOptions::new()
                        .write(true)
                        .open(dir.join("cgroup.procs"))?,
                );
            }
            for (file, value) in limit_files(controller, *version, size) {
                fs::write(dir.join(file), value)?;
            }
        }
        Ok((group, procs))
    }

    /// The group of sandbox `id` found again after a restart: `dirs` must be exactly
    /// the directories [`Cgroups::create`] makes for `id` under this daemon's parents and
    /// exist, or it is not provably ours and `None` is returned.
    pub fn reopen(&self, id: &str, dirs: &[PathBuf]) -> Option<Cgroup> {
        let mut expected: Vec<PathBuf> = Vec::new();
        let mut v2 = None;
        for (_, parent, version) in &self.places {
            let dir = parent.join(id);
            if !expected.contains(&dir) {
                if *version == Version::V2 {
                    v2 = Some(dir.clone());
                }
                expected.push(dir);
            }
        }
        let same = expected.len() == dirs.len() && expected.iter().all(|d| dirs.contains(d));
        (same && expected.iter().all(|d| d.is_dir())).then_some(Cgroup { dirs: expected, v2 })
    }

    /// Removes this daemon's (empty) parent groups.
    pub fn remove_parents(&self) {
        for (_, parent, _) in &self.places {
            // Shared by several controllers under v2; NotFound on the second try is fine.
            let _ = fs::remove_dir(parent);
        }
    }

    /// Kills and removes groups left by an earlier run (crash, SIGKILL).
    pub fn remove_stale(&self) {
        self.remove_stale_except(&[]);
    }

    /// Kills and removes groups left by an earlier run, but those in `keep` (the groups
    /// of re-adopted sandboxes).
    pub fn remove_stale_except(&self, keep: &[PathBuf]) {
        for (_, parent, _) in &self.places {
            let Ok(entries) = fs::read_dir(parent) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.path().is_dir() && !keep.contains(&entry.path()) {
                    tracing::warn!(cgroup = %entry.path().display(), "killing and removing a cgroup no record owns");
                    let stale = Cgroup {
                        dirs: vec![entry.path()],
                        v2: None,
                    };
                    stale.kill_all();
                    stale.remove();
                }
            }
        }
    }
}

fn limit_files(
    controller: &str,
    version: Version,
    size: &SizeConfig,
) -> Vec<(&'static str, String)> {
    let memory = size.memory_mib * 1024 * 1024;
    let quota = u64::from(size.cpus) * CPU_PERIOD_US;
    match (controller, version) {
        ("memory", Version::V1) => vec![("memory.limit_in_bytes", memory.to_string())],
        ("memory", Version::V2) => vec![("memory.max", memory.to_string())],
        ("cpu", Version::V1) => vec![
            ("cpu.cfs_period_us", CPU_PERIOD_US.to_string()),
            ("cpu.cfs_quota_us", quota.to_string()),
        ],
        ("cpu", Version::V2) => vec![("cpu.max", format!("{quota} {CPU_PERIOD_US}"))],
        ("pids", _) => vec![("pids.max", size.max_pids.to_string())],
        _ => Vec::new(),
    }
}

impl Cgroup {
    /// Hands the cgroup2 directory to `uid`/`gid` (the directory and the files a delegate
    /// writes: `cgroup.procs`, `cgroup.threads`, `cgroup.subtree_control`), so the sandbox
    /// can make child cgroups and move its processes between them, never above. Limits stay
    /// root's. Returns the directory, or `None` on a host without cgroup2.
    pub fn delegate(&self, uid: u32, gid: u32) -> std::io::Result<Option<&Path>> {
        let Some(dir) = &self.v2 else {
            return Ok(None);
        };
        let owner = (Some(uid), Some(gid));
        std::os::unix::fs::chown(dir, owner.0, owner.1)?;
        for file in ["cgroup.procs", "cgroup.threads", "cgroup.subtree_control"] {
            let path = dir.join(file);
            if path.exists() {
                std::os::unix::fs::chown(&path, owner.0, owner.1)?;
            }
        }
        Ok(Some(dir))
    }

    /// The group's directories, one per hierarchy.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Every directory of the groups, children (a delegate's) before their parents.
    fn tree(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            if let Ok(entries) = fs::read_dir(dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        walk(&e.path(), out);
                    }
                }
            }
            out.push(dir.to_path_buf());
        }
        let mut out = Vec::new();
        for dir in &self.dirs {
            walk(dir, &mut out);
        }
        out
    }

    /// Pids currently in any of the groups or their children.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for dir in self.tree() {
            if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// SIGKILLs every process in the groups.
    pub fn kill_all(&self) {
        for dir in &self.dirs {
            // cgroup v2 (5.14+) kills the whole subtree atomically, forks included.
            if let Ok(mut f) = OpenOptions::new().write(true).open(dir.join("cgroup.kill")) {
                let _ = f.write_all(b"1");
            }
        }
        for pid in self.pids() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }

    /// Removes the groups, waiting briefly for dying processes to leave them.
    pub fn remove(&self) {
        for _ in 0..200 {
            if self.pids().is_empty() {
                break;
            }
            self.kill_all();
            std::thread::sleep(Duration::from_millis(5));
        }
        for dir in self.tree() {
            if let Err(e) = fs::remove_dir(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %dir.display(), "cannot remove cgroup: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size() -> SizeConfig {
        SizeConfig {
            cpus: 2,
            memory_mib: 256,
            max_pids: 64,
            disk_mib: 64,
        }
    }

    #[test]
    fn limits_per_version() {
        let v1 = limit_files("cpu", Version::V1, &size());
        assert_eq!(v1[1], ("cpu.cfs_quota_us", "200000".into()));
        let v2 = limit_files("cpu", Version::V2, &size());
        assert_eq!(v2, vec![("cpu.max", "200000 100000".into())]);
        assert_eq!(
            limit_files("memory", Version::V2, &size()),
            vec![("memory.max", (256u64 << 20).to_string())]
        );
        assert_eq!(
            limit_files("pids", Version::V1, &size()),
            vec![("pids.max", "64".into())]
        );
    }

    #[test]
    fn missing_hierarchies_become_warnings() {
        let root = tempfile::tempdir().unwrap();
        let found = Cgroups::probe(root.path(), "test");
        assert!(found.places.is_empty());
        assert_eq!(found.warnings().len(), 3, "{:?}", found.warnings());
        assert!(found.warnings()[1].contains("memory"));
    }
}
