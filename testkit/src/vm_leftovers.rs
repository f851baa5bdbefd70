//! What a qemu-engine daemon leaves on the host, counted so a restart or fault test can
//! show the node is back where it started: QEMU processes (their `-name` names a run dir
//! under the data dir), run dirs and the sockets in them, files in the daemon's memory
//! dir (golden RAM), and the VMs' cgroups.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::leftovers::cgroup_parents;
use crate::procs::procs_with;
use crate::wait::wait_until;

/// One look at the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmCount {
    /// QEMU processes of the daemon.
    pub qemus: usize,
    /// `data_dir/qemu/run/*`.
    pub run_dirs: usize,
    /// Sockets in those run dirs (`silkd.sock`, `qmp.sock`).
    pub sockets: usize,
    /// Files under the memory dir (`memory_dir/sandboxd-*/*`).
    pub memory_files: usize,
    /// Per-VM cgroups under the daemon's parent groups, by name (one per VM, however
    /// many controller hierarchies hold it).
    pub cgroups: usize,
}

/// Counts one qemu-engine daemon's leftovers.
pub struct VmCensus {
    run_root: PathBuf,
    memory_dir: PathBuf,
    cgroup_parents: Vec<PathBuf>,
}

impl VmCensus {
    /// For the daemon with `data_dir` and `[qemu] memory_dir`. Call it while one of its
    /// VMs runs: its cgroups tell where the daemon's parent groups are.
    pub fn new(data_dir: &Path, memory_dir: &Path) -> VmCensus {
        let run_root = data_dir.join("qemu/run");
        let pid = *procs_with(&run_root.to_string_lossy())
            .first()
            .expect("a running VM of this daemon");
        VmCensus {
            run_root,
            memory_dir: memory_dir.to_path_buf(),
            cgroup_parents: cgroup_parents(pid),
        }
    }

    /// Counts now.
    pub fn count(&self) -> VmCount {
        let dirs: Vec<PathBuf> = entries(&self.run_root);
        let sockets = dirs
            .iter()
            .flat_map(|d| entries(d))
            .filter(|f| {
                std::fs::symlink_metadata(f)
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            })
            .count();
        let memory_files = entries(&self.memory_dir)
            .iter()
            .flat_map(|d| entries(d))
            .count();
        let cgroups: std::collections::BTreeSet<_> = self
            .cgroup_parents
            .iter()
            .flat_map(|p| entries(p))
            .filter(|e| e.is_dir())
            .filter_map(|e| e.file_name().map(|n| n.to_owned()))
            .collect();
        VmCount {
            qemus: procs_with(&self.run_root.to_string_lossy()).len(),
            run_dirs: dirs.len(),
            sockets,
            memory_files,
            cgroups: cgroups.len(),
        }
    }

    /// Waits (30 s at most: VM teardown and pool refill under TCG) until the count is
    /// `want`.
    pub async fn wait_for(&self, want: VmCount) {
        wait_until(
            Duration::from_secs(30),
            "VM leftovers as expected",
            async || {
                let now = self.count();
                if now == want {
                    Ok(())
                } else {
                    Err(format!("want {want:?}, now {now:?}"))
                }
            },
        )
        .await
    }
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}
