//! One VM: its QEMU process, owned by a supervisor task that records the VM's end in its
//! [`Fate`] (an exit nobody asked for is the sandbox's failure, with QEMU's stderr and the
//! console tail) and then frees its cgroup and its uid; its guest channel; and the sweep
//! of QEMUs an earlier run left behind.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{oneshot, watch};

use super::channel::Channel;
use super::cmdline;
use super::console::Ring;
use super::spawn::Spawned;
use crate::engine::identity::Identity;
use crate::engine::{Fate, Guest, GuestStream};
use crate::error::{Error, Result};

/// One VM.
pub struct QemuGuest {
    pub(super) id: String,
    pub(super) run_dir: PathBuf,
    channel: tokio::sync::RwLock<Option<Channel>>,
    kill: Mutex<Option<oneshot::Sender<()>>>,
    exited: watch::Receiver<bool>,
    fate: Fate,
    destroying: AtomicBool,
    pub(super) cloned: AtomicBool,
    console: Ring,
    stderr: Ring,
    pid: Option<u32>,
}

impl QemuGuest {
    /// Takes the started QEMU; a task waits for it, records an unexpected exit, then
    /// removes its cgroup and gives its uid back (only once nothing runs under it).
    pub(super) fn supervise(
        id: String,
        run_dir: PathBuf,
        spawned: Spawned,
        identity: Identity,
    ) -> Arc<QemuGuest> {
        let Spawned {
            mut child,
            console,
            stderr,
            cgroup,
        } = spawned;
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let (exited_tx, exited_rx) = watch::channel(false);
        let fate = Fate::new();
        let guest = Arc::new(QemuGuest {
            id,
            run_dir: run_dir.clone(),
            channel: tokio::sync::RwLock::new(None),
            kill: Mutex::new(Some(kill_tx)),
            exited: exited_rx,
            fate: fate.clone(),
            destroying: AtomicBool::new(false),
            cloned: AtomicBool::new(false),
            pid: child.id(),
            console,
            stderr,
        });
        let id = guest.id.clone();
        let (console, stderr) = (guest.console.clone(), guest.stderr.clone());
        tokio::spawn(async move {
            tokio::select! {
                status = child.wait() => {
                    let why = match status {
                        Ok(s) => format!("QEMU exited ({s})"),
                        Err(e) => format!("waiting for QEMU: {e}"),
                    };
                    let tail = tails(&console, &stderr);
                    tracing::warn!(guest = %id, "{why}; {tail}");
                    fate.fail(format!("{why}; {tail}"));
                }
                _ = kill_rx => {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                }
            }
            // QEMU is reaped and `spawn=deny` kept it from leaving children: the group is
            // empty and the uid owns no process any more.
            cgroup.kill_all();
            cgroup.remove();
            drop(identity);
            let _ = exited_tx.send(true);
        });
        guest
    }

    pub(super) async fn connect(&self, within: Duration) -> Result<()> {
        let hostname = format!("sbx-{}", &self.id[..12]);
        let socket = cmdline::silkd_socket(&self.run_dir);
        let mut exited = self.exited.clone();
        let channel = tokio::select! {
            c = Channel::open(&socket, &hostname, within) => c?,
            _ = exited.wait_for(|e| *e) => return Err(Error::Engine("QEMU exited during boot".into())),
        };
        *self.channel.write().await = Some(channel);
        Ok(())
    }

    pub(super) fn disconnect(&self) {
        if let Ok(mut c) = self.channel.try_write() {
            if let Some(c) = c.take() {
                c.close();
            }
        }
    }

    /// The error for a launch or restore that failed: with the VM's recorded failure
    /// (QEMU's exit and the console tail) when there is one, else the console tail.
    pub(super) fn launch_error(&self, e: Error) -> Error {
        match self.fate.failure() {
            Some(f) => Error::Engine(format!("{e}: {f}")),
            None => Error::Engine(format!("{e}; {}", self.tails())),
        }
    }

    /// QEMU's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    fn tails(&self) -> String {
        tails(&self.console, &self.stderr)
    }

    pub(super) async fn kill_and_clean(&self) {
        self.destroying.store(true, Ordering::SeqCst);
        self.fate.destroyed();
        if let Some(c) = self.channel.write().await.take() {
            c.close();
        }
        if let Some(k) = self.kill.lock().expect("kill lock").take() {
            let _ = k.send(());
        }
        let mut exited = self.exited.clone();
        let _ = exited.wait_for(|e| *e).await;
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

impl Guest for QemuGuest {
    fn id(&self) -> &str {
        &self.id
    }

    fn dial(&self) -> BoxFuture<'_, Result<GuestStream>> {
        Box::pin(async move {
            if let Some(f) = self.fate.failure() {
                return Err(Error::Guest(format!("the VM failed: {f}")));
            }
            let channel = self.channel.read().await;
            let channel = channel
                .as_ref()
                .ok_or_else(|| Error::Guest("the VM has no open channel".into()))?;
            Ok(Box::new(channel.dial().await?) as GuestStream)
        })
    }

    fn destroy(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.kill_and_clean())
    }

    fn fate(&self) -> &Fate {
        &self.fate
    }

    fn origin(&self) -> &'static str {
        if self.cloned.load(Ordering::Relaxed) {
            "clone"
        } else {
            "cold"
        }
    }
}

/// The last bytes of QEMU's stderr and of the guest console, for error messages.
fn tails(console: &Ring, stderr: &Ring) -> String {
    format!(
        "qemu stderr: [{}] console ({} bytes in all): [{}]",
        stderr.tail(600),
        console.total(),
        console.tail(600)
    )
}

/// Kills QEMUs an earlier run left behind (their run dirs hold the sockets) and removes
/// the dirs. A QEMU is ours when its command line (`-name`) names one of those dirs; the
/// cgroup sweep catches the same QEMUs where the host has cgroups.
pub(super) fn clean_leftovers(run_root: &Path) {
    let Ok(dirs) = std::fs::read_dir(run_root) else {
        return;
    };
    let dirs: Vec<PathBuf> = dirs.flatten().map(|e| e.path()).collect();
    if dirs.is_empty() {
        return;
    }
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for p in procs.flatten() {
            let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline);
            if dirs.iter().any(|d| cmdline.contains(&*d.to_string_lossy())) {
                tracing::warn!(pid, "killing a QEMU left by an earlier run");
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

pub(super) fn random_id() -> String {
    let mut b = [0u8; 12];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
    hex::encode(b)
}
