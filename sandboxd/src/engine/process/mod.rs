//! The `process` engine: each guest is silkd launched by bubblewrap in fresh mount, pid,
//! uts, ipc and net namespaces (only `lo`), over the template's rootfs read-only, with a
//! private `/tmp`, `/run` and `/home`, a writable work dir, no capabilities, no_new_privs,
//! and a per-sandbox cgroup. The channel is a Unix socket in the sandbox's directory.
//!
//! This isolates much less than a VM: the guest shares the host kernel. Its "golden" is
//! only the warmup run plus the stamp the pool layer writes; clones are cold starts.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rand::RngCore;
use sha2::Digest;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::sync::watch;

mod guest;

use self::guest::ProcessGuest;
use super::cgroup::Cgroups;
use super::{Engine, Fate, Guest, GuestSpec};
use crate::error::{Error, Result};

/// Inside the sandbox: the directory holding silkd's socket, and the socket.
const SOCK_DIR: &str = "/run/silkd";
const SOCK_NAME: &str = "silkd.sock";
/// Inside the sandbox: silkd's binary, bound read-only so any rootfs can run it.
const SILKD_IN_GUEST: &str = "/run/silkd.bin";
/// Inside the sandbox: the writable work directory and HOME.
const WORK_DIR: &str = "/home/sandbox";
/// How long bwrap may take to report its child pid.
const INFO_FD_TIMEOUT: Duration = Duration::from_secs(5);

/// The engine; one per daemon.
pub struct ProcessEngine {
    bwrap: PathBuf,
    silkd: PathBuf,
    sandboxes_dir: PathBuf,
    boot_timeout: Duration,
    cgroups: Cgroups,
}

impl ProcessEngine {
    /// Sets up the engine: checks the binaries, probes cgroups, and clears what an earlier
    /// run may have left (sandbox directories, cgroups with processes in them).
    pub fn new(
        bwrap: PathBuf,
        silkd: PathBuf,
        data_dir: &Path,
        cgroup_root: &Path,
        boot_timeout: Duration,
    ) -> Result<ProcessEngine> {
        if !silkd.is_file() {
            return Err(Error::Engine(format!(
                "silkd binary not found at {} (set silkd_path)",
                silkd.display()
            )));
        }
        let sandboxes_dir = data_dir.join("sandboxes");
        // One cgroup group per data_dir: stale-group cleanup stays within this daemon's.
        let instance =
            hex::encode(&sha2::Sha256::digest(data_dir.as_os_str().as_encoded_bytes())[..6]);
        let cgroups = Cgroups::probe(cgroup_root, &instance);
        cgroups.remove_stale();
        if sandboxes_dir.exists() {
            std::fs::remove_dir_all(&sandboxes_dir)
                .map_err(Error::io(format!("clearing {}", sandboxes_dir.display())))?;
        }
        std::fs::create_dir_all(&sandboxes_dir)
            .map_err(Error::io(format!("creating {}", sandboxes_dir.display())))?;
        for w in cgroups.warnings() {
            tracing::warn!("process engine: {w}");
        }
        Ok(ProcessEngine {
            bwrap,
            silkd,
            sandboxes_dir,
            boot_timeout,
            cgroups,
        })
    }

    /// bwrap's arguments for one sandbox, up to and including silkd's.
    fn bwrap_args(&self, rootfs: &Path, dir: &Path, id: &str) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        let mut push = |items: &[&std::ffi::OsStr]| args.extend(items.iter().map(|s| s.into()));
        let os = |s: &'static str| std::ffi::OsStr::new(s);
        push(&[
            os("--die-with-parent"),
            os("--new-session"),
            os("--unshare-all"),
            os("--cap-drop"),
            os("ALL"),
            os("--ro-bind"),
            rootfs.as_os_str(),
            os("/"),
            os("--proc"),
            os("/proc"),
            os("--dev"),
            os("/dev"),
            os("--tmpfs"),
            os("/tmp"),
            os("--tmpfs"),
            os("/run"),
            os("--tmpfs"),
            os("/home"),
            os("--bind"),
        ]);
        let sock = dir.join("sock");
        let work = dir.join("work");
        let hostname = format!("sbx-{}", &id[..id.len().min(12)]);
        push(&[
            sock.as_os_str(),
            os(SOCK_DIR),
            os("--bind"),
            work.as_os_str(),
        ]);
        push(&[
            os(WORK_DIR),
            os("--ro-bind"),
            self.silkd.as_os_str(),
            os(SILKD_IN_GUEST),
        ]);
        push(&[
            os("--hostname"),
            std::ffi::OsStr::new(&hostname),
            os("--chdir"),
            os(WORK_DIR),
            os("--setenv"),
            os("HOME"),
            os(WORK_DIR),
            os("--info-fd"),
            os("3"),
            os("--"),
            os(SILKD_IN_GUEST),
            os("--listen"),
        ]);
        args.push(format!("unix:{SOCK_DIR}/{SOCK_NAME}").into());
        args
    }

    async fn launch(&self, spec: &GuestSpec) -> Result<Arc<dyn Guest>> {
        let id = random_id();
        let dir = self.sandboxes_dir.join(&id);
        for sub in ["sock", "work"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(Error::io(format!("creating {}", dir.display())))?;
        }
        let (exited_tx, exited) = watch::channel(false);
        let guest = ProcessGuest {
            id: id.clone(),
            socket: dir.join("sock").join(SOCK_NAME),
            dir: dir.clone(),
            cgroup: Mutex::new(None),
            pids: Mutex::new((None, None)),
            fate: Fate::new(),
            exited,
            supervised: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
        };
        // From here on, dropping `guest` on an error path kills whatever was started.
        let (cgroup, procs) = self
            .cgroups
            .create(&id, &spec.size_config)
            .map_err(Error::io(format!("creating cgroup for {id}")))?;
        *guest.cgroup.lock().expect("cgroup lock") = Some(cgroup);

        let log = std::fs::File::create(dir.join("log"))
            .map_err(Error::io(format!("creating {}/log", dir.display())))?;
        let (info_read, info_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| Error::Engine(format!("pipe: {e}")))?;
        let mut cmd = std::process::Command::new(&self.bwrap);
        cmd.args(self.bwrap_args(&spec.template_config.rootfs, &dir, &id))
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().map_err(Error::io("dup log"))?)
            .stderr(log);
        let info_fd = info_write.as_raw_fd();
        let procs_fds: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
        // SAFETY: between fork and exec only async-signal-safe calls (write, dup2) run,
        // on fds opened before the fork; nothing allocates.
        unsafe {
            cmd.pre_exec(move || {
                // Join the sandbox's cgroups before bwrap forks, so every process it
                // creates is inside from its first instruction.
                for fd in &procs_fds {
                    if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if libc::dup2(info_fd, 3) != 3 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = Command::from(cmd)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Engine(format!("spawning {}: {e}", self.bwrap.display())))?;
        drop(info_write);
        drop(procs);
        guest.pids.lock().expect("pids lock").0 = child.id().map(|p| p as i32);
        guest.supervise(child, exited_tx);

        let ns_init = tokio::time::timeout(INFO_FD_TIMEOUT, read_child_pid(info_read)).await;
        match ns_init {
            Ok(Ok(pid)) => guest.pids.lock().expect("pids lock").1 = Some(pid),
            Ok(Err(e)) => return Err(guest.failed(format!("bwrap info: {e}")).await),
            Err(_) => return Err(guest.failed("bwrap did not report its child".into()).await),
        }
        guest.wait_socket(self.boot_timeout).await?;
        Ok(Arc::new(guest))
    }
}

impl Engine for ProcessEngine {
    fn info(&self) -> api::EngineInfo {
        let mut warnings = self.cgroups.warnings().to_vec();
        warnings.push(
            "process engine: sandboxes share the host kernel and isolate much less than VMs".into(),
        );
        api::EngineInfo {
            name: "process".into(),
            accelerator: None,
            warnings,
        }
    }

    fn golden_inputs(&self, spec: &GuestSpec) -> Result<String> {
        let meta = std::fs::metadata(&self.silkd)
            .map_err(Error::io(format!("stat {}", self.silkd.display())))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Ok(format!(
            "bwrap={} silkd={} silkd_len={} silkd_mtime={mtime} rootfs={}",
            self.bwrap.display(),
            self.silkd.display(),
            meta.len(),
            spec.template_config.rootfs.display()
        ))
    }

    fn golden_present(&self, _spec: &GuestSpec) -> bool {
        // Nothing but the stamp persists for this engine.
        true
    }

    fn boot_golden<'a>(&'a self, spec: &'a GuestSpec) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(self.launch(spec))
    }

    fn seal_golden<'a>(
        &'a self,
        _spec: &'a GuestSpec,
        guest: Arc<dyn Guest>,
    ) -> BoxFuture<'a, Result<()>> {
        // No snapshot: the warmup proved the template runs; clones start cold.
        Box::pin(async move {
            guest.destroy().await;
            Ok(())
        })
    }

    fn start<'a>(&'a self, spec: &'a GuestSpec) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(self.launch(spec))
    }

    fn shutdown(&self) {
        self.cgroups.remove_parents();
    }
}

/// Reads bwrap's `--info-fd` JSON up to its closing brace and returns `child-pid`, the
/// host pid of the sandbox's pid-namespace init: killing it kills the whole namespace.
async fn read_child_pid(fd: OwnedFd) -> std::io::Result<i32> {
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 256];
    while !buf.contains(&b'}') {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let info: serde_json::Value = serde_json::from_slice(&buf).map_err(|e| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{e}: {buf:?}"))
    })?;
    info["child-pid"]
        .as_i64()
        .map(|p| p as i32)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no child-pid"))
}

fn random_id() -> String {
    let mut bytes = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}
