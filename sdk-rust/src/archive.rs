//! Local directories as tar streams, on the client's side of `upload_dir` and
//! `download_dir`: packed while the upload is sent and unpacked while the download
//! arrives, on a blocking thread each, never staged whole. An archive from a sandbox is
//! untrusted: entries that are absolute or hold `..`, devices and FIFOs, hard links
//! leaving the directory, and any entry that would be written through a symlink are
//! refused before anything is written for them.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::Stream;
use tar::EntryType;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use wire::files::{inside_depth, DATA_CHUNK};

use crate::error::{Error, Result};

/// Pieces in flight between the tar thread and the connection: about 1 MiB.
const QUEUE: usize = 4;

/// Bits never applied to an unpacked file: setuid, setgid and sticky from a sandbox
/// must not land on the client's disk.
const MODE_MASK: u32 = 0o7000;

/// The tar stream of `dir` (entries `./...`, links stored as links, modes and mtimes
/// kept) as it is built, and the builder's outcome.
pub(crate) fn pack(
    dir: PathBuf,
) -> (
    impl Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    JoinHandle<Result<()>>,
) {
    let (tx, mut rx) = mpsc::channel::<std::io::Result<Bytes>>(QUEUE);
    let task = tokio::task::spawn_blocking(move || {
        let built = std::fs::metadata(&dir).and_then(|m| {
            if !m.is_dir() {
                return Err(std::io::Error::other("not a directory"));
            }
            let sink = ChunkWriter {
                tx: tx.clone(),
                buf: Vec::with_capacity(DATA_CHUNK),
            };
            let mut b = tar::Builder::new(sink);
            b.follow_symlinks(false);
            b.mode(tar::HeaderMode::Complete);
            b.append_dir_all(".", &dir)?;
            b.into_inner()?.flush()
        });
        match built {
            Ok(()) => Ok(()),
            // The other side stopped taking the body: the answer says why.
            Err(_) if tx.is_closed() => Ok(()),
            Err(e) => {
                // Fail the body too (a clean end would be a complete, shorter archive),
                // so the server sees a cut-off upload and commits nothing.
                let _ = tx.blocking_send(Err(std::io::Error::new(e.kind(), e.to_string())));
                Err(local("archiving", &dir, e))
            }
        }
    });
    (futures::stream::poll_fn(move |cx| rx.poll_recv(cx)), task)
}

/// Batches the builder's small writes into pieces of [`DATA_CHUNK`] for the body.
struct ChunkWriter {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl Write for ChunkWriter {
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
        let piece = std::mem::replace(&mut self.buf, Vec::with_capacity(DATA_CHUNK));
        self.tx
            .blocking_send(Ok(piece.into()))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the upload ended"))
    }
}

/// Where a download's body pieces go, and the unpacking thread's outcome.
pub(crate) struct Unpacker {
    pub(crate) tx: mpsc::Sender<std::io::Result<Bytes>>,
    pub(crate) task: JoinHandle<Result<()>>,
}

/// Starts unpacking into `dir` the archive whose pieces are then sent to `tx`; the
/// sender dropped after the last piece is the end. A `dir` that did not exist is
/// unpacked beside it and renamed into place at the end, so a refused or broken download
/// leaves nothing there; an existing one is merged into.
pub(crate) fn unpack(dir: PathBuf) -> Unpacker {
    let (tx, rx) = mpsc::channel(QUEUE);
    let task = tokio::task::spawn_blocking(move || unpack_from(&dir, rx));
    Unpacker { tx, task }
}

fn unpack_from(dir: &Path, rx: mpsc::Receiver<std::io::Result<Bytes>>) -> Result<()> {
    let staged = match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => None,
        Ok(_) => {
            return Err(Error::Local(format!(
                "{} exists and is not a directory",
                dir.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match dir.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            std::fs::create_dir_all(&parent).map_err(|e| local("creating", &parent, e))?;
            let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
            let tmp = parent.join(format!(
                ".{}.sbx-{}",
                name.unwrap_or_default(),
                std::process::id()
            ));
            std::fs::create_dir(&tmp).map_err(|e| local("creating", &tmp, e))?;
            Some(Staged(Some(tmp)))
        }
        Err(e) => return Err(local("reading", dir, e)),
    };
    let dest = staged
        .as_ref()
        .and_then(|s| s.0.clone())
        .unwrap_or_else(|| dir.to_path_buf());
    let mut archive = tar::Archive::new(PieceReader {
        rx,
        piece: Bytes::new(),
    });
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    archive.set_mask(MODE_MASK);
    let tar_err = |e: std::io::Error| local("unpacking into", dir, e);
    for entry in archive.entries().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        let name = entry.path().map_err(tar_err)?.into_owned();
        check_entry(&dest, &name, &entry)?;
        if inside_depth(&name) == Some(0) {
            continue; // the archive's root: `dest` itself
        }
        if !entry.unpack_in(&dest).map_err(tar_err)? {
            return Err(refused(&name, "leaves the directory"));
        }
    }
    // Read to the end: a body that breaks after the end-of-archive blocks is still a
    // broken download.
    let mut rest = archive.into_inner();
    std::io::copy(&mut rest, &mut std::io::sink()).map_err(tar_err)?;
    if let Some(mut staged) = staged {
        let tmp = staged.0.take().expect("a staged directory has its path");
        std::fs::rename(&tmp, dir).map_err(|e| local("renaming onto", dir, e))?;
    }
    Ok(())
}

fn refused(name: &Path, why: &str) -> Error {
    Error::Protocol(format!(
        "the sandbox sent archive entry {:?}, refused: {why}",
        name.to_string_lossy()
    ))
}

fn local(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Local(format!("{what} {}: {e}", path.display()))
}

/// Refuses an entry that could reach outside `dest` or make a device: checked on its
/// name, its type and, on disk, the directories it would be written in.
fn check_entry<R: Read>(dest: &Path, name: &Path, entry: &tar::Entry<'_, R>) -> Result<()> {
    inside_depth(name).ok_or_else(|| refused(name, "absolute or `..`"))?;
    match entry.header().entry_type() {
        // A symlink's target may be anything (a venv's `python -> /usr/bin/python3`):
        // it is stored, never followed while unpacking.
        EntryType::Regular | EntryType::Continuous | EntryType::Directory | EntryType::Symlink => {}
        EntryType::Link => {
            let target = entry
                .link_name()
                .ok()
                .flatten()
                .ok_or_else(|| refused(name, "hard link without a target"))?;
            inside_depth(&target)
                .ok_or_else(|| refused(name, "hard link leaving the directory"))?;
            no_symlink_on_the_way(dest, &target)?;
        }
        other => return Err(refused(name, &format!("entry type {other:?}"))),
    }
    no_symlink_on_the_way(dest, name)
}

/// Refuses `name` when a directory it would be written in (below `dest`) is a symlink,
/// whether an earlier entry made it or it was there before. An lstat walk rather than
/// `openat2(RESOLVE_NO_SYMLINKS)`: the `tar` crate writes by path, and on the client
/// nothing else is meant to be changing `dest` while it is unpacked.
fn no_symlink_on_the_way(dest: &Path, name: &Path) -> Result<()> {
    let mut at = dest.to_path_buf();
    let parents: Vec<_> = name
        .parent()
        .into_iter()
        .flat_map(|p| p.components())
        .collect();
    for c in parents {
        if let std::path::Component::Normal(part) = c {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(refused(name, "written through a symlink"))
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(local("reading", &at, e)),
            }
        }
    }
    Ok(())
}

/// The download's pieces as a `Read`; a closed queue is the end, an error piece a
/// broken download.
struct PieceReader {
    rx: mpsc::Receiver<std::io::Result<Bytes>>,
    piece: Bytes,
}

impl Read for PieceReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.piece.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(piece)) => self.piece = piece,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.piece.len());
        out[..n].copy_from_slice(&self.piece.split_to(n));
        Ok(n)
    }
}

/// A staging directory, removed unless it was renamed into place.
struct Staged(Option<PathBuf>);

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(tmp) = self.0.take() {
            let _ = std::fs::remove_dir_all(tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One raw tar entry, its name written verbatim (the builders refuse `..`).
    fn entry(name: &str, kind: EntryType, link: Option<&str>, body: &[u8]) -> Vec<u8> {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_mode(0o4755);
        h.set_size(body.len() as u64);
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend_from_slice(body);
        out.resize(out.len().div_ceil(512) * 512, 0);
        out
    }

    async fn unpack_bytes(dir: &Path, entries: &[Vec<u8>]) -> Result<()> {
        let u = unpack(dir.to_path_buf());
        let mut tar = entries.concat();
        tar.extend_from_slice(&[0; 1024]);
        // The thread may refuse before taking everything; a closed queue is fine then.
        let _ = u.tx.send(Ok(Bytes::from(tar))).await;
        drop(u.tx);
        u.task.await.unwrap()
    }

    #[tokio::test]
    async fn hostile_entries_are_refused_and_nothing_lands_outside() {
        use EntryType::*;
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir(r.join("out")).unwrap();
        let cases: Vec<Vec<Vec<u8>>> = vec![
            vec![entry("../evil", Regular, None, b"x")],
            vec![entry("/evil", Regular, None, b"x")],
            vec![entry("dev", Char, None, b"")],
            vec![entry("fifo", Fifo, None, b"")],
            vec![entry("hard", Link, Some("../evil"), b"")],
            // A symlink out, then a file written through it.
            vec![
                entry("l", Symlink, Some("../out"), b""),
                entry("l/evil", Regular, None, b"x"),
            ],
            vec![
                entry("l", Symlink, Some(r.join("out").to_str().unwrap()), b""),
                entry("l/evil", Regular, None, b"x"),
            ],
            // A symlink pointing inside is still not written through.
            vec![
                entry("d/", Directory, None, b""),
                entry("l", Symlink, Some("d"), b""),
                entry("l/f", Regular, None, b"x"),
            ],
        ];
        for (i, entries) in cases.iter().enumerate() {
            let dir = r.join(format!("t{i}"));
            let e = unpack_bytes(&dir, entries).await.unwrap_err();
            assert!(
                matches!(e, Error::Protocol(_) | Error::Local(_)),
                "case {i}: {e:?}"
            );
            assert!(!dir.exists(), "case {i}: the target was left");
            assert_eq!(
                std::fs::read_dir(r.join("out")).unwrap().count(),
                0,
                "case {i}"
            );
            assert!(!r.join("evil").exists(), "case {i}");
        }
        // A symlink already in an existing target is not written through either.
        let dir = r.join("existing");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(r.join("out"), dir.join("l")).unwrap();
        let e = unpack_bytes(&dir, &[entry("l/evil", Regular, None, b"x")]).await;
        assert!(matches!(e, Err(Error::Protocol(_))), "{e:?}");
        assert_eq!(std::fs::read_dir(r.join("out")).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn absolute_symlinks_are_kept_and_setuid_is_dropped() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("venv");
        let entries = [
            entry("bin/", EntryType::Directory, None, b""),
            entry(
                "bin/python",
                EntryType::Symlink,
                Some("/usr/bin/python3"),
                b"",
            ),
            entry("bin/tool", EntryType::Regular, None, b"#!/bin/sh\n"),
        ];
        unpack_bytes(&dir, &entries).await.unwrap();
        assert_eq!(
            std::fs::read_link(dir.join("bin/python")).unwrap(),
            Path::new("/usr/bin/python3")
        );
        let mode = std::fs::metadata(dir.join("bin/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
    }
}
