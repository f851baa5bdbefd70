//! `Connect{port}`: a stream whose first frame asks for `127.0.0.1:port` becomes that TCP
//! connection. The dial is answered with one frame (`Done`, or `Error` ending the stream);
//! after `Done` the stream carries raw bytes both ways, unparsed, and EOF on either side is
//! passed on as a half-close of the other. Nothing here reads or writes frames past that one.

use std::net::{Ipv4Addr, SocketAddr};

use bytes::BytesMut;
use futures::SinkExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::FramedWrite;
use wire::{ErrorKind, GuestCodec, Response};

/// Dials the port, answers, then copies until both directions have ended. `early` is
/// what the peer sent past the `Connect` frame: it goes to the TCP side first.
pub async fn serve<S>(mut stream: S, early: BytesMut, port: u16)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let answer = dial(port).await;
    let mut out = FramedWrite::new(&mut stream, GuestCodec::new());
    let mut tcp = match answer {
        Ok(tcp) => {
            if out.send(Response::Done).await.is_err() {
                return;
            }
            tcp
        }
        Err(refusal) => {
            let _ = out.send(refusal).await;
            let _ = stream.shutdown().await;
            return;
        }
    };
    if !early.is_empty() && tcp.write_all(&early).await.is_err() {
        return;
    }
    match tokio::io::copy_bidirectional(&mut stream, &mut tcp).await {
        Ok((up, down)) => tracing::debug!(port, up, down, "tunnel closed"),
        Err(e) => tracing::debug!(port, "tunnel ended: {e}"),
    }
}

/// Connects to `127.0.0.1:port`, or the `Error` frame saying why not.
async fn dial(port: u16) -> Result<TcpStream, Response> {
    if port == 0 {
        return Err(Response::error(
            ErrorKind::BadRequest,
            "port 0 is not a port",
        ));
    }
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect(addr).await.map_err(|e| {
        let kind = match e.kind() {
            // Nothing listens there (yet): the caller's to fix, like a missing path.
            std::io::ErrorKind::ConnectionRefused => ErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            _ => match e.raw_os_error() {
                Some(libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE) => {
                    ErrorKind::ResourceExhausted
                }
                _ => ErrorKind::Internal,
            },
        };
        Response::error(kind, format!("connecting to 127.0.0.1:{port}: {e}"))
    })
}
