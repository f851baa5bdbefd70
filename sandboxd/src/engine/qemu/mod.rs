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
//!   and the tail of its console log.

pub mod channel;
pub mod cmdline;
mod guest;
pub mod qmp;
pub mod tsc;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::process::Command;

use self::cmdline::{Accel, Launch, Machine, Memory};
pub use self::guest::QemuGuest;
use self::guest::{clean_leftovers, random_id};
use self::qmp::Qmp;
use super::{Engine, Guest, GuestSpec};
use crate::config::{AccelChoice, QemuConfig};
use crate::error::{Error, Result};

/// Bound on a save or a restore of device state (it is ~100 KB with `x-ignore-shared`).
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a golden's silkd is given to notice the host left before the save.
const SESSION_END_GRACE: Duration = Duration::from_millis(100);
/// The `auto` accelerator probe: KVM must boot a guest to `READY` within this.
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The engine; one per daemon.
pub struct QemuEngine {
    binary: PathBuf,
    version: String,
    accel_choice: AccelChoice,
    /// Decided on first use (`auto` probes KVM once), then fixed.
    accel: tokio::sync::OnceCell<Accel>,
    probe_image: Option<PathBuf>,
    machine: Machine,
    memory_dir: PathBuf,
    run_root: PathBuf,
    boot_timeout: Duration,
    tsc_khz: u64,
    /// Golden guests between `boot_golden` and `seal_golden`, by guest id.
    goldens: Mutex<HashMap<String, Arc<QemuGuest>>>,
}

impl QemuEngine {
    /// Checks QEMU and clears what an earlier run left (processes, sockets). The
    /// accelerator is settled on first use: `auto` uses KVM only if it actually boots
    /// `probe_image`, tried once with a short deadline.
    pub fn new(
        cfg: &QemuConfig,
        data_dir: &Path,
        boot_timeout: Duration,
        probe_image: Option<PathBuf>,
    ) -> Result<QemuEngine> {
        let version = qemu_version(&cfg.binary)?;
        let run_root = data_dir.join("qemu").join("run");
        clean_leftovers(&run_root);
        std::fs::create_dir_all(&run_root)
            .map_err(Error::io(format!("creating {}", run_root.display())))?;
        std::fs::create_dir_all(&cfg.memory_dir)
            .map_err(Error::io(format!("creating {}", cfg.memory_dir.display())))?;
        tracing::info!(qemu = %version, "qemu engine ready");
        Ok(QemuEngine {
            binary: cfg.binary.clone(),
            version,
            accel_choice: cfg.accel,
            accel: tokio::sync::OnceCell::new(),
            probe_image,
            machine: cfg.machine,
            memory_dir: cfg.memory_dir.clone(),
            run_root,
            boot_timeout,
            tsc_khz: tsc::host_tsc_khz(),
            goldens: Mutex::new(HashMap::new()),
        })
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

    /// Where a golden's RAM lives (tmpfs), named after its directory so each pool key
    /// has its own.
    fn golden_memory(&self, spec: &GuestSpec) -> PathBuf {
        let h = Sha256::digest(spec.golden_dir.as_os_str().as_encoded_bytes());
        self.memory_dir
            .join(format!("sandboxd-golden-{}.mem", &hex::encode(h)[..16]))
    }

    fn golden_state(spec: &GuestSpec) -> PathBuf {
        spec.golden_dir.join("state.mig")
    }

    fn boot_of(spec: &GuestSpec, memory: Memory) -> Result<Boot> {
        let image = spec.template_config.image.clone().ok_or_else(|| {
            Error::Config(format!(
                "template {:?} has no `image` (the qemu engine boots an image built by `cargo xtask image`)",
                spec.template
            ))
        })?;
        Ok(Boot {
            cpus: spec.size_config.cpus,
            memory_mib: spec.size_config.memory_mib,
            memory,
            image,
            balloon: !spec.no_balloon,
        })
    }

    /// Starts QEMU and, unless `incoming`, waits for the channel handshake.
    async fn launch(
        &self,
        accel: Accel,
        boot: &Boot,
        incoming: bool,
        within: Duration,
    ) -> Result<Arc<QemuGuest>> {
        let id = random_id();
        let run_dir = self.run_root.join(&id);
        std::fs::create_dir_all(&run_dir)
            .map_err(Error::io(format!("creating {}", run_dir.display())))?;
        let args = cmdline::args(&Launch {
            accel,
            machine: self.machine,
            cpus: boot.cpus,
            memory_mib: boot.memory_mib,
            memory: boot.memory.clone(),
            image: &boot.image,
            run_dir: &run_dir,
            tsc_khz: self.tsc_khz,
            balloon: boot.balloon,
            incoming,
        });
        let stderr = std::fs::File::create(run_dir.join("qemu.log")).map_err(Error::io(
            format!("creating {}/qemu.log", run_dir.display()),
        ))?;
        let child = Command::new(&self.binary)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Engine(format!("spawning {}: {e}", self.binary.display())))?;
        let guest = QemuGuest::supervise(id, run_dir, child);
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
    async fn boot_cold(&self, boot: &Boot) -> Result<Arc<QemuGuest>> {
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
        let boot = Self::boot_of(spec, Memory::ClonePrivate(self.golden_memory(spec)))?;
        let accel = self.accel().await;
        let guest = self.launch(accel, &boot, true, self.boot_timeout).await?;
        let restored = async {
            let mut qmp =
                Qmp::connect(&cmdline::qmp_socket(&guest.run_dir), self.boot_timeout).await?;
            qmp.execute("migrate-set-capabilities", Some(ignore_shared()))
                .await?;
            let uri = format!("file:{}", Self::golden_state(spec).display());
            qmp.execute("migrate-incoming", Some(json!({ "uri": uri })))
                .await?;
            qmp.wait_migration(MIGRATION_TIMEOUT).await?;
            qmp.execute("cont", None).await?;
            if boot.balloon {
                enable_balloon_stats(&mut qmp).await;
            }
            guest.connect(self.boot_timeout).await
        }
        .await;
        if let Err(e) = restored {
            let e = guest.launch_error(e);
            guest.kill_and_clean().await;
            return Err(e);
        }
        guest.cloned.store(true, Ordering::Relaxed);
        Ok(guest)
    }
}

/// What one boot needs.
struct Boot {
    cpus: u32,
    memory_mib: u64,
    memory: Memory,
    image: PathBuf,
    balloon: bool,
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
        let mut warnings = Vec::new();
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
        let image = Self::boot_of(spec, Memory::Anonymous)?.image;
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
        Ok(format!(
            "qemu={} accel={:?} machine={:?} cpus={} memory_mib={} balloon={} image={digest}",
            self.version,
            self.accel_choice,
            self.machine,
            spec.size_config.cpus,
            spec.size_config.memory_mib,
            !spec.no_balloon
        ))
    }

    fn golden_present(&self, spec: &GuestSpec) -> bool {
        Self::golden_state(spec).is_file() && self.golden_memory(spec).is_file()
    }

    fn boot_golden<'a>(&'a self, spec: &'a GuestSpec) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(async move {
            let mem = self.golden_memory(spec);
            // Running clones of an older golden keep their mapping of the old file.
            let _ = std::fs::remove_file(&mem);
            let _ = std::fs::remove_file(Self::golden_state(spec));
            std::fs::create_dir_all(&spec.golden_dir)
                .map_err(Error::io(format!("creating {}", spec.golden_dir.display())))?;
            let boot = Self::boot_of(spec, Memory::GoldenShared(mem))?;
            let guest = self.boot_cold(&boot).await?;
            self.goldens
                .lock()
                .expect("goldens lock")
                .insert(guest.id.clone(), guest.clone());
            Ok(guest as Arc<dyn Guest>)
        })
    }

    fn seal_golden<'a>(
        &'a self,
        spec: &'a GuestSpec,
        guest: Arc<dyn Guest>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let golden = self
                .goldens
                .lock()
                .expect("goldens lock")
                .remove(guest.id())
                .ok_or_else(|| Error::Engine(format!("{} is not a golden guest", guest.id())))?;
            let state = Self::golden_state(spec);
            let tmp = state.with_extension("mig.tmp");
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
                let uri = format!("file:{}", tmp.display());
                qmp.execute("migrate", Some(json!({ "uri": uri }))).await?;
                qmp.wait_migration(MIGRATION_TIMEOUT).await?;
                Ok::<_, Error>(())
            }
            .await;
            // The golden must never run again after its save: its writes would show
            // through in clones' pages.
            golden.kill_and_clean().await;
            saved?;
            std::fs::rename(&tmp, &state)
                .map_err(Error::io(format!("renaming {}", tmp.display())))?;
            Ok(())
        })
    }

    fn shutdown(&self) {
        // Every guest was destroyed already; this sweeps anything that escaped (a golden
        // mid-build), so no QEMU outlives the daemon.
        self.goldens.lock().expect("goldens lock").clear();
        clean_leftovers(&self.run_root);
    }

    fn start<'a>(&'a self, spec: &'a GuestSpec) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(async move {
            if self.golden_present(spec) {
                match self.clone_from_golden(spec).await {
                    Ok(g) => return Ok(g as Arc<dyn Guest>),
                    Err(e) => tracing::warn!("clone failed, booting cold: {e}"),
                }
            }
            let boot = Self::boot_of(spec, Memory::Anonymous)?;
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
