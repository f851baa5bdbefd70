//! Pseudo-terminals for execs that ask for one: the pair opened at the requested window
//! size, the slave made the child's controlling terminal, the master resized while the
//! command runs. Owns no process state; `spawn` wires the fds, `conn` the I/O.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::pty::{openpty, Winsize};
use tokio::net::unix::pipe;

use crate::{Error, Result};

/// The two sides of a fresh pseudo-terminal.
pub struct Pair {
    /// Kept by silkd: output is read from it, stdin written to it, resizes done on it.
    pub master: OwnedFd,
    /// Becomes the child's stdin, stdout, stderr and controlling terminal.
    pub slave: OwnedFd,
}

fn winsize(rows: u32, cols: u32) -> Winsize {
    // Callers pass sizes checked against `wire::PTY_MAX_DIM`, which fits a u16.
    Winsize {
        ws_row: rows as u16,
        ws_col: cols as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Opens a pair at `rows` x `cols`. Both fds are close-on-exec, so no other command
/// inherits them (the slave reaches its child through dup2, which clears the flag).
pub fn open(rows: u32, cols: u32) -> Result<Pair> {
    let p = openpty(Some(&winsize(rows, cols)), None)
        .map_err(|e| Error::io("openpty", std::io::Error::from(e)))?;
    for fd in [&p.master, &p.slave] {
        fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
            .map_err(|e| Error::io("fcntl(FD_CLOEXEC) on a pty", std::io::Error::from(e)))?;
    }
    Ok(Pair {
        master: p.master,
        slave: p.slave,
    })
}

/// Runs in the child between fork and exec, after its stdio became the slave: a new
/// session (so the pid is also its process group id, as for every exec) whose
/// controlling terminal is fd 0. Two syscalls, async-signal-safe.
pub fn become_controlling() -> std::io::Result<()> {
    // SAFETY: setsid and ioctl take no pointers we own; both are async-signal-safe.
    unsafe {
        if libc::setsid() < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sets the window size. The kernel then sends SIGWINCH to the terminal's foreground
/// process group itself (`tty_do_resize`), so whatever is in front (the shell or the
/// program it runs) hears it, not only the group silkd started.
pub fn resize(master: &OwnedFd, rows: u32, cols: u32) -> Result<()> {
    let ws = winsize(rows, cols);
    // SAFETY: TIOCSWINSZ reads one Winsize from a pointer valid for the call.
    let r = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ as _, &ws) };
    if r < 0 {
        return Err(Error::io(
            "ioctl(TIOCSWINSZ)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// The master as async halves: a reader for the output pump and a writer for stdin.
/// Reading returns EIO once every slave fd is closed, which the pump takes as the end.
pub fn master_io(master: &OwnedFd) -> Result<(pipe::Receiver, pipe::Sender)> {
    let io = |what: &str, e: std::io::Error| Error::io(format!("pty master: {what}"), e);
    let rd = master.try_clone().map_err(|e| io("dup", e))?;
    let wr = master.try_clone().map_err(|e| io("dup", e))?;
    // One open file description: setting O_NONBLOCK once covers both dups.
    let flags = fcntl(rd.as_raw_fd(), FcntlArg::F_GETFL)
        .map_err(|e| io("F_GETFL", std::io::Error::from(e)))?;
    fcntl(
        rd.as_raw_fd(),
        FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
    )
    .map_err(|e| io("F_SETFL", std::io::Error::from(e)))?;
    let rd = pipe::Receiver::from_owned_fd_unchecked(rd).map_err(|e| io("register", e))?;
    let wr = pipe::Sender::from_owned_fd_unchecked(wr).map_err(|e| io("register", e))?;
    Ok((rd, wr))
}
