//! Engines turn a template + size into running guests and give sandboxd fresh byte streams
//! to their silkd. This module is the contract; it knows nothing of HTTP, claims or pools.
//!
//! An engine provides:
//! - golden hooks: `golden_inputs` (what its golden depends on, hashed into the stamp by
//!   the pool layer), `golden_present`, `boot_golden` and `seal_golden` (the pool layer
//!   runs the warmup between the two, through the guest channel);
//! - `start`: a new guest, cloned from the sealed golden when there is one, else booted
//!   cold; it returns once the guest's channel accepts connections;
//! - per guest: `dial` a fresh stream to silkd, `destroy` (idempotent, kills everything),
//!   and its [`Fate`]: every guest has a supervisor task that owns its process and
//!   records, once, how it ended.
//!
//! Restarts: a guest that can outlive sandboxd gives a [`GuestHandle`] (stored with its
//! claim); on start the engine `adopt`s each recorded handle whose guest is provably the
//! same one still running, then `sweep`s everything of its own that no kept handle owns.
//!
//! Engines: `process` (bubblewrap + cgroups) and `qemu` (`boot_golden` boots with a shared
//! memory file, `seal_golden` saves it with `x-ignore-shared`, `start` restores a clone
//! and reseeds it, `dial` opens a yamux stream over the virtio-serial port).

pub mod cgroup;
pub mod fate;
pub mod handle;
pub mod identity;
pub mod process;
pub mod qemu;

pub use self::fate::{Ending, Fate};
pub use self::handle::GuestHandle;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::config::{SizeConfig, TemplateConfig};
use crate::error::Result;

/// A byte stream to one silkd connection. Shutting down its write half is a half-close.
pub trait GuestIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> GuestIo for T {}

/// A boxed [`GuestIo`].
pub type GuestStream = Box<dyn GuestIo>;

/// Everything an engine needs to make a guest for one pool key.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    /// Template name.
    pub template: String,
    /// Size name.
    pub size: String,
    /// The template's settings.
    pub template_config: TemplateConfig,
    /// The size's settings.
    pub size_config: SizeConfig,
    /// Whether the guest boots without a balloon device (qemu).
    pub no_balloon: bool,
    /// Directory the engine may keep this key's golden artifacts in.
    pub golden_dir: PathBuf,
}

/// One running guest.
pub trait Guest: Send + Sync + 'static {
    /// Engine-assigned id, for logs.
    fn id(&self) -> &str;
    /// Opens a fresh byte stream to silkd.
    fn dial(&self) -> BoxFuture<'_, Result<GuestStream>>;
    /// Kills the guest and everything in it, and frees its resources. Idempotent; safe to
    /// call while other tasks still hold streams (they see EOF).
    fn destroy(&self) -> BoxFuture<'_, ()>;
    /// Stops the guest at once without waiting (SIGKILL to its namespace init or its VM):
    /// nothing in it runs on. `destroy` must still follow, to reap it and free what it
    /// holds; a release answers after this and leaves that to the background.
    fn kill(&self) {}
    /// How the guest ended, recorded by its engine's supervisor.
    fn fate(&self) -> &Fate;
    /// Why the guest died on its own (its VM or namespace init exited), once it has.
    /// Cheap: no round trip to the guest.
    fn failure(&self) -> Option<String> {
        self.fate().failure()
    }
    /// How the guest was made, for claim-tier metrics: `clone` (restored from a golden)
    /// or `cold` (booted).
    fn origin(&self) -> &'static str {
        "cold"
    }
    /// What finds this guest again after a restart; `None` when it cannot outlive
    /// sandboxd (the engine does not re-adopt, or it has not finished starting).
    fn handle(&self) -> Option<GuestHandle> {
        None
    }
    /// The hostname the guest was given, where the engine sets one (a woken guest keeps
    /// it).
    fn hostname(&self) -> Option<String> {
        None
    }
    /// sandboxd is stopping and leaves this guest running for the next start: nothing may
    /// kill it when its last reference goes.
    fn leave_running(&self) {}
}

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Captured {
    /// Memory and device state (a VM), or only the writable layer (`false`).
    pub memory: bool,
}

/// A guest-making backend.
pub trait Engine: Send + Sync + 'static {
    /// Name and facts for `/v1/info`, including limits it cannot apply on this host.
    fn info(&self) -> api::EngineInfo;
    /// Engine-specific inputs of a golden (image digest, options), hashed into its stamp.
    fn golden_inputs(&self, spec: &GuestSpec) -> Result<String>;
    /// True when the golden's artifacts exist, so a matching stamp can be trusted.
    fn golden_present(&self, spec: &GuestSpec) -> bool;
    /// Boots the guest the golden is made from.
    fn boot_golden<'a>(&'a self, spec: &'a GuestSpec) -> BoxFuture<'a, Result<Arc<dyn Guest>>>;
    /// Turns the warmed-up golden guest into the golden (snapshot); the guest is consumed.
    fn seal_golden<'a>(
        &'a self,
        spec: &'a GuestSpec,
        guest: Arc<dyn Guest>,
    ) -> BoxFuture<'a, Result<()>>;
    /// Starts a guest for `spec`, from its golden when sealed, else cold.
    fn start<'a>(&'a self, spec: &'a GuestSpec) -> BoxFuture<'a, Result<Arc<dyn Guest>>>;
    /// Re-opens a guest an earlier sandboxd started, from its record: an error when it
    /// is gone, or when anything in the record is not provably this engine's.
    fn adopt<'a>(&'a self, handle: &'a GuestHandle) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(async move {
            Err(crate::error::Error::Engine(format!(
                "the {} engine cannot re-adopt guest {}",
                self.info().name,
                handle.guest_id
            )))
        })
    }
    /// Writes a snapshot of the running `guest` (made for `spec`) into `dir`, a new empty
    /// directory private to sandboxd: consistent (one instant), never written again once
    /// this returns. With `resume` the guest runs on afterwards; without, it stays paused
    /// (hibernation destroys it next, so nothing it does after the instant is lost).
    /// What it captured says whether memory is in it. Files it wrote are left for the
    /// caller to delete on error.
    fn snapshot<'a>(
        &'a self,
        _spec: &'a GuestSpec,
        _guest: &'a dyn Guest,
        _dir: &'a Path,
        _resume: bool,
    ) -> BoxFuture<'a, Result<Captured>> {
        Box::pin(async move {
            Err(crate::error::Error::Conflict(format!(
                "the {} engine cannot snapshot sandboxes",
                self.info().name
            )))
        })
    }
    /// Starts a guest from a snapshot `dir` that [`Engine::snapshot`] wrote for `spec`,
    /// copy-on-write (many guests may start from one), with a fresh identity except
    /// `hostname` when given (a woken sandbox keeps its own).
    fn restore<'a>(
        &'a self,
        _spec: &'a GuestSpec,
        _dir: &'a Path,
        _hostname: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Arc<dyn Guest>>> {
        Box::pin(async move {
            Err(crate::error::Error::Conflict(format!(
                "the {} engine cannot restore snapshots",
                self.info().name
            )))
        })
    }
    /// Destroys every guest, socket, cgroup and file of this engine's that none of `keep`
    /// owns (what an earlier run left). Called once at start, after adoption.
    fn sweep(&self, _keep: &[GuestHandle]) {}
    /// Frees node-wide resources once every guest is destroyed or left running (daemon
    /// shutdown); `kept` guests are still running and keep theirs.
    fn shutdown(&self, _kept: bool) {}
}

/// The last `max` bytes of a log file, trimmed, lossily decoded, newlines shown as ` | `:
/// for error messages about a guest that died. Empty when the file cannot be read. Reads
/// only those bytes (a seek from the end), however large the file has grown.
pub fn log_tail(path: &Path, max: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut tail = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let from = len.saturating_sub(max as u64);
        if f.seek(SeekFrom::Start(from)).is_ok() {
            let _ = f.take(max as u64).read_to_end(&mut tail);
        }
    }
    String::from_utf8_lossy(&tail).trim().replace('\n', " | ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_tail_reads_only_the_end() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("log");
        let mut text = "x".repeat(1 << 20);
        text.push_str("\nlast line\n");
        std::fs::write(&p, text).unwrap();
        assert_eq!(super::log_tail(&p, 12), "x | last line");
        assert_eq!(super::log_tail(&tmp.path().join("none"), 12), "");
    }
}
