//! The `qemu` engine: every guest is a real VM. QEMU from Debian, TCG or KVM, guest RAM
//! of a golden in a shared memory file, clones restored copy-on-write from it.
//!
//! - Golden: boot with RAM in a `share=on` memory-backend file, (the pool layer runs the
//!   warmup), then `seal_golden` saves the device state with `x-ignore-shared` after
//!   raising `max-bandwidth`, and the golden QEMU is killed for good.
//! - Clone: a new QEMU maps the golden file private and read-only with `-incoming
//!   defer`, `migrate-incoming`, `cont`, then the channel handshake reseeds clock,
//!   entropy and hostname. Nothing can write to or punch a hole in the golden file, and
//!   nothing ever inflates a balloon or enables free-page reporting (both discard RAM).
//! - Cold boot: the fallback while no golden exists.
//! - Supervision: a QEMU that exits on its own marks its guest failed with the reason
//!   and the tail of its console.
//! - Restarts: QEMU runs in its own session and outlives sandboxd; a claimed VM's record
//!   ([`GuestHandle`]) lets the next start re-adopt it and re-dial its channel socket
//!   (`adopt.rs`), which also sweeps every VM no record owns.
//! - Confinement: every QEMU runs under its own uid (when sandboxd is root), with
//!   QEMU's seccomp filter, in its own cgroup (guest RAM + [`QEMU_OVERHEAD_MIB`], pids),
//!   and opens nothing of ours by path: its sockets, files and console are fds sandboxd
//!   made in directories only sandboxd can open (`spawn.rs`, `private.rs`).
//! - Golden files: written by the golden's QEMU (its uid owns them while it runs), then
//!   handed back to sandboxd, mode 0440, group [`QemuEngine::readers_gid`]: every clone's
//!   QEMU has that group, so it can read (never write) them; before a clone maps them,
//!   owner, group and mode are checked, so a planted file is never mapped.

mod adopt;
pub mod channel;
pub mod cmdline;
mod console;
mod guest;
mod private;
pub mod qmp;
mod snapshot;
mod spawn;
mod stub;
pub mod tsc;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::json;
use sha2::{Digest, Sha256};

use self::cmdline::{Accel, Launch, Machine, Memory, RootDisk, TemplateDisk};
pub use self::guest::QemuGuest;
use self::guest::{random_id, Parts, Qemu};
use self::qmp::Qmp;
use self::spawn::{Files, RunAs};
use super::cgroup::Cgroups;
use super::identity::Identities;
use super::{Engine, Guest, GuestHandle, GuestSpec};
use crate::config::{AccelChoice, QemuConfig, SizeConfig};
use crate::error::{Error, Result};

/// Bound on a save or a restore of device state (it is ~100 KB with `x-ignore-shared`).
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a golden's silkd is given to notice the host left before the save.
const SESSION_END_GRACE: Duration = Duration::from_millis(100);
/// The `auto` accelerator probe: KVM must boot a guest to `READY` within this.
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Memory a QEMU may use beyond its guest's RAM (its code and libraries, device state,
/// I/O buffers, thread stacks; under TCG the translation cache comes on top): an idle
/// clone's QEMU uses ~40 MiB of its own, this leaves room for bursts of I/O.
pub const QEMU_OVERHEAD_MIB: u64 = 128;
/// Tasks a QEMU may have: main loop, RCU, one per vCPU, and its worker pool (at most 64).
pub const QEMU_MAX_PIDS: u64 = 128;

/// The engine; one per daemon.
pub struct QemuEngine {
    binary: PathBuf,
    version: String,
    accel_choice: AccelChoice,
    /// Decided on first use (`auto` probes KVM once), then fixed.
    accel: tokio::sync::OnceCell<Accel>,
    probe_image: Option<PathBuf>,
    machine: Machine,
    /// How a template's image reaches its guests (`[qemu] template_disk`).
    template_disk: TemplateDisk,
    /// This daemon's private directory under `[qemu] memory_dir`.
    memory_dir: PathBuf,
    run_root: PathBuf,
    boot_timeout: Duration,
    tsc_khz: u64,
    /// One uid per QEMU, from `uid_base + 1 ..`.
    identities: Arc<Identities>,
    /// `uid_base`: the group of sealed golden files, and a supplementary group of every
    /// clone's QEMU, so clones can read what no one else can.
    readers_gid: u32,
    cgroups: Cgroups,
    /// Golden guests between `boot_golden` and `seal_golden`, by guest id.
    goldens: Mutex<HashMap<String, (Arc<QemuGuest>, GoldenFiles)>>,
}

/// A golden's memory file and its migration state while it is being built.
struct GoldenFiles {
    memory: File,
    state: File,
    state_tmp: PathBuf,
}

impl QemuEngine {
    /// Checks QEMU and prepares its directories; what an earlier run left is re-adopted
    /// or swept later ([`Engine::adopt`], [`Engine::sweep`]). The accelerator is settled on first use: `auto` uses KVM only if it actually boots
    /// `probe_image`, tried once with a short deadline.
    ///
    /// Golden memory files go in `memory_dir/sandboxd-INSTANCE` (one per data_dir), a
    /// directory created 0700 or, from an earlier run, accepted only if ours and 0700.
    pub fn new(
        cfg: &QemuConfig,
        data_dir: &Path,
        cgroup_root: &Path,
        boot_timeout: Duration,
        probe_image: Option<PathBuf>,
    ) -> Result<QemuEngine> {
        let version = qemu_version(&cfg.binary)?;
        let instance = hex::encode(&Sha256::digest(data_dir.as_os_str().as_encoded_bytes())[..6]);
        let qemu_dir = data_dir.join("qemu");
        let run_root = qemu_dir.join("run");
        private::check_parent(data_dir)?;
        private::private_dir(&qemu_dir)?;
        private::check_parent(&cfg.memory_dir)?;
        let memory_dir = cfg.memory_dir.join(format!("sandboxd-{instance}"));
        private::private_dir(&memory_dir)?;
        let cgroups = Cgroups::probe(cgroup_root, &instance);
        for w in cgroups.warnings() {
            tracing::warn!("qemu engine: {w}");
        }
        private::private_dir(&run_root)?;
        let identities = Identities::new(cfg.uid_base + 1, cfg.uid_count - 1);
        tracing::info!(
            qemu = %version,
            unprivileged = identities.switching(),
            "qemu engine ready"
        );
        Ok(QemuEngine {
            binary: cfg.binary.clone(),
            version,
            accel_choice: cfg.accel,
            accel: tokio::sync::OnceCell::new(),
            probe_image,
            machine: cfg.machine,
            template_disk: cfg.template_disk,
            memory_dir,
            run_root,
            boot_timeout,
            tsc_khz: tsc::host_tsc_khz(),
            identities,
            readers_gid: cfg.uid_base,
            cgroups,
            goldens: Mutex::new(HashMap::new()),
        })
    }

    /// The mode and group a sealed golden file must have: group-readable by the clones'
    /// group when QEMUs run under their own uids, else readable by sandboxd's user only
    /// (every QEMU runs as that user then).
    fn sealed(&self) -> (u32, Option<u32>) {
        if self.identities.switching() {
            (0o440, Some(self.readers_gid))
        } else {
            (0o400, None)
        }
    }

    async fn accel(&self) -> Accel {
        *self
            .accel
            .get_or_init(|| async {
                let accel = match self.accel_choice {
                    AccelChoice::Tcg => Accel::Tcg,
                    AccelChoice::Kvm => Accel::Kvm,
                    AccelChoice::Auto => self.probe_kvm().await,
                };
                tracing::info!(
                    accel = accel.name(),
                    tsc_khz = self.tsc_khz,
                    "qemu accelerator"
                );
                accel
            })
            .await
    }

    async fn probe_kvm(&self) -> Accel {
        if !Path::new("/dev/kvm").exists() {
            tracing::info!("accel auto: no /dev/kvm, using tcg");
            return Accel::Tcg;
        }
        let Some(image) = &self.probe_image else {
            tracing::info!("accel auto: no image to probe KVM with, using tcg");
            return Accel::Tcg;
        };
        let boot = Boot {
            cpus: 1,
            memory_mib: 256,
            memory: Memory::Anonymous,
            image: image.clone(),
            balloon: false,
            files: None,
            disk: None,
            silkd_args: Vec::new(),
        };
        match self
            .launch(Accel::Kvm, &boot, false, KVM_PROBE_TIMEOUT)
            .await
        {
            Ok(guest) => {
                guest.kill_and_clean().await;
                tracing::info!("accel auto: KVM booted a guest, using kvm");
                Accel::Kvm
            }
            Err(e) => {
                tracing::info!("accel auto: KVM did not boot a guest ({e}), using tcg");
                Accel::Tcg
            }
        }
    }

    /// Where a golden's RAM lives (tmpfs, in this daemon's private directory), named
    /// after its directory so each pool key has its own.
    fn golden_memory(&self, spec: &GuestSpec) -> PathBuf {
        let h = Sha256::digest(spec.golden_dir.as_os_str().as_encoded_bytes());
        self.memory_dir
            .join(format!("golden-{}.mem", &hex::encode(h)[..16]))
    }

    fn golden_state(spec: &GuestSpec) -> PathBuf {
        spec.golden_dir.join("state.mig")
    }

    fn boot_of<'f>(
        spec: &GuestSpec,
        memory: Memory,
        files: Option<(&'f File, &'f File)>,
    ) -> Result<Boot<'f>> {
        let image = spec.template_config.image.clone().ok_or_else(|| {
            Error::Config(format!(
                "template {:?} has no `image` (the qemu engine boots an image built by `cargo xtask image`)",
                spec.template
            ))
        })?;
        let disk = root_disk(&image)?.map(|path| (path, spec.size_config.disk_mib));
        Ok(Boot {
            cpus: spec.size_config.cpus,
            memory_mib: spec.size_config.memory_mib,
            memory,
            image,
            balloon: !spec.no_balloon,
            files,
            disk,
            silkd_args: spec.template_config.silkd_args(),
        })
    }

    /// Starts QEMU and, unless `incoming`, waits for the channel handshake.
    async fn launch(
        &self,
        accel: Accel,
        boot: &Boot<'_>,
        incoming: bool,
        within: Duration,
    ) -> Result<Arc<QemuGuest>> {
        let id = random_id();
        let identity = self.identities.take()?;
        let switch = self.identities.switching();
        let (memory, state) = boot.files.unzip();
        if boot.memory == Memory::GoldenShared {
            // The golden's QEMU writes both files: its uid owns them until the seal.
            let owner = switch.then(|| (identity.uid(), identity.gid()));
            for f in [memory, state].into_iter().flatten() {
                f.set_len(0)
                    .map_err(Error::io("truncating a golden file"))?;
                private::hand_over(f, Path::new("golden file"), owner, 0o600)?;
            }
        }
        let open = |name: &str| {
            let p = boot.image.join(name);
            File::open(&p).map_err(Error::io(format!("opening {}", p.display())))
        };
        let kernel = open("vmlinuz")?;
        // A restoring QEMU boots nothing: the kernel's header and no initramfs (stub.rs).
        let (kernel, initrd) = if incoming {
            (stub::kernel_stub(&kernel)?.unwrap_or(kernel), None)
        } else {
            (kernel, Some(open("initramfs.cpio.gz")?))
        };
        // Opened read-only here and inherited: QEMU can only read it, whatever it asks.
        let disk = match &boot.disk {
            Some((path, mib)) => {
                let file =
                    File::open(path).map_err(Error::io(format!("opening {}", path.display())))?;
                let bytes = file
                    .metadata()
                    .map_err(Error::io(format!("stat {}", path.display())))?
                    .len();
                if self.template_disk == TemplateDisk::Pmem
                    && !bytes.is_multiple_of(cmdline::PMEM_ALIGN)
                {
                    return Err(Error::Config(format!(
                        "{}: {bytes} bytes, not a multiple of 2 MiB, cannot be a virtio-pmem \
                         region (`template_disk = \"pmem\"`); rebuild the image with `cargo \
                         xtask image`, which pads it",
                        path.display()
                    )));
                }
                let disk = RootDisk {
                    disk_mib: *mib,
                    kind: self.template_disk,
                    bytes,
                };
                Some((file, disk))
            }
            None => None,
        };
        let (disk, root_disk) = disk.unzip();
        let run_dir = self.run_root.join(&id);
        private::fresh_dir(&run_dir)?;
        let args = cmdline::args(&Launch {
            accel,
            machine: self.machine,
            cpus: boot.cpus,
            memory_mib: boot.memory_mib,
            memory: boot.memory,
            run_dir: &run_dir,
            tsc_khz: self.tsc_khz,
            balloon: boot.balloon,
            incoming,
            disk: root_disk,
            silkd_args: &boot.silkd_args,
        });
        let readers = [self.readers_gid];
        let run_as = RunAs {
            switch,
            uid: identity.uid(),
            gid: identity.gid(),
            groups: if boot.memory == Memory::ClonePrivate {
                &readers
            } else {
                &[]
            },
        };
        let files = Files {
            kernel: &kernel,
            initrd: initrd.as_ref(),
            memory,
            state,
            disk: disk.as_ref(),
        };
        let limits = cgroup_limits(boot, accel);
        let spawned = match spawn::spawn(
            &self.binary,
            &args,
            &run_dir,
            &run_as,
            &self.cgroups,
            &id,
            &limits,
            &files,
        ) {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&run_dir);
                return Err(e);
            }
        };
        let spawn::Spawned {
            child,
            console,
            stderr,
            cgroup,
            pidfd,
            start_time,
        } = spawned;
        // The channel and QMP sockets are at fixed names in the run dir, so the record
        // names the dir only: a later sandboxd verifies the dir and derives the rest.
        let handle = GuestHandle {
            engine: "qemu".into(),
            guest_id: id.clone(),
            run_dir: run_dir.clone(),
            pid: pidfd.pid(),
            start_time,
            init: None,
            uid: switch.then(|| identity.uid()),
            cgroups: cgroup.dirs().to_vec(),
        };
        let guest = QemuGuest::supervise(
            Qemu::Child(child),
            Parts {
                id,
                run_dir,
                console,
                stderr,
                cgroup,
                identity,
                pidfd,
                handle,
            },
        );
        if !incoming {
            if let Err(e) = guest.connect(within).await {
                let e = guest.launch_error(e);
                guest.kill_and_clean().await;
                return Err(e);
            }
            if boot.balloon {
                match Qmp::connect(&cmdline::qmp_socket(&guest.run_dir), within).await {
                    Ok(mut qmp) => enable_balloon_stats(&mut qmp).await,
                    Err(e) => tracing::warn!(guest = %guest.id, "no QMP for balloon stats: {e}"),
                }
            }
        }
        Ok(guest)
    }

    /// Boots cold, retrying once: a TCG boot can hang in early boot under host load.
    async fn boot_cold(&self, boot: &Boot<'_>) -> Result<Arc<QemuGuest>> {
        let accel = self.accel().await;
        match self.launch(accel, boot, false, self.boot_timeout).await {
            Ok(g) => Ok(g),
            Err(e) => {
                tracing::warn!("boot failed, retrying once: {e}");
                self.launch(accel, boot, false, self.boot_timeout).await
            }
        }
    }

    async fn clone_from_golden(&self, spec: &GuestSpec) -> Result<Arc<QemuGuest>> {
        // Only files sandboxd sealed: a file anyone else made or changed is refused.
        let (mode, gid) = self.sealed();
        let memory = private::open_verified(&self.golden_memory(spec), mode, gid)?;
        let state = private::open_verified(&Self::golden_state(spec), mode, gid)?;
        let guest = self.clone_files(spec, &memory, &state, None).await?;
        guest.cloned.store(true, Ordering::Relaxed);
        Ok(guest)
    }

    /// Restores a clone of sealed `memory` and `state` (a golden's or a snapshot's) and
    /// reseeds it (`hostname`, else one of its own).
    async fn clone_files(
        &self,
        spec: &GuestSpec,
        memory: &File,
        state: &File,
        hostname: Option<&str>,
    ) -> Result<Arc<QemuGuest>> {
        let boot = Self::boot_of(spec, Memory::ClonePrivate, Some((memory, state)))?;
        let accel = self.accel().await;
        let guest = self.launch(accel, &boot, true, self.boot_timeout).await?;
        let restored = async {
            let mut qmp =
                Qmp::connect(&cmdline::qmp_socket(&guest.run_dir), self.boot_timeout).await?;
            qmp.execute("migrate-set-capabilities", Some(ignore_shared()))
                .await?;
            qmp.execute(
                "migrate-incoming",
                Some(json!({ "uri": cmdline::state_uri() })),
            )
            .await?;
            qmp.wait_migration(MIGRATION_TIMEOUT).await?;
            qmp.execute("cont", None).await?;
            guest.connect_as(self.boot_timeout, hostname).await?;
            // After the handshake: QEMU asks for the first statistics at once, and the
            // guest's work on them (all cold code in a fresh clone) delayed the handshake;
            // median clone → `Info` 230 ms with it before, 207 after (same run, bench_vm).
            if boot.balloon {
                enable_balloon_stats(&mut qmp).await;
            }
            Ok::<(), Error>(())
        }
        .await;
        if let Err(e) = restored {
            let e = guest.launch_error(e);
            guest.kill_and_clean().await;
            return Err(e);
        }
        Ok(guest)
    }
}

/// What one boot needs.
struct Boot<'f> {
    cpus: u32,
    memory_mib: u64,
    memory: Memory,
    image: PathBuf,
    balloon: bool,
    /// The golden's memory file and migration state (golden and clones).
    files: Option<(&'f File, &'f File)>,
    /// The template's root disk and the writable layer's size in MiB.
    disk: Option<(PathBuf, u64)>,
    /// silkd's flags from the template (default user, workdir, env, detach ring).
    silkd_args: Vec<String>,
}

/// The read-only root disk of the image in `image`, from its manifest's
/// `template.rootfs_image` (`base` has none: it runs from the initramfs alone).
pub(crate) fn root_disk(image: &Path) -> Result<Option<PathBuf>> {
    let manifest = image.join("manifest.json");
    let text = match std::fs::read_to_string(&manifest) {
        Ok(t) => t,
        // golden_inputs names a missing manifest; a boot without one has no disk.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Config(format!("{}: {e}", manifest.display()))),
    };
    let parsed: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Config(format!("{}: {e}", manifest.display())))?;
    let Some(name) = parsed.pointer("/template/rootfs_image") else {
        return Ok(None);
    };
    let name = name.as_str().filter(|n| {
        let p = Path::new(n);
        p.components().count() == 1
            && matches!(p.components().next(), Some(std::path::Component::Normal(_)))
    });
    match name {
        Some(n) => Ok(Some(image.join(n))),
        None => Err(Error::Config(format!(
            "{}: template.rootfs_image must be a file name in the image directory",
            manifest.display()
        ))),
    }
}

/// A QEMU's cgroup: the guest's CPUs, its RAM plus QEMU's own margin (and the TCG
/// translation cache), and a task limit for QEMU's threads.
fn cgroup_limits(boot: &Boot<'_>, accel: Accel) -> SizeConfig {
    let tcg = if accel == Accel::Tcg {
        cmdline::TCG_TB_MIB
    } else {
        0
    };
    SizeConfig {
        cpus: boot.cpus,
        memory_mib: boot.memory_mib + QEMU_OVERHEAD_MIB + tcg,
        max_pids: QEMU_MAX_PIDS,
        // Only the process engine's tmpfs use it; a cgroup has no disk limit.
        disk_mib: 0,
    }
}

/// Turns on the balloon's guest memory statistics (every 5 s). Polling is a property of
/// the running device, not of the migrated state, so clones need it set again. Never an
/// inflation: nothing here takes memory from the guest.
async fn enable_balloon_stats(qmp: &mut Qmp) {
    let args = json!({
        "path": "/machine/peripheral/balloon0",
        "property": "guest-stats-polling-interval",
        "value": 5,
    });
    if let Err(e) = qmp.execute("qom-set", Some(args)).await {
        tracing::warn!("enabling balloon statistics: {e}");
    }
}

fn ignore_shared() -> serde_json::Value {
    json!({ "capabilities": [{ "capability": "x-ignore-shared", "state": true }] })
}

impl Engine for QemuEngine {
    fn info(&self) -> api::EngineInfo {
        let accel = self.accel.get();
        let mut warnings = self.cgroups.warnings().to_vec();
        if !self.identities.switching() {
            warnings.push(
                "sandboxd is not root: every QEMU runs as sandboxd's own user, so VMs are not \
                 separated from each other or from sandboxd by uid"
                    .into(),
            );
        }
        if accel == Some(&Accel::Tcg) {
            warnings.push("guests run under TCG (software emulation), slower than KVM".into());
        }
        api::EngineInfo {
            name: "qemu".into(),
            accelerator: Some(
                accel
                    .map_or("undecided (probed on first boot)", |a| a.name())
                    .into(),
            ),
            warnings,
        }
    }

    fn golden_inputs(&self, spec: &GuestSpec) -> Result<String> {
        let boot = Self::boot_of(spec, Memory::Anonymous, None)?;
        let image = boot.image;
        let manifest = image.join("manifest.json");
        let text = std::fs::read_to_string(&manifest).map_err(|e| {
            Error::Config(format!(
                "{}: {e} (build the image with `cargo xtask image`)",
                manifest.display()
            ))
        })?;
        let parsed: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", manifest.display())))?;
        let digest = parsed
            .get("image_digest")
            .and_then(|d| d.as_str())
            .ok_or_else(|| Error::Config(format!("{}: no image_digest", manifest.display())))?;
        // Accelerator is left out: it is settled asynchronously, and a snapshot's device
        // state does not depend on it for TCG ↔ TCG; `accel_choice` covers operator changes.
        // With a root disk the writable layer's size is in the snapshot (a mounted tmpfs),
        // so it keys the golden too; the disk's content is in `image_digest`.
        // silkd's template flags (the detach ring's size among them) are parsed once, by
        // the golden's silkd: clones inherit them, so they key the golden.
        // How the disk is attached changes the device set, so it keys the golden too.
        let disk = boot.disk.map_or(String::new(), |(_, mib)| {
            format!(" disk_mib={mib} template_disk={:?}", self.template_disk)
        });
        let silkd = boot.silkd_args.join(" ");
        // The guest kernel's flags, without the host's TSC rate (measured at each start,
        // it may differ by a kHz, and a restored guest keeps its calibration anyway).
        let kernel = cmdline::kernel_cmdline(0, None, &[]);
        Ok(format!(
            "qemu={} accel={:?} tcg_cpu={} machine={:?} cpus={} memory_mib={} balloon={} image={digest}{disk} silkd=[{silkd}] kernel=[{kernel}]",
            self.version,
            self.accel_choice,
            cmdline::TCG_CPU,
            self.machine,
            spec.size_config.cpus,
            spec.size_config.memory_mib,
            !spec.no_balloon
        ))
    }

    fn golden_present(&self, spec: &GuestSpec) -> bool {
        // Present means sealed by us: anything else is rebuilt, never mapped.
        let (mode, gid) = self.sealed();
        private::is_verified(&Self::golden_state(spec), mode, gid)
            && private::is_verified(&self.golden_memory(spec), mode, gid)
    }

    fn boot_golden<'a>(&'a self, spec: &'a GuestSpec) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(async move {
            let mem = self.golden_memory(spec);
            let state = Self::golden_state(spec);
            let state_tmp = state.with_extension("mig.tmp");
            // Running clones of an older golden keep their mapping of the old file.
            for old in [&mem, &state, &state_tmp] {
                let _ = std::fs::remove_file(old);
            }
            if let Some(parent) = spec.golden_dir.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(Error::io(format!("creating {}", parent.display())))?;
            }
            // 0700 whatever data_dir's mode: only sandboxd reaches the state by path.
            private::private_dir(&spec.golden_dir)?;
            // Exclusive creates: whatever got in the way after the removal is refused.
            let files = GoldenFiles {
                memory: private::create_file(&mem, 0o600)?,
                state: private::create_file(&state_tmp, 0o600)?,
                state_tmp,
            };
            let boot = Self::boot_of(
                spec,
                Memory::GoldenShared,
                Some((&files.memory, &files.state)),
            )?;
            let guest = self.boot_cold(&boot).await?;
            self.goldens
                .lock()
                .expect("goldens lock")
                .insert(guest.id.clone(), (guest.clone(), files));
            Ok(guest as Arc<dyn Guest>)
        })
    }

    fn seal_golden<'a>(
        &'a self,
        spec: &'a GuestSpec,
        guest: Arc<dyn Guest>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let (golden, files) = self
                .goldens
                .lock()
                .expect("goldens lock")
                .remove(guest.id())
                .ok_or_else(|| Error::Engine(format!("{} is not a golden guest", guest.id())))?;
            let state = Self::golden_state(spec);
            let saved = async {
                // End the host session first and give silkd a moment to see the hang-up,
                // so clones start "waiting for a host" rather than inside a dead session
                // (which would swallow their first HELLO and cost them a resend).
                golden.disconnect();
                tokio::time::sleep(SESSION_END_GRACE).await;
                let mut qmp =
                    Qmp::connect(&cmdline::qmp_socket(&golden.run_dir), self.boot_timeout).await?;
                qmp.execute("migrate-set-capabilities", Some(ignore_shared()))
                    .await?;
                qmp.execute(
                    "migrate-set-parameters",
                    Some(json!({ "max-bandwidth": 100u64 << 30 })),
                )
                .await?;
                qmp.execute("stop", None).await?;
                qmp.execute("migrate", Some(json!({ "uri": cmdline::state_uri() })))
                    .await?;
                qmp.wait_migration(MIGRATION_TIMEOUT).await?;
                Ok::<_, Error>(())
            }
            .await;
            // The golden must never run again after its save: its writes would show
            // through in clones' pages.
            golden.kill_and_clean().await;
            saved?;
            // Its QEMU is gone (and with it the uid's last process): take both files back
            // and make them readable by clones only.
            let (mode, gid) = self.sealed();
            let owner = gid.map(|g| (nix::unistd::geteuid().as_raw(), g));
            private::hand_over(&files.memory, &self.golden_memory(spec), owner, mode)?;
            private::hand_over(&files.state, &files.state_tmp, owner, mode)?;
            std::fs::rename(&files.state_tmp, &state)
                .map_err(Error::io(format!("renaming {}", files.state_tmp.display())))?;
            Ok(())
        })
    }

    fn adopt<'a>(&'a self, handle: &'a GuestHandle) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(async move { self.adopt_guest(handle).await.map(|g| g as Arc<dyn Guest>) })
    }

    fn snapshot<'a>(
        &'a self,
        spec: &'a GuestSpec,
        guest: &'a dyn Guest,
        dir: &'a Path,
        resume: bool,
    ) -> BoxFuture<'a, Result<super::Captured>> {
        Box::pin(self.snapshot_guest(spec, guest, dir, resume))
    }

    fn restore<'a>(
        &'a self,
        spec: &'a GuestSpec,
        dir: &'a Path,
        hostname: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(async move {
            self.restore_guest(spec, dir, hostname)
                .await
                .map(|g| g as Arc<dyn Guest>)
        })
    }

    fn sweep(&self, keep: &[GuestHandle]) {
        self.sweep_unowned(keep);
    }

    fn shutdown(&self, kept: bool) {
        // A golden mid-build is dropped here, and its Drop SIGKILLs its QEMU.
        self.goldens.lock().expect("goldens lock").clear();
        if !kept {
            // Every guest was destroyed already; this catches anything that escaped, so
            // no QEMU outlives the daemon.
            self.sweep_unowned(&[]);
            self.cgroups.remove_parents();
        }
    }

    fn start<'a>(&'a self, spec: &'a GuestSpec) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(async move {
            if self.golden_present(spec) {
                match self.clone_from_golden(spec).await {
                    Ok(g) => return Ok(g as Arc<dyn Guest>),
                    Err(e) => tracing::warn!("clone failed, booting cold: {e}"),
                }
            }
            let boot = Self::boot_of(spec, Memory::Anonymous, None)?;
            Ok(self.boot_cold(&boot).await? as Arc<dyn Guest>)
        })
    }
}

fn qemu_version(binary: &Path) -> Result<String> {
    let out = std::process::Command::new(binary).arg("--version").output().map_err(|e| {
        Error::Engine(format!(
            "cannot run {} ({e}): install QEMU 10, e.g. `apt-get install -t bookworm-backports qemu-system-x86`",
            binary.display()
        ))
    })?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or("unknown").trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image_with(manifest: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("manifest.json"), manifest).unwrap();
        dir
    }

    #[test]
    fn the_root_disk_is_a_file_of_the_image_directory_or_refused() {
        let base = image_with(r#"{"image_digest": "sha256:00"}"#);
        assert_eq!(root_disk(base.path()).unwrap(), None, "base has no disk");
        let tpl = image_with(r#"{"template": {"rootfs_image": "rootfs.erofs"}}"#);
        assert_eq!(
            root_disk(tpl.path()).unwrap(),
            Some(tpl.path().join("rootfs.erofs"))
        );
        // A manifest naming a file outside its directory (or not a name) is refused, so
        // no image can hand a guest a host file as its disk.
        for hostile in [
            r#""../../etc/shadow""#,
            r#""/dev/sda""#,
            r#""sub/disk""#,
            r#""..""#,
            r#""""#,
            "7",
        ] {
            let dir = image_with(&format!(r#"{{"template": {{"rootfs_image": {hostile}}}}}"#));
            let err = root_disk(dir.path()).unwrap_err().to_string();
            assert!(err.contains("rootfs_image"), "{hostile}: {err}");
        }
        let broken = image_with("{not json");
        assert!(root_disk(broken.path()).is_err());
    }
}
