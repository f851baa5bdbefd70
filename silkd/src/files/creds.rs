//! Running one file verb as a user: a dedicated OS thread whose file-system credentials
//! (fsuid, fsgid, supplementary groups) are the user's, for that thread only.
//!
//! Why a thread and not a forked helper: silkd is multi-threaded tokio, and fork from a
//! multi-threaded process may only call async-signal-safe functions until exec, which
//! rules out walking directories or building tar archives in the child. Linux keeps
//! credentials per thread: the raw `setfsuid`, `setfsgid` and `setgroups` syscalls change
//! the calling thread alone (glibc's `setgroups` wrapper would broadcast to every thread,
//! so it is not used). The kernel then checks every open, create and unlink against the
//! user, files are created owned by them, and moving the fsuid off 0 drops root's file
//! capabilities (CAP_DAC_OVERRIDE and friends) for the thread. The thread is never
//! reused: it ends with the verb, and its credentials with it.

use tokio::sync::oneshot;

use crate::proc::user::{self, Account};
use crate::{Error, Result};

/// The end of a verb's thread: its result, once it returns.
pub type Done<T> = oneshot::Receiver<Result<T>>;

/// Resolves who the request runs as (the exec rules: the request's `user`, else the
/// template's, else silkd's own) and starts `job` on a fresh thread as them.
pub fn spawn<T, F>(who: Option<&str>, name: &str, job: F) -> Result<Done<T>>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let switch = user::runner(who)?.switch;
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name(format!("files-{name}"))
        .spawn(move || {
            let result = match &switch {
                Some(a) => become_user(a).and_then(|()| job()),
                None => job(),
            };
            let _ = tx.send(result);
        })
        .map_err(|e| Error::io("starting a file thread", e))?;
    Ok(rx)
}

/// Waits for a verb's thread; a thread that panicked is an internal error, not a hang.
pub async fn join<T>(done: Done<T>) -> Result<T> {
    done.await.unwrap_or_else(|_| {
        Err(Error::io(
            "the file thread",
            std::io::Error::other("ended without an answer (panicked)"),
        ))
    })
}

/// Sets this thread's supplementary groups, fsgid and fsuid to the account's, and checks
/// that each took (setfsuid and setfsgid report failure only by leaving the id alone).
fn become_user(a: &Account) -> Result<()> {
    // SAFETY: the pointer and length describe `a.groups`, alive for the call; the raw
    // syscall changes this thread's groups only.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, a.groups.len(), a.groups.as_ptr()) };
    if rc != 0 {
        return Err(Error::io(
            format!("setgroups for {}", a.name),
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: setfsgid/setfsuid take an id and touch nothing else; an id of u32::MAX
    // (-1) is invalid, so the call only reports the current one.
    let (gid, uid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, a.gid);
        libc::syscall(libc::SYS_setfsuid, a.uid);
        (
            libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32,
            libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32,
        )
    };
    if (uid, gid) != (a.uid, a.gid) {
        return Err(Error::BadRequest(format!(
            "cannot act as {} (uid {}, gid {}): the file-system ids stayed {uid}/{gid}",
            a.name, a.uid, a.gid
        )));
    }
    Ok(())
}
