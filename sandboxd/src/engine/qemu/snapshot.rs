//! Snapshots of running VMs and the guests restored from them (forks, woken sandboxes).
//!
//! A running clone's RAM is a private mapping of its golden, which `x-ignore-shared` does
//! not skip; so a snapshot is made in two steps, and ends in exactly a golden's form:
//! 1. the VM is paused and migrated whole (RAM and devices, one instant: its writable
//!    layer is a tmpfs in that RAM) into `stream.tmp`, through an fd handed over QMP;
//!    then it runs on (or, hibernating, stays paused for its destroy);
//! 2. a helper QEMU that never runs the guest (`-incoming defer`, the source was paused
//!    so it stays paused) loads that stream into a fresh shared memory file on the
//!    memory dir's tmpfs, saves its device state with `x-ignore-shared` (≈ 100 KB), and
//!    is killed; the memory is copied (holes skipped) to `memory` on disk, the stream
//!    and the tmpfs file deleted; `memory` and `state.mig` are synced and sealed like a
//!    golden's (0440, clones' group).
//!
//! A fork is then a clone of those files (`share=off,readonly=on`, no discard, reseeded
//! clock, entropy, hostname), so any number of forks share the snapshot's pages.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::json;

use super::cmdline::{self, Memory};
use super::qmp::Qmp;
use super::{ignore_shared, private, QemuEngine, QemuGuest, MIGRATION_TIMEOUT};
use crate::engine::{Captured, Guest, GuestSpec};
use crate::error::{Error, Result};

/// The snapshot's guest RAM, mapped copy-on-write by every guest restored from it.
pub const MEMORY: &str = "memory";
/// Its device state (migration stream without RAM).
pub const STATE: &str = "state.mig";
const STATE_TMP: &str = "state.mig.tmp";
const STREAM_TMP: &str = "stream.tmp";

impl QemuEngine {
    /// Step 1 and 2 above, into the empty private `dir`.
    pub(super) async fn snapshot_guest(
        &self,
        spec: &GuestSpec,
        guest: &dyn Guest,
        dir: &Path,
        resume: bool,
    ) -> Result<Captured> {
        let handle = guest
            .handle()
            .filter(|h| h.engine == "qemu" && h.run_dir.parent() == Some(&*self.run_root))
            .ok_or_else(|| {
                Error::Conflict(format!("VM {} cannot be snapshotted now", guest.id()))
            })?;
        if self.template_disk == cmdline::TemplateDisk::Pmem {
            // The pmem region is a shared mapping of the image: a whole-RAM stream would
            // carry it, and the helper could not load it into its read-only mapping.
            return Err(Error::Conflict(
                "snapshots need `[qemu] template_disk = \"blk\"` (this node uses pmem)".into(),
            ));
        }
        let stream_path = dir.join(STREAM_TMP);
        let stream = private::create_file(&stream_path, 0o600)?;
        let mut qmp =
            Qmp::connect(&cmdline::qmp_socket(&handle.run_dir), self.boot_timeout).await?;
        let started = std::time::Instant::now();
        let saved = async {
            qmp.execute("stop", None).await?;
            // A clone restored with `x-ignore-shared` on; this stream carries all RAM and
            // its loader (the helper, whose RAM is shared) would refuse pages of a block
            // it ignores, so both ends run without it.
            qmp.execute("migrate-set-capabilities", Some(capability(false)))
                .await?;
            qmp.execute(
                "migrate-set-parameters",
                Some(json!({ "max-bandwidth": 100u64 << 30 })),
            )
            .await?;
            // `fd:` to a file is deprecated in QEMU 10 in favour of `file:/dev/fdset/N`,
            // which matches the fd's access mode against QEMU's own open flags; `fd:`
            // takes the descriptor as it is.
            qmp.send_fd("snapshot", stream.as_fd()).await?;
            qmp.execute("migrate", Some(json!({ "uri": "fd:snapshot" })))
                .await?;
            qmp.wait_migration(MIGRATION_TIMEOUT).await
        }
        .await;
        if resume || saved.is_err() {
            resume_source(&mut qmp, guest.id()).await;
        }
        let paused = started.elapsed();
        saved?;
        drop(stream);
        let sealed = self.seal_stream(spec, dir, &stream_path, !resume).await;
        tracing::info!(
            guest = guest.id(),
            ?paused,
            total = ?started.elapsed(),
            "snapshot written"
        );
        let _ = std::fs::remove_file(&stream_path);
        if sealed.is_err() && !resume {
            // A failed hibernation leaves the sandbox as it was: running.
            resume_source(&mut qmp, guest.id()).await;
        }
        sealed?;
        Ok(Captured { memory: true })
    }

    /// Step 2: the helper QEMU turns the whole stream into a memory file and a small
    /// device state.
    /// `evict`: drop the memory file from the page cache once synced (hibernation frees
    /// memory; a snapshot's pages stay cached for its forks).
    async fn seal_stream(
        &self,
        spec: &GuestSpec,
        dir: &Path,
        stream_path: &Path,
        evict: bool,
    ) -> Result<()> {
        let stream = std::fs::File::open(stream_path)
            .map_err(Error::io(format!("opening {}", stream_path.display())))?;
        let memory_path = dir.join(MEMORY);
        let state_tmp = dir.join(STATE_TMP);
        // The helper loads RAM into a file on the memory dir's tmpfs (as a golden's), not
        // into a shared mapping of a disk file, whose every first write of a page
        // allocates a block and dirties it for writeback while the load goes on; the
        // data is then copied to disk once, holes skipped. A crash leaves the tmpfs file
        // to the next start's sweep (anything there that is not a golden's).
        let staged_path = self
            .memory_dir
            .join(format!("snapshot-{}.mem", super::guest::random_id()));
        let staged = private::create_file(&staged_path, 0o600)?;
        let state = private::create_file(&state_tmp, 0o600)?;
        let boot = Self::boot_of(spec, Memory::GoldenShared, Some((&staged, &state)))?;
        let accel = self.accel().await;
        let helper = self.launch(accel, &boot, true, self.boot_timeout);
        let helper = match helper.await {
            Ok(h) => h,
            Err(e) => {
                let _ = std::fs::remove_file(&staged_path);
                return Err(e);
            }
        };
        let saved = async {
            let mut qmp =
                Qmp::connect(&cmdline::qmp_socket(&helper.run_dir), self.boot_timeout).await?;
            qmp.execute("migrate-set-capabilities", Some(capability(false)))
                .await?;
            qmp.send_fd("stream", stream.as_fd()).await?;
            qmp.execute("migrate-incoming", Some(json!({ "uri": "fd:stream" })))
                .await?;
            qmp.wait_migration(MIGRATION_TIMEOUT).await?;
            let status = qmp.execute("query-status", None).await?;
            if status.get("running").and_then(|r| r.as_bool()) != Some(false) {
                // It must never run: its writes would land in the shared file.
                return Err(Error::Engine(format!(
                    "the snapshot helper is not paused: {status}"
                )));
            }
            // Its own save leaves the (shared) RAM out: device state only, like a golden's.
            qmp.execute("migrate-set-capabilities", Some(ignore_shared()))
                .await?;
            qmp.execute(
                "migrate-set-parameters",
                Some(json!({ "max-bandwidth": 100u64 << 30 })),
            )
            .await?;
            qmp.execute("migrate", Some(json!({ "uri": cmdline::state_uri() })))
                .await?;
            qmp.wait_migration(MIGRATION_TIMEOUT).await
        }
        .await;
        let saved = saved.map_err(|e| helper.launch_error(e));
        helper.kill_and_clean().await;
        let copied = saved.and_then(|()| {
            let memory = private::create_file(&memory_path, 0o600)?;
            copy_sparse(&staged, &memory)
                .map_err(Error::io(format!("copying into {}", memory_path.display())))?;
            Ok(memory)
        });
        let _ = std::fs::remove_file(&staged_path);
        drop(staged);
        let memory = copied?;
        let (mode, gid) = self.sealed();
        let owner = gid.map(|g| (nix::unistd::geteuid().as_raw(), g));
        private::hand_over(&memory, &memory_path, owner, mode)?;
        private::hand_over(&state, &state_tmp, owner, mode)?;
        memory
            .sync_all()
            .and_then(|_| state.sync_all())
            .map_err(Error::io(format!("syncing {}", dir.display())))?;
        if evict {
            drop_cache(&memory);
        }
        std::fs::rename(&state_tmp, dir.join(STATE))
            .map_err(Error::io(format!("renaming {}", state_tmp.display())))
    }

    /// A guest restored from the snapshot in `dir`: a clone of its files.
    pub(super) async fn restore_guest(
        &self,
        spec: &GuestSpec,
        dir: &Path,
        hostname: Option<&str>,
    ) -> Result<Arc<QemuGuest>> {
        let (mode, gid) = self.sealed();
        let memory = private::open_verified(&dir.join(MEMORY), mode, gid)?;
        let state = private::open_verified(&dir.join(STATE), mode, gid)?;
        let guest = self.clone_files(spec, &memory, &state, hostname).await?;
        guest.cloned.store(true, Ordering::Relaxed);
        Ok(guest)
    }
}

/// Copies `src` into the empty `dst`, data extents only (`SEEK_DATA`/`SEEK_HOLE`), so a
/// guest's untouched RAM stays a hole; `dst` gets `src`'s length.
fn copy_sparse(src: &std::fs::File, dst: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = src.metadata()?.len() as i64;
    let (s, d) = (src.as_raw_fd(), dst.as_raw_fd());
    let mut pos: i64 = 0;
    while pos < len {
        // SAFETY: lseek on a descriptor we own; no memory is passed.
        let data = unsafe { libc::lseek(s, pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole is left
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(s, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (mut off_in, mut off_out) = (data, data);
        while off_in < hole {
            // SAFETY: both descriptors are ours; the offsets are locals it updates.
            let n = unsafe {
                libc::copy_file_range(s, &mut off_in, d, &mut off_out, (hole - off_in) as usize, 0)
            };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if n == 0 {
                return Err(std::io::Error::other("copy_file_range stopped short"));
            }
        }
        pos = hole;
    }
    dst.set_len(len as u64)
}

fn capability(on: bool) -> serde_json::Value {
    json!({ "capabilities": [{ "capability": "x-ignore-shared", "state": on }] })
}

/// Lets the paused source run on: a failed snapshot changes nothing for it.
async fn resume_source(qmp: &mut Qmp, guest: &str) {
    if let Err(e) = qmp.execute("cont", None).await {
        tracing::warn!(guest, "resuming after a snapshot: {e}");
    }
}

/// Drops a written file's pages from the page cache: a hibernated sandbox's memory is to
/// leave host RAM.
fn drop_cache(file: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise on a file descriptor we own; advice only, no memory touched.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}
