//! One VM: its QEMU process, owned by a supervisor task that records the VM's end in its
//! [`Fate`] (an exit nobody asked for is the sandbox's failure, with QEMU's stderr and the
//! console tail) and then frees its cgroup and its uid; its record ([`GuestHandle`]) for a
//! later sandboxd; and its guest channel. A QEMU this sandboxd spawned is its child; one
//! it re-adopted after a restart is watched through a pidfd (`adopt.rs`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{oneshot, watch};

use super::channel::Channel;
use super::cmdline;
use super::console::Ring;
use crate::engine::cgroup::Cgroup;
use crate::engine::handle::PidFd;
use crate::engine::identity::Identity;
use crate::engine::{Fate, Guest, GuestHandle, GuestStream};
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
    /// Set when sandboxd stops and leaves the VM running: dropping it kills nothing.
    kept: Arc<AtomicBool>,
    pub(super) cloned: AtomicBool,
    /// The hostname its last handshake set (a woken VM keeps the one it had).
    hostname: Mutex<String>,
    console: Ring,
    stderr: Ring,
    /// QEMU, signalled through its pidfd only.
    pidfd: PidFd,
    handle: GuestHandle,
}

/// The QEMU process a supervisor waits for.
pub(super) enum Qemu {
    /// Spawned by this sandboxd: our child, reaped here.
    Child(tokio::process::Child),
    /// Re-adopted after a restart: not our child (init reaps it), watched by a pidfd.
    Adopted(PidFd),
}

/// What a supervisor takes over besides the process.
pub(super) struct Parts {
    pub id: String,
    pub run_dir: PathBuf,
    pub console: Ring,
    pub stderr: Ring,
    pub cgroup: Cgroup,
    pub identity: Identity,
    /// QEMU's pidfd, for kills.
    pub pidfd: PidFd,
    pub handle: GuestHandle,
}

impl QemuGuest {
    /// Takes the QEMU; a task waits for it, records an unexpected exit, then removes its
    /// cgroup and gives its uid back (only once nothing runs under it). A guest left
    /// running on stop is no longer supervised once dropped.
    pub(super) fn supervise(qemu: Qemu, parts: Parts) -> Arc<QemuGuest> {
        let Parts {
            id,
            run_dir,
            console,
            stderr,
            cgroup,
            identity,
            pidfd,
            handle,
        } = parts;
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let (exited_tx, exited_rx) = watch::channel(false);
        let fate = Fate::new();
        let kept = Arc::new(AtomicBool::new(false));
        let guest = Arc::new(QemuGuest {
            id,
            run_dir,
            channel: tokio::sync::RwLock::new(None),
            kill: Mutex::new(Some(kill_tx)),
            exited: exited_rx,
            fate: fate.clone(),
            destroying: AtomicBool::new(false),
            kept: kept.clone(),
            cloned: AtomicBool::new(false),
            hostname: Mutex::new(String::new()),
            pidfd,
            handle,
            console,
            stderr,
        });
        let id = guest.id.clone();
        let (console, stderr) = (guest.console.clone(), guest.stderr.clone());
        tokio::spawn(async move {
            let (mut child, watch) = match qemu {
                Qemu::Child(c) => (Some(c), None),
                Qemu::Adopted(p) => (None, Some(p)),
            };
            let exit = async {
                match (&mut child, watch) {
                    (Some(c), _) => match c.wait().await {
                        Ok(s) => format!("QEMU exited ({s})"),
                        Err(e) => format!("waiting for QEMU: {e}"),
                    },
                    (None, Some(p)) => match p.exited().await {
                        // Not our child: its exit status went to whoever reaped it.
                        Ok(()) => "QEMU exited (re-adopted after a restart: its console \
                                   and exit status went to the earlier sandboxd)"
                            .to_string(),
                        Err(e) => format!("watching QEMU: {e}"),
                    },
                    (None, None) => unreachable!("a supervisor always has a process"),
                }
            };
            tokio::pin!(exit);
            tokio::select! {
                why = &mut exit => {
                    let tail = tails(&console, &stderr);
                    tracing::warn!(guest = %id, "{why}; {tail}");
                    fate.fail(format!("{why}; {tail}"));
                }
                _ = kill_rx => {
                    if kept.load(Ordering::SeqCst) {
                        // Left running for the next start: not ours to wait for any more.
                        return;
                    }
                    // `destroy` or the guest's Drop sent SIGKILL through the pidfd.
                    let _ = exit.await;
                }
            }
            // QEMU is gone and `spawn=deny` kept it from leaving children: the group is
            // empty and the uid owns no process any more.
            cgroup.kill_all();
            cgroup.remove();
            drop(identity);
            let _ = exited_tx.send(true);
        });
        guest
    }

    pub(super) async fn connect(&self, within: Duration) -> Result<()> {
        self.connect_as(within, None).await
    }

    /// The channel handshake, setting `hostname` (else one derived from the VM's id).
    pub(super) async fn connect_as(&self, within: Duration, hostname: Option<&str>) -> Result<()> {
        let hostname = hostname.map_or_else(|| format!("sbx-{}", &self.id[..12]), str::to_string);
        *self.hostname.lock().expect("hostname lock") = hostname.clone();
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

    /// QEMU's pid.
    pub fn pid(&self) -> Option<u32> {
        Some(self.pidfd.pid() as u32)
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
        self.pidfd.kill();
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

    fn kill(&self) {
        self.destroying.store(true, Ordering::SeqCst);
        self.fate.destroyed();
        self.pidfd.kill();
    }

    fn hostname(&self) -> Option<String> {
        let h = self.hostname.lock().expect("hostname lock").clone();
        Some(if h.is_empty() {
            format!("sbx-{}", &self.id[..12])
        } else {
            h
        })
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

    fn handle(&self) -> Option<GuestHandle> {
        Some(self.handle.clone())
    }

    fn leave_running(&self) {
        self.kept.store(true, Ordering::SeqCst);
    }
}

impl Drop for QemuGuest {
    fn drop(&mut self) {
        // Safety net for paths that forget `destroy` (and goldens dropped on stop): no
        // VM outlives its last reference unless it was left running on purpose. SIGKILL
        // now, not from the supervisor: on stop the runtime may end before it runs.
        if !self.destroying.load(Ordering::SeqCst) && !self.kept.load(Ordering::SeqCst) {
            self.pidfd.kill();
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

pub(super) fn random_id() -> String {
    let mut b = [0u8; 12];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
    hex::encode(b)
}
