//! [`PortStream`]: a TCP connection to `127.0.0.1:port` inside a sandbox, through the
//! `ports/{port}` route upgraded to `tcp`; and [`Sandbox::connect_port`] that opens it.
//! Bytes pass unchanged both ways; `shutdown` is a half-close the sandbox's server sees
//! as EOF.

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::Result;
use crate::sandbox::Sandbox;

/// A byte stream to a TCP port inside a sandbox ([`Sandbox::connect_port`]).
pub struct PortStream {
    io: TokioIo<hyper::upgrade::Upgraded>,
}

impl std::fmt::Debug for PortStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortStream").finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Connects to `127.0.0.1:port` inside the sandbox. Nothing listening there is
    /// [`Error::Guest`](crate::Error::Guest) (HTTP 502); port 0 is
    /// [`Error::BadRequest`](crate::Error::BadRequest).
    pub async fn connect_port(&self, port: u16) -> Result<PortStream> {
        let path = self.path(&format!("ports/{port}"));
        let upgraded = self.http().upgrade(&path, self.token(), "tcp").await?;
        Ok(PortStream {
            io: TokioIo::new(upgraded),
        })
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
