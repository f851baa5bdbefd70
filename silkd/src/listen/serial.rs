//! `serial:NAME` listener: the VM's virtio-serial port `/dev/virtio-ports/NAME`.
//!
//! One host session at a time. A session starts when the host connects (POLLHUP clears),
//! opens with the nonce handshake of `wire::session` (so no stale byte of an earlier
//! session is delivered), then runs yamux with one stream per RPC, each served by
//! `conn`. POLLHUP/EOF ends the session: every stream closes, which kills its exec.
//! Between sessions silkd sleeps on SIGIO (the driver signals host open/close), with a
//! 1 s re-check as a safety net, so an idle guest does not spin.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::signal::unix::{signal, SignalKind};

use crate::proc::ProcessTable;
use crate::{Error, Result};

/// The device path for a port name (or the path itself when given one).
pub fn port_path(name: &str) -> PathBuf {
    if name.starts_with('/') {
        PathBuf::from(name)
    } else {
        Path::new("/dev/virtio-ports").join(name)
    }
}

/// Serves host sessions on the port forever.
pub async fn serve(path: PathBuf, table: Arc<ProcessTable>) -> Result<()> {
    // The SIGIO handler must exist before O_ASYNC is set: SIGIO's default action kills.
    let mut sigio = signal(SignalKind::io()).map_err(|e| Error::io("installing SIGIO", e))?;
    let port = open_port(&path).await?;
    let mut session_no = 0u64;
    loop {
        wait_for_host(&port, &mut sigio).await;
        session_no += 1;
        let io = match SerialIo::new(&port) {
            Ok(io) => io,
            Err(e) => {
                tracing::error!("serial session setup: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(e) = run_session(io, &table).await {
            tracing::info!(session = session_no, "serial session ended: {e}");
        } else {
            tracing::debug!(session = session_no, "serial session ended");
        }
    }
}

async fn run_session(io: SerialIo, table: &Arc<ProcessTable>) -> std::io::Result<()> {
    let (hello, io) = wire::session::guest_handshake(io).await?;
    crate::init::apply_hello(&hello);
    let table = table.clone();
    wire::session::mux_server(io, move |stream| {
        tokio::spawn(crate::conn::serve(stream, table.clone()));
    })
    .await
}

async fn open_port(path: &Path) -> Result<OwnedFd> {
    // Ports appear asynchronously after the driver loads; wait for ours.
    let mut waited = Duration::ZERO;
    loop {
        match nix::fcntl::open(
            path,
            OFlag::O_RDWR | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
            nix::sys::stat::Mode::empty(),
        ) {
            Ok(fd) => {
                // SAFETY: open returned a fresh descriptor that nothing else owns.
                let fd: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
                enable_sigio(&fd)?;
                return Ok(fd);
            }
            Err(e) if waited < Duration::from_secs(10) => {
                if path.starts_with("/dev/virtio-ports") {
                    crate::init::link_virtio_ports();
                }
                if waited.is_zero() {
                    tracing::info!("waiting for {}: {e}", path.display());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                waited += Duration::from_millis(10);
            }
            Err(e) => {
                return Err(Error::io(
                    format!("opening {}", path.display()),
                    std::io::Error::from(e),
                ))
            }
        }
    }
}

fn enable_sigio(fd: &OwnedFd) -> Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: F_SETOWN on an fd we own, to our own pid.
    if unsafe { libc::fcntl(raw, libc::F_SETOWN, libc::getpid()) } < 0 {
        return Err(Error::io("F_SETOWN", std::io::Error::last_os_error()));
    }
    let flags = fcntl(raw, FcntlArg::F_GETFL).map_err(|e| Error::io("F_GETFL", e.into()))?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_ASYNC;
    fcntl(raw, FcntlArg::F_SETFL(flags)).map_err(|e| Error::io("F_SETFL O_ASYNC", e.into()))?;
    Ok(())
}

fn host_connected(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(
        fd.as_fd(),
        PollFlags::POLLIN | PollFlags::POLLOUT,
    )];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => !fds[0]
            .revents()
            .unwrap_or(PollFlags::empty())
            .contains(PollFlags::POLLHUP),
        Err(_) => false,
    }
}

/// Sleeps until a host is connected: SIGIO wakes us on connect, a 1 s timer re-checks.
async fn wait_for_host(fd: &OwnedFd, sigio: &mut tokio::signal::unix::Signal) {
    while !host_connected(fd) {
        tokio::select! {
            _ = sigio.recv() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// The port as non-blocking async I/O for one session. Read returns 0 when the host
/// leaves; a write while the host is away fails with `BrokenPipe` instead of queueing
/// bytes for the next session.
struct SerialIo {
    fd: AsyncFd<OwnedFd>,
}

impl SerialIo {
    fn new(port: &OwnedFd) -> std::io::Result<Self> {
        let fd = port.try_clone()?;
        // SAFETY: `fd` is an OwnedFd moved into the AsyncFd: it stays open and names the
        // same file description until the AsyncFd drops it.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(std::io::Error::from)?;
        Ok(SerialIo { fd })
    }
}

impl AsyncRead for SerialIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|inner| {
                nix::unistd::read(inner.get_ref().as_raw_fd(), unfilled)
                    .map_err(std::io::Error::from)
            }) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for SerialIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        loop {
            if !host_connected(self.fd.get_ref()) {
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "host left the serial port",
                )));
            }
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|inner| {
                nix::unistd::write(inner.get_ref(), data).map_err(std::io::Error::from)
            }) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
