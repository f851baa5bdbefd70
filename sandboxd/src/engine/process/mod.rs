//! The `process` engine: each guest is silkd launched by bubblewrap in fresh user, mount,
//! pid, uts, ipc, net and cgroup namespaces (only `lo`), as an unprivileged host uid of its
//! own, over the template's rootfs read-only, with size-capped tmpfs `/home`, `/tmp`,
//! `/run` and `/dev/shm`, no capabilities, no_new_privs, a seccomp filter, and a
//! per-sandbox cgroup with cpu, memory and pids limits. The channel is a Unix socket in
//! the sandbox's directory, the only node object the sandbox can reach.
//!
//! This isolates much less than a VM: the guest shares the host kernel. Its "golden" is
//! only the warmup run plus the stamp the pool layer writes; clones are cold starts.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
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

mod adopt;
mod guest;
mod jail;
pub mod seccomp;
mod silkd_files;
mod snapshot;
mod userns;

use self::guest::ProcessGuest;
use self::jail::{Inputs, Plan, INFO_FD, SECCOMP_FDS, SOCK_NAME, STAGE_MOUNT, USERNS_FD};
use self::seccomp::Filters;
use self::silkd_files::SilkdFiles;
use super::cgroup::Cgroups;
use super::handle::PidFd;
use super::identity::Identities;
use super::{Engine, Fate, Guest, GuestHandle, GuestSpec};
use crate::config::ProcessConfig;
use crate::error::{Error, Result};

/// How long bwrap may take to report its child pid.
const INFO_FD_TIMEOUT: Duration = Duration::from_secs(5);

/// The engine; one per daemon.
pub struct ProcessEngine {
    bwrap: PathBuf,
    silkd: SilkdFiles,
    sandboxes_dir: PathBuf,
    boot_timeout: Duration,
    cgroups: Cgroups,
    /// `None` when sandboxd cannot switch users or `unsafe_no_identity` is set.
    identities: Option<Arc<Identities>>,
    /// `None` under `unsafe_no_seccomp`.
    seccomp: Option<Filters>,
    /// Opt-outs in force, said in `/v1/info`.
    weakened: Vec<String>,
}

impl ProcessEngine {
    /// Sets up the engine: checks the binaries, compiles the seccomp filter, probes cgroups
    /// (every limit must apply unless `allow_missing_cgroups`). What an earlier run left
    /// is re-adopted or swept later ([`Engine::adopt`], [`Engine::sweep`]).
    pub fn new(
        config: &ProcessConfig,
        silkd: PathBuf,
        data_dir: &Path,
        boot_timeout: Duration,
    ) -> Result<ProcessEngine> {
        if !silkd.is_file() {
            return Err(Error::Engine(format!(
                "silkd binary not found at {} (set silkd_path)",
                silkd.display()
            )));
        }
        let silkd = SilkdFiles::resolve(&silkd)?;
        let seccomp = (!config.unsafe_no_seccomp)
            .then(Filters::compile)
            .transpose()?;
        // A block of uids per sandbox, mapped into its user namespace (userns.rs).
        let identities = Identities::blocks(config.uid_base, config.uid_count, config.uid_block);
        let identities =
            (identities.switching() && !config.unsafe_no_identity).then_some(identities);
        if identities.is_some() {
            std::fs::create_dir_all(STAGE_MOUNT)
                .and_then(|()| {
                    std::fs::set_permissions(STAGE_MOUNT, std::fs::Permissions::from_mode(0o755))
                })
                .map_err(Error::io(format!("creating {STAGE_MOUNT}")))?;
        }
        let sandboxes_dir = data_dir.join("sandboxes");
        // One cgroup group per data_dir: stale-group cleanup stays within this daemon's.
        let instance =
            hex::encode(&sha2::Sha256::digest(data_dir.as_os_str().as_encoded_bytes())[..6]);
        let cgroups = Cgroups::probe(&config.cgroup_root, &instance);
        if !cgroups.warnings().is_empty() && !config.allow_missing_cgroups {
            cgroups.remove_parents();
            return Err(Error::Engine(format!(
                "process engine: refusing to start sandboxes without every cgroup limit: {}. \
                 Fix the host's cgroups (docs/deploy.md), or set [process] \
                 allow_missing_cgroups = true to run without them (one sandbox can then \
                 starve the node)",
                cgroups.warnings().join("; ")
            )));
        }
        // What an earlier run left is swept after re-adoption (`sweep`), not here.
        std::fs::create_dir_all(&sandboxes_dir)
            .map_err(Error::io(format!("creating {}", sandboxes_dir.display())))?;
        std::fs::set_permissions(&sandboxes_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(Error::io(format!("chmod {}", sandboxes_dir.display())))?;
        for w in cgroups.warnings() {
            tracing::warn!("process engine: {w}");
        }
        let mut weakened: Vec<String> = config
            .weakened()
            .into_iter()
            .map(|key| format!("process engine: [process] {key} is set, weakening isolation"))
            .collect();
        if identities.is_none() && !config.unsafe_no_identity {
            weakened.push(
                "process engine: sandboxd is not root, so every sandbox runs as its user".into(),
            );
        }
        for w in &weakened {
            tracing::warn!("{w}");
        }
        Ok(ProcessEngine {
            bwrap: config.bwrap.clone(),
            silkd,
            sandboxes_dir,
            boot_timeout,
            cgroups,
            identities,
            seccomp,
            weakened,
        })
    }

    async fn launch(&self, spec: &GuestSpec) -> Result<Arc<dyn Guest>> {
        let id = random_id();
        let dir = self.sandboxes_dir.join(&id);
        let identity = self.identities.as_ref().map(|ids| ids.take()).transpose()?;
        let io = |what: &str| Error::io(format!("{what} {}", dir.display()));
        std::fs::create_dir(&dir).map_err(io("creating"))?;
        let sock = dir.join("sock");
        std::fs::create_dir(&sock).map_err(io("creating sock in"))?;
        if let Some(who) = &identity {
            // The socket directory is the one node path the sandbox writes: its own.
            nix::unistd::chown(
                &sock,
                Some(nix::unistd::Uid::from_raw(who.uid())),
                Some(nix::unistd::Gid::from_raw(who.gid())),
            )
            .map_err(|e| Error::Engine(format!("chown {}: {e}", sock.display())))?;
        }
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o700))
            .map_err(io("chmod sock in"))?;
        let (exited_tx, exited) = watch::channel(false);
        let ids = identity.as_ref().map(|i| (i.uid(), i.gid()));
        let block = identity.as_ref().map(|i| (i.uid(), i.gid(), i.block_len()));
        let guest = ProcessGuest {
            id: id.clone(),
            socket: sock.join(SOCK_NAME),
            dir: dir.clone(),
            cgroup: Mutex::new(None),
            pids: Mutex::new((None, None)),
            handle: Mutex::new(None),
            kept: AtomicBool::new(false),
            fate: Fate::new(),
            exited,
            supervised: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
            _identity: identity,
        };
        // From here on, dropping `guest` on an error path kills whatever was started.
        let (cgroup, procs) = self
            .cgroups
            .create(&id, &spec.size_config)
            .map_err(Error::io(format!("creating cgroup for {id}")))?;
        // Only a sandbox with an identity of its own gets its cgroup2 directory: as
        // sandboxd's own user, the delegate would be sandboxd.
        let cgroup2 = match ids {
            Some((uid, gid)) => cgroup
                .delegate(uid, gid)
                .map_err(Error::io(format!("delegating the cgroup of {id}")))?
                .map(Path::to_path_buf),
            None => None,
        };
        *guest.cgroup.lock().expect("cgroup lock") = Some(cgroup);
        let plan = Plan::new(&Inputs {
            id: &id,
            dir: &dir,
            rootfs: &spec.template_config.rootfs,
            silkd: &self.silkd,
            tmpfs_bytes: spec.size_config.disk_mib * 1024 * 1024,
            identity: ids,
            seccomp: self.seccomp.is_some(),
            cgroup2: cgroup2.as_deref(),
            meta: &spec.template_config.meta,
            detach_ring: spec.template_config.detach_ring_bytes,
            // SAFETY: geteuid has no failure mode and no side effect.
            root: unsafe { libc::geteuid() } == 0,
        })
        .map_err(|e| {
            Error::Engine(format!(
                "reading rootfs {}: {e}",
                spec.template_config.rootfs.display()
            ))
        })?;

        let log = std::fs::File::create(dir.join("log"))
            .map_err(Error::io(format!("creating {}/log", dir.display())))?;
        let (info_read, info_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| Error::Engine(format!("pipe: {e}")))?;
        let userns = match block {
            Some((uid, gid, len)) => Some(
                tokio::task::spawn_blocking(move || userns::prepare(uid, gid, len))
                    .await
                    .map_err(|e| Error::Engine(format!("user namespace task: {e}")))?
                    .map_err(|e| {
                        Error::Engine(format!("user namespace for uids {uid}+{len}: {e}"))
                    })?,
            ),
            None => None,
        };
        let seccomp_fds = match &self.seccomp {
            Some(f) => f.memfds().map_err(Error::io("seccomp memfd"))?,
            None => Vec::new(),
        };
        // Above every fd number the child dup2s onto, so no dup2 clobbers a later source.
        let info_write = above_targets(info_write)?;
        let seccomp_fds = seccomp_fds
            .into_iter()
            .map(above_targets)
            .collect::<Result<Vec<_>>>()?;
        let userns = userns.map(above_targets).transpose()?;
        let mut cmd = std::process::Command::new(&self.bwrap);
        cmd.args(&plan.args)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().map_err(Error::io("dup log"))?)
            .stderr(log);
        let info_fd = info_write.as_raw_fd();
        let seccomp_raw: Vec<i32> = seccomp_fds.iter().map(|f| f.as_raw_fd()).collect();
        let procs_fds: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
        let userns_fd = userns.as_ref().map(|f| f.as_raw_fd());
        let stage = plan.stage;
        // SAFETY: between fork and exec only async-signal-safe calls (write, dup2, and the
        // stage's raw syscalls) run, on fds and C strings made before the fork; nothing
        // allocates.
        unsafe {
            cmd.pre_exec(move || {
                // A session of its own: the sandbox outlives sandboxd (a restart re-adopts
                // it), so nothing aimed at sandboxd's session or group may reach it.
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Join the sandbox's cgroups before bwrap forks, so every process it
                // creates is inside from its first instruction.
                for fd in &procs_fds {
                    if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for (from, to) in std::iter::once(&info_fd)
                    .zip([INFO_FD])
                    .chain(seccomp_raw.iter().zip(SECCOMP_FDS))
                    .chain(userns_fd.iter().zip([USERNS_FD]))
                {
                    if libc::dup2(*from, to) != to {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // Last: staging needs root, and after it the child is the sandbox's uid.
                if let Some(stage) = &stage {
                    stage.enter()?;
                }
                Ok(())
            });
        }
        // Not killed with its handle: a sandbox left running on stop outlives it; every
        // other path destroys the guest (or its Drop kills it).
        let child = Command::from(cmd)
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| Error::Engine(format!("spawning {}: {e}", self.bwrap.display())))?;
        drop(info_write);
        drop(seccomp_fds);
        drop(userns);
        drop(procs);
        // Our unreaped child: its pid cannot be reused before the supervisor waits for it.
        let bwrap = child.id().map(|p| PidFd::own(p as i32));
        guest.supervise(child, exited_tx);
        let bwrap = match bwrap {
            Some(Ok(b)) => b,
            Some(Err(e)) => return Err(guest.failed(format!("bwrap pidfd: {e}")).await),
            None => return Err(guest.failed("bwrap exited at once".into()).await),
        };
        let bwrap_pid = bwrap.0.pid();
        guest.pids.lock().expect("pids lock").0 = Some(bwrap.0);
        let ns_init = tokio::time::timeout(INFO_FD_TIMEOUT, read_child_pid(info_read)).await;
        let init = match ns_init {
            // bwrap's child, and bwrap is alive and ours: the pid is the init's.
            Ok(Ok(pid)) => PidFd::own(pid),
            Ok(Err(e)) => return Err(guest.failed(format!("bwrap info: {e}")).await),
            Err(_) => return Err(guest.failed("bwrap did not report its child".into()).await),
        };
        let init = match init {
            Ok(i) => i,
            Err(e) => return Err(guest.failed(format!("namespace init: {e}")).await),
        };
        let init_rec = (init.0.pid(), init.1);
        guest.pids.lock().expect("pids lock").1 = Some(init.0);
        guest.wait_socket(self.boot_timeout).await?;
        let cgroups = guest
            .cgroup
            .lock()
            .expect("cgroup lock")
            .as_ref()
            .map(|c| c.dirs().to_vec())
            .unwrap_or_default();
        *guest.handle.lock().expect("handle lock") = Some(GuestHandle {
            engine: "process".into(),
            guest_id: id,
            run_dir: dir,
            pid: bwrap_pid,
            start_time: bwrap.1,
            init: Some(init_rec),
            uid: ids.map(|(uid, _)| uid),
            cgroups,
        });
        Ok(Arc::new(guest))
    }
}

/// `fd` moved to a number above the ones the child dup2s onto.
fn above_targets(fd: OwnedFd) -> Result<OwnedFd> {
    let high = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))
        .map_err(|e| Error::Engine(format!("dup: {e}")))?;
    // SAFETY: fcntl just returned this fd, and nothing else owns it.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(high) })
}

impl Engine for ProcessEngine {
    fn snapshot<'a>(
        &'a self,
        _spec: &'a GuestSpec,
        guest: &'a dyn Guest,
        dir: &'a Path,
        resume: bool,
    ) -> BoxFuture<'a, Result<super::Captured>> {
        Box::pin(async move {
            if !resume {
                return Err(Error::Conflict(
                    "the process engine cannot hibernate: its sandboxes are processes with no                      memory image to write out, so nothing would be freed"
                        .into(),
                ));
            }
            snapshot::capture(guest, dir).await
        })
    }

    fn restore<'a>(
        &'a self,
        spec: &'a GuestSpec,
        dir: &'a Path,
        _hostname: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(async move {
            let guest = self.start(spec).await?;
            if let Err(e) = snapshot::unpack(&*guest, dir).await {
                guest.destroy().await;
                return Err(e);
            }
            Ok(guest)
        })
    }

    fn info(&self) -> api::EngineInfo {
        let mut warnings = self.cgroups.warnings().to_vec();
        warnings.extend(self.weakened.iter().cloned());
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
        let meta = std::fs::metadata(&self.silkd.binary)
            .map_err(Error::io(format!("stat {}", self.silkd.binary.display())))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Ok(format!(
            "bwrap={} silkd={} silkd_len={} silkd_mtime={mtime} rootfs={} template={:?}",
            self.bwrap.display(),
            self.silkd.binary.display(),
            meta.len(),
            spec.template_config.rootfs.display(),
            // The template's user, workdir and env decide how the warmup runs (and its
            // ring size is part of the template's silkd).
            spec.template_config.silkd_args()
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

    fn adopt<'a>(&'a self, handle: &'a GuestHandle) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(async move { self.adopt_guest(handle).map(|g| g as Arc<dyn Guest>) })
    }

    fn sweep(&self, keep: &[GuestHandle]) {
        let cgroups: Vec<PathBuf> = keep.iter().flat_map(|h| h.cgroups.clone()).collect();
        self.cgroups.remove_stale_except(&cgroups);
        let Ok(entries) = std::fs::read_dir(&self.sandboxes_dir) else {
            return;
        };
        for e in entries.flatten() {
            if !keep.iter().any(|h| h.run_dir == e.path()) {
                tracing::warn!(dir = %e.path().display(), "removing a sandbox dir no record owns");
                if let Err(err) = std::fs::remove_dir_all(e.path()) {
                    tracing::warn!(dir = %e.path().display(), "cannot remove: {err}");
                }
            }
        }
    }

    fn shutdown(&self, kept: bool) {
        if !kept {
            self.cgroups.remove_parents();
        }
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
