//! Snapshots of process-engine sandboxes: the writable layer only (there is no memory
//! image of a process tree to take or restore). Each writable directory is read through
//! silkd as a tar (`TarOut`, as root) into the snapshot's directory; a fork is a fresh
//! sandbox of the same template with those tars unpacked (`TarIn`). Files are read while
//! the sandbox runs (silkd serves the tar from inside, so it cannot be frozen): a file
//! being written at that moment may be caught mid-write. Processes are not carried over,
//! and hibernation is refused: nothing would free the memory honestly.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use futures::SinkExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

use crate::engine::{Captured, Guest};
use crate::error::{Error, Result};
use crate::files::{next, unexpected, FILES_FRAME_MAX};

/// The writable directories a snapshot carries (`/run` holds silkd's socket: never).
const LAYER: [&str; 4] = ["/home", "/root", "/tmp", "/dev/shm"];
/// Bytes per `data` frame sent back into a fork.
const CHUNK: usize = 256 * 1024;

fn tar_name(dir: &str) -> String {
    format!("{}.tar", dir.trim_start_matches('/').replace('/', "_"))
}

/// Writes one tar per writable directory of `guest` into `dir`.
pub(super) async fn capture(guest: &dyn Guest, dir: &Path) -> Result<Captured> {
    for layer in LAYER {
        let path = dir.join(tar_name(layer));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(Error::io(format!("creating {}", path.display())))?;
        let mut file = tokio::fs::File::from_std(file);
        let mut conn = Framed::new(
            guest.dial().await?,
            HostCodec::new().with_max(FILES_FRAME_MAX),
        );
        conn.send(Request::TarOut(wire::files::PathArg {
            path: layer.into(),
            user: Some("root".into()),
        }))
        .await?;
        loop {
            match next(&mut conn).await? {
                Response::Data { data } => file
                    .write_all(&data)
                    .await
                    .map_err(Error::io(format!("writing {}", path.display())))?,
                Response::Done => break,
                other => return Err(unexpected(&other)),
            }
        }
        file.sync_all()
            .await
            .map_err(Error::io(format!("syncing {}", path.display())))?;
    }
    Ok(Captured { memory: false })
}

/// Unpacks the tars of a snapshot `dir` into the fresh `guest`.
pub(super) async fn unpack(guest: &dyn Guest, dir: &Path) -> Result<()> {
    for layer in LAYER {
        let path = dir.join(tar_name(layer));
        let mut file = tokio::fs::File::open(&path)
            .await
            .map_err(Error::io(format!("opening {}", path.display())))?;
        let mut conn = Framed::new(
            guest.dial().await?,
            HostCodec::new().with_max(FILES_FRAME_MAX),
        );
        conn.send(Request::TarIn(wire::files::TarIn {
            path: layer.into(),
            user: Some("root".into()),
        }))
        .await?;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = file
                .read(&mut buf)
                .await
                .map_err(Error::io(format!("reading {}", path.display())))?;
            if n == 0 {
                break;
            }
            conn.send(Request::Data {
                data: buf[..n].to_vec(),
            })
            .await?;
        }
        conn.send(Request::DataEnd).await?;
        match next(&mut conn).await? {
            Response::Done => {}
            other => return Err(unexpected(&other)),
        }
    }
    Ok(())
}
