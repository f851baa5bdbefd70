//! The file verbs as sandboxd speaks them to silkd: each on a fresh guest stream, frames
//! through `wire` only, silkd's typed errors turned into this crate's. Knows nothing of
//! HTTP; `api/files.rs` moves the bytes between these streams and the client.

use futures::{SinkExt, StreamExt};
use tokio_util::codec::Framed;
use wire::files::FileEntry;
use wire::{ErrorKind, HostCodec, Request, Response};

use crate::error::{Error, Result};
use crate::guest::GuestConn;
use crate::sandbox::Sandbox;

/// Largest frame read on a file stream: a `data` frame (256 KiB) or an `entries` frame
/// (512 rows of names up to 4 KiB) with room for their framing. Per stream, so what a
/// hostile guest can make one request hold stays bounded.
pub const FILES_FRAME_MAX: usize = 3 * 1024 * 1024;

/// A fresh stream to the sandbox's silkd for one file request.
pub async fn connect(sandbox: &Sandbox) -> Result<GuestConn> {
    let stream = sandbox.guest().dial().await?;
    Ok(Framed::new(
        stream,
        HostCodec::new().with_max(FILES_FRAME_MAX),
    ))
}

/// The error a silkd `Error{kind, message}` on a file verb stands for.
pub fn guest_error(kind: ErrorKind, message: String) -> Error {
    match kind {
        ErrorKind::NotFound => Error::PathNotFound(message),
        ErrorKind::BadRequest => Error::BadRequest(message),
        ErrorKind::PermissionDenied => Error::PermissionDenied(message),
        ErrorKind::NoSpace => Error::NoSpace(message),
        ErrorKind::ResourceExhausted => Error::Busy {
            reason: format!("guest out of resources: {message}"),
            retry_after: 1,
        },
        ErrorKind::Unimplemented | ErrorKind::Internal => {
            Error::Guest(format!("{}: {message}", kind.as_str()))
        }
    }
}

/// The next frame of a file stream; an `Error` frame becomes its typed error, EOF a
/// guest failure.
pub async fn next(conn: &mut GuestConn) -> Result<Response> {
    match conn.next().await {
        Some(Ok(Response::Error { kind, message })) => Err(guest_error(kind, message)),
        Some(r) => Ok(r?),
        None => Err(Error::Guest("silkd closed the file stream".into())),
    }
}

/// Sends `req` on a fresh stream and returns that stream with the first answer.
pub async fn open(sandbox: &Sandbox, req: Request) -> Result<(GuestConn, Response)> {
    let mut conn = connect(sandbox).await?;
    conn.send(req).await?;
    let first = next(&mut conn).await?;
    Ok((conn, first))
}

/// A verb answered by one `stat` frame.
pub async fn stat_of(sandbox: &Sandbox, req: Request) -> Result<FileEntry> {
    match open(sandbox, req).await?.1 {
        Response::Stat(e) => Ok(e),
        other => Err(unexpected(&other)),
    }
}

/// A verb answered by `done`.
pub async fn done(sandbox: &Sandbox, req: Request) -> Result<()> {
    match open(sandbox, req).await?.1 {
        Response::Done => Ok(()),
        other => Err(unexpected(&other)),
    }
}

/// A frame silkd should not have sent here.
pub fn unexpected(r: &Response) -> Error {
    let mut text = format!("{r:?}");
    text.truncate(200);
    Error::Guest(format!("unexpected frame on a file stream: {text}"))
}

/// The HTTP form of a metadata row.
pub fn entry_json(e: FileEntry) -> api::files::FileEntry {
    use wire::files::FileKind;
    api::files::FileEntry {
        name: e.name,
        kind: match e.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        }
        .into(),
        size: e.size,
        mode: e.mode,
        mtime: e.mtime,
        target: e.target,
    }
}
