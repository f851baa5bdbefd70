//! A sandbox's user namespace, made before bwrap runs: sandboxd (root) forks a holder
//! that becomes the first uid of the sandbox's block and unshares a user namespace, then
//! writes the holder's `uid_map`/`gid_map` itself (`0 FIRST LEN`: the block, nothing
//! else; writing more than one's own id needs CAP_SETUID in the host namespace, which
//! only sandboxd has), keeps an fd of the namespace and kills the holder. bwrap joins it
//! with `--userns FD`, running as the block's first uid on the host: the namespace's
//! owner, so it may, and nobody on the host gains a capability.
//!
//! The holder also sets the namespace's `user.max_user_namespaces` to 0 (it holds
//! CAP_SYS_RESOURCE there, briefly): no user namespace can be made inside, even with the
//! seccomp filter off (`unsafe_no_seccomp`); it is what bwrap's `--disable-userns`
//! does, which bwrap 0.8 allows only with its own `--unshare-user`.
//!
//! Why not bwrap's own `--unshare-user`: unprivileged, it can map one id only (its own),
//! so commands could run as one user; bwrap 0.8 cannot be handed a larger map.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};

/// Makes the namespace mapping ids `0 .. len` to host `uid .. uid + len` (gids alike)
/// and returns an fd of it. Blocks for a fork and a few writes.
pub fn prepare(uid: u32, gid: u32, len: u32) -> std::io::Result<OwnedFd> {
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let max_userns = c"/proc/sys/user/max_user_namespaces";
    // SAFETY: getpid has no failure mode and no side effect.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the child makes only async-signal-safe syscalls on values computed before
    // the fork, then waits to be killed; it never returns into Rust code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: as above: raw syscalls only, ending in _exit or a kill.
        unsafe {
            use std::os::fd::AsRawFd;
            let ok = libc::setgroups(0, std::ptr::null()) == 0
                && libc::setresgid(gid, gid, gid) == 0
                && libc::setresuid(uid, uid, uid) == 0
                && libc::unshare(libc::CLONE_NEWUSER) == 0;
            // Dies with sandboxd. Set after the id changes, which clear a death signal
            // set before them (commit_creds); and a parent already gone by now (sandboxd
            // SIGKILLed mid-launch) never sends it: this holder would pause forever.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            let fd = if ok {
                libc::open(max_userns.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC)
            } else {
                -1
            };
            if fd >= 0 && libc::write(fd, b"0".as_ptr().cast(), 1) == 1 {
                libc::write(ready_w.as_raw_fd(), b"1".as_ptr().cast(), 1);
                loop {
                    libc::pause();
                }
            }
            libc::_exit(1);
        }
    }
    drop(ready_w);
    let made = (|| {
        use std::io::Read;
        let mut byte = [0u8; 1];
        if std::fs::File::from(ready_r).read(&mut byte)? != 1 {
            return Err(std::io::Error::other(
                "the user-namespace holder could not become the block's uid, unshare, or \
                 set max_user_namespaces to 0",
            ));
        }
        let map = format!("0 {uid} {len}\n");
        let gmap = format!("0 {gid} {len}\n");
        // One write each: the kernel takes a map in a single write.
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{pid}/uid_map"))?
            .write_all(map.as_bytes())?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{pid}/gid_map"))?
            .write_all(gmap.as_bytes())?;
        let path = std::ffi::CString::new(format!("/proc/{pid}/ns/user")).expect("no NUL");
        // SAFETY: a plain open of a C string; the fd is owned below.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: open just returned this fd and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })();
    // The namespace lives on in the fd; the holder has done its part either way.
    let child = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(child, None);
    made
}
