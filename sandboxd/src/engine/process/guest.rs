//! One process-engine sandbox: bwrap's process tree, owned by a supervisor task that
//! records its end in the guest's [`Fate`] (waiting for bwrap as our child, or through a
//! pidfd once a later sandboxd re-adopted it); its cgroup and directory; `dial` (a Unix
//! socket), and the teardown that kills the namespace and removes everything. Processes
//! are signalled through pidfds only, so a reused pid is never hit.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::net::UnixStream;
use tokio::process::Child;
use tokio::sync::watch;

use crate::engine::cgroup::Cgroup;
use crate::engine::handle::PidFd;
use crate::engine::{log_tail, Fate, Guest, GuestHandle, GuestStream};
use crate::error::{Error, Result};

/// One sandbox: bwrap's process tree, its cgroup and its directory.
pub(super) struct ProcessGuest {
    pub(super) id: String,
    pub(super) dir: PathBuf,
    pub(super) socket: PathBuf,
    pub(super) cgroup: Mutex<Option<Cgroup>>,
    /// (bwrap, pid-namespace init), as far as known.
    pub(super) pids: Mutex<(Option<PidFd>, Option<PidFd>)>,
    /// What a later sandboxd finds it by, once it has started.
    pub(super) handle: Mutex<Option<GuestHandle>>,
    /// Set when sandboxd stops and leaves it running: dropping it then kills nothing.
    pub(super) kept: AtomicBool,
    pub(super) fate: Fate,
    /// True once the supervisor reaped bwrap.
    pub(super) exited: watch::Receiver<bool>,
    /// True once a supervisor owns bwrap (so `exited` will turn true).
    pub(super) supervised: AtomicBool,
    pub(super) destroyed: AtomicBool,
    /// The host uid the sandbox runs as, returned to the range when the guest is dropped
    /// (after teardown killed every process holding it).
    pub(super) _identity: Option<crate::engine::identity::Identity>,
}

impl ProcessGuest {
    /// Hands bwrap to a task that waits for it; an exit nobody asked for is the guest's
    /// failure (silkd, or the namespace init, died), recorded once in its [`Fate`].
    pub(super) fn supervise(&self, mut child: Child, exited: watch::Sender<bool>) {
        self.supervised.store(true, Ordering::SeqCst);
        let (fate, id, dir) = (self.fate.clone(), self.id.clone(), self.dir.clone());
        let rest = self.cgroup.lock().expect("cgroup lock").clone();
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(s) => s.to_string(),
                Err(e) => format!("waiting for bwrap: {e}"),
            };
            kill_rest(rest);
            let tail = log_tail(&dir.join("log"), 600);
            fate.fail(format!(
                "sandbox {id} exited on its own (silkd or its namespace init died; \
                 bwrap {status}); log: [{tail}]"
            ));
            let _ = exited.send(true);
        });
    }

    /// Watches bwrap of a re-adopted sandbox (not our child: init reaps it) through its
    /// pidfd; its exit is the guest's failure, as for [`ProcessGuest::supervise`].
    pub(super) fn supervise_pidfd(&self, bwrap: PidFd, exited: watch::Sender<bool>) {
        self.supervised.store(true, Ordering::SeqCst);
        let (fate, id, dir) = (self.fate.clone(), self.id.clone(), self.dir.clone());
        let rest = self.cgroup.lock().expect("cgroup lock").clone();
        tokio::spawn(async move {
            let how = match bwrap.exited().await {
                Ok(()) => "bwrap exited".to_string(),
                Err(e) => format!("watching bwrap: {e}"),
            };
            kill_rest(rest);
            let tail = log_tail(&dir.join("log"), 600);
            fate.fail(format!(
                "sandbox {id} exited on its own (silkd or its namespace init died; {how}); \
                 log: [{tail}]"
            ));
            let _ = exited.send(true);
        });
    }

    /// Polls for silkd's socket until it accepts, bwrap exits, or the bound passes.
    pub(super) async fn wait_socket(&self, bound: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if UnixStream::connect(&self.socket).await.is_ok() {
                return Ok(());
            }
            if *self.exited.borrow() {
                let why = self.fate.failure().unwrap_or_default();
                return Err(self.failed(format!("bwrap exited early: {why}")).await);
            }
            if start.elapsed() > bound {
                return Err(self
                    .failed(format!("silkd socket not ready after {bound:?}"))
                    .await);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Destroys a guest that failed to start and builds the error, with bwrap's log.
    pub(super) async fn failed(&self, what: String) -> Error {
        let tail = log_tail(&self.dir.join("log"), 2000);
        self.teardown().await;
        Error::Engine(format!("sandbox {}: {what}; log: [{tail}]", self.id))
    }

    /// SIGKILLs the namespace init (the kernel then kills every process in the pid
    /// namespace), bwrap itself, and anything left in the cgroup.
    fn kill_now(&self) {
        let pids = self.pids.lock().expect("pids lock");
        for p in [&pids.1, &pids.0].into_iter().flatten() {
            p.kill();
        }
        if let Some(cg) = self.cgroup.lock().expect("cgroup lock").as_ref() {
            cg.kill_all();
        }
    }

    async fn teardown(&self) {
        if self.destroyed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.fate.destroyed();
        // The namespace init first: its death takes the whole pid namespace, and bwrap,
        // its parent, then reaps it and exits by itself. Killing bwrap first would orphan
        // the init to the host's pid 1, which may never reap it.
        if let Some(init) = &self.pids.lock().expect("pids lock").1 {
            init.kill();
        }
        if self.supervised.load(Ordering::SeqCst) {
            let mut exited = self.exited.clone();
            let reaped = tokio::time::timeout(Duration::from_secs(1), exited.wait_for(|e| *e));
            if reaped.await.is_err() {
                self.kill_now();
                let reaped = tokio::time::timeout(Duration::from_secs(5), exited.wait_for(|e| *e));
                if reaped.await.is_err() {
                    tracing::warn!(id = %self.id, "bwrap did not exit 5 s after SIGKILL");
                }
            }
        }
        let cgroup = self.cgroup.lock().expect("cgroup lock").take();
        let dir = self.dir.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(cg) = cgroup {
                cg.remove();
            }
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), "cannot remove sandbox dir: {e}");
            }
        })
        .await;
    }
}

/// Once bwrap is gone the sandbox is dead: whatever it leaves in its cgroup (bwrap no
/// longer dies with sandboxd, so neither does its tree with bwrap) is killed at once.
fn kill_rest(cgroup: Option<Cgroup>) {
    if let Some(cg) = cgroup {
        cg.kill_all();
    }
}

impl Guest for ProcessGuest {
    fn id(&self) -> &str {
        &self.id
    }

    fn dial(&self) -> BoxFuture<'_, Result<GuestStream>> {
        Box::pin(async move {
            if self.destroyed.load(Ordering::SeqCst) {
                return Err(Error::Guest(format!("sandbox {} is destroyed", self.id)));
            }
            let stream = UnixStream::connect(&self.socket)
                .await
                .map_err(|e| Error::Guest(format!("connecting to silkd: {e}")))?;
            Ok(Box::new(stream) as GuestStream)
        })
    }

    fn destroy(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.teardown())
    }

    fn kill(&self) {
        // As `teardown` starts: the exit that follows is asked for, not a failure.
        self.fate.destroyed();
        if let Some(init) = &self.pids.lock().expect("pids lock").1 {
            init.kill();
        }
    }

    fn fate(&self) -> &Fate {
        &self.fate
    }

    fn handle(&self) -> Option<GuestHandle> {
        self.handle.lock().expect("handle lock").clone()
    }

    fn leave_running(&self) {
        self.kept.store(true, Ordering::SeqCst);
    }
}

impl Drop for ProcessGuest {
    fn drop(&mut self) {
        // Safety net for paths that forget `destroy`: never leave processes behind.
        if !self.destroyed.load(Ordering::SeqCst) && !self.kept.load(Ordering::SeqCst) {
            tracing::warn!(id = %self.id, "sandbox dropped without destroy; killing it");
            self.kill_now();
            if let Some(cg) = self.cgroup.lock().expect("cgroup lock").take() {
                cg.kill_all();
                std::thread::spawn(move || cg.remove());
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
