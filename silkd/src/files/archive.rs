//! Directories as tar archives (the `tar` crate), on the verb's thread. Packing streams
//! the archive into `data` frames as it is built (links stored as links, never
//! followed). Unpacking reads the `data` frames as they come and refuses, before writing
//! it, any entry whose path is absolute or holds `..`, any hard link leaving the
//! directory, device or FIFO entries, and any entry that would be written through a
//! symlink (one an earlier entry made or one already there). A symlink's own target may
//! be anything (a venv's `python -> /usr/bin/python3`): it is stored, never followed. A
//! directory that did not
//! exist is unpacked into a temp directory beside it and renamed into place at the end,
//! so an interrupted or refused upload leaves nothing there.

use std::io::{Read, Write};
use std::path::{Component, Path};

use tar::EntryType;
use tokio::sync::mpsc;
use wire::files::{inside_depth, DATA_CHUNK};
use wire::Response;

use super::io::{sync_dir, temp_name};
use super::{send, Cancel, Chunk};
use crate::conn::Out;
use crate::{Error, Result};

/// Streams `path` (a directory) as a tar archive; entries are named `./...`.
pub fn pack(path: &Path, tx: &Out, cancel: &Cancel) -> Result<()> {
    let m = std::fs::metadata(path).map_err(|e| Error::fs("stat of", path, e))?;
    if !m.is_dir() {
        return Err(Error::BadRequest(format!(
            "{} is not a directory",
            path.display()
        )));
    }
    let sink = FrameSink {
        tx,
        cancel,
        buf: Vec::with_capacity(DATA_CHUNK),
    };
    let mut b = tar::Builder::new(sink);
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
    b.append_dir_all(".", path)
        .and_then(|()| b.into_inner())
        .and_then(|mut sink| sink.flush())
        .map_err(|e| Error::fs("archiving", path, e))
}

/// Batches the builder's small writes into `data` frames of [`DATA_CHUNK`].
struct FrameSink<'a> {
    tx: &'a Out,
    cancel: &'a Cancel,
    buf: Vec<u8>,
}

impl Write for FrameSink<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(DATA_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == DATA_CHUNK {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(DATA_CHUNK));
        if send(self.tx, self.cancel, Response::Data { data }) {
            Ok(())
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the peer left",
            ))
        }
    }
}

/// Unpacks the archive carried by the chunks into `path`.
pub fn unpack(path: &Path, rx: mpsc::Receiver<Chunk>) -> Result<()> {
    let staging = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => None,
        Ok(_) => {
            return Err(Error::BadRequest(format!(
                "{} exists and is not a directory",
                path.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = path
                .parent()
                .ok_or_else(|| Error::BadRequest("cannot unpack onto /".into()))?;
            std::fs::create_dir_all(parent).map_err(|e| Error::fs("creating", parent, e))?;
            let tmp = temp_name(parent, "unpack");
            std::fs::create_dir(&tmp).map_err(|e| Error::fs("creating", &tmp, e))?;
            Some(StagedDir {
                path: tmp,
                committed: false,
            })
        }
        Err(e) => return Err(Error::fs("stat of", path, e)),
    };
    let dest = staging.as_ref().map_or(path, |s| s.path.as_path());
    let mut archive = tar::Archive::new(ChunkReader {
        rx,
        buf: Vec::new(),
        pos: 0,
        ended: false,
    });
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let tar_err = |e: std::io::Error| Error::fs("unpacking into", path, e);
    for entry in archive.entries().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        let name = entry.path().map_err(tar_err)?.into_owned();
        check_entry(dest, &name, &entry)?;
        if name.components().all(|c| c == Component::CurDir) {
            continue; // the archive's root: `dest` itself
        }
        if !entry.unpack_in(dest).map_err(tar_err)? {
            return Err(refused(&name, "leaves the directory"));
        }
    }
    // Past the end-of-archive blocks: read to `data_end`, which alone proves the upload
    // complete (a peer that leaves here is still an interrupted upload).
    let mut rest = archive.into_inner();
    std::io::copy(&mut rest, &mut std::io::sink()).map_err(tar_err)?;
    if let Some(mut s) = staging {
        std::fs::rename(&s.path, path).map_err(|e| Error::fs("renaming onto", path, e))?;
        s.committed = true;
        if let Some(parent) = path.parent() {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

fn refused(name: &Path, why: &str) -> Error {
    Error::BadRequest(format!(
        "archive entry {:?} refused: {why}",
        name.to_string_lossy()
    ))
}

/// Refuses entries that could reach outside the directory or make devices: checked on
/// the name, the type and, on disk, the directories the entry would be written in.
fn check_entry<R: Read>(dest: &Path, name: &Path, entry: &tar::Entry<'_, R>) -> Result<()> {
    inside_depth(name).ok_or_else(|| refused(name, "absolute or `..`"))?;
    match entry.header().entry_type() {
        EntryType::Regular | EntryType::Continuous | EntryType::Directory | EntryType::Symlink => {}
        EntryType::Link => {
            let target = entry
                .link_name()
                .ok()
                .flatten()
                .ok_or_else(|| refused(name, "hard link without a target"))?;
            inside_depth(&target)
                .ok_or_else(|| refused(name, "hard link to outside the directory"))?;
            no_symlink_on_the_way(dest, name, &target)?;
        }
        other => {
            return Err(refused(
                name,
                &format!("entry type {other:?} is not unpacked"),
            ))
        }
    }
    no_symlink_on_the_way(dest, name, name)
}

/// Refuses `name` when a directory on the way to `path` (below `dest`) is a symlink. An
/// lstat walk, not `openat2(RESOLVE_NO_SYMLINKS)`, because the `tar` crate writes by path.
/// It stops the archive itself, whatever its entries; a process in the sandbox that swaps
/// a checked directory for a link between this walk and the write is not stopped (that
/// needs an unpacker writing through directory fds), but it only redirects a write made
/// with the acting user's file-system ids, so it matters only for an upload as another
/// user than the one racing.
fn no_symlink_on_the_way(dest: &Path, name: &Path, path: &Path) -> Result<()> {
    let mut at = dest.to_path_buf();
    for c in path.parent().into_iter().flat_map(|p| p.components()) {
        if let Component::Normal(part) = c {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(refused(name, "written through a symlink"))
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(Error::fs("stat of", &at, e)),
            }
        }
    }
    Ok(())
}

/// The peer's chunks as a `Read`: `End` is end of file, a closed queue an error.
struct ChunkReader {
    rx: mpsc::Receiver<Chunk>,
    buf: Vec<u8>,
    pos: usize,
    ended: bool,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.buf.len() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Chunk::Data(d)) => {
                    self.buf = d;
                    self.pos = 0;
                }
                Some(Chunk::End) => self.ended = true,
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the upload ended before data_end",
                    ))
                }
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// A directory unpacked into before it is renamed into place; removed unless committed.
struct StagedDir {
    path: std::path::PathBuf,
    committed: bool,
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            if let Err(e) = std::fs::remove_dir_all(&self.path) {
                tracing::warn!(path = %self.path.display(), "removing a staged directory: {e}");
            }
        }
    }
}
