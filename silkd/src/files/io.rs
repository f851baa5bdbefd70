//! Reading and writing one file, on the verb's thread. A replacing write goes to a temp
//! file in the target's directory (same file system, so the rename is atomic), is
//! fsynced, renamed over the target, and the directory fsynced, all before the answer:
//! a reader never sees half a file, and an answered write survives a crash. A write
//! that does not reach `data_end` removes its temp file.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;
use wire::files::{FileEntry, FileKind, DATA_CHUNK};
use wire::Response;

use super::{send, Cancel, Chunk};
use crate::conn::Out;
use crate::{Error, Result};

/// Mode of a new file written without one.
const NEW_FILE_MODE: u32 = 0o644;

/// The metadata row for `m`, named `name`.
pub fn entry(name: String, m: &Metadata, target: Option<String>) -> FileEntry {
    let t = m.file_type();
    let kind = if t.is_file() {
        FileKind::File
    } else if t.is_dir() {
        FileKind::Dir
    } else if t.is_symlink() {
        FileKind::Symlink
    } else {
        FileKind::Other
    };
    FileEntry {
        name,
        kind,
        size: m.len(),
        mode: m.mode() & 0o7777,
        mtime: m.mtime(),
        target,
    }
}

/// The last component of `path`, for `stat` answers (`/` for the root).
pub fn base_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.to_string_lossy().into_owned(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Streams `[offset, offset + length)` of a regular file, clamped to its size when
/// opened: `stat` first (so the host knows the length before the bytes), then `data`.
pub fn read(
    path: &Path,
    offset: u64,
    length: Option<u64>,
    tx: &Out,
    cancel: &Cancel,
) -> Result<()> {
    // O_NONBLOCK: opening a FIFO must not hang the thread; it is refused just below.
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::fs("opening", path, e))?;
    let meta = f.metadata().map_err(|e| Error::fs("stat of", path, e))?;
    if !meta.is_file() {
        return Err(Error::BadRequest(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    let size = meta.len();
    let mut left = size.saturating_sub(offset).min(length.unwrap_or(u64::MAX));
    if !send(
        tx,
        cancel,
        Response::Stat(entry(base_name(path), &meta, None)),
    ) {
        return Ok(());
    }
    if left > 0 {
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| Error::fs("seeking in", path, e))?;
    }
    while left > 0 {
        let mut buf = vec![0u8; DATA_CHUNK.min(left as usize)];
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::fs("reading", path, e))?;
        if n == 0 {
            // Shrunk since it was opened: the host announced a length it cannot get.
            return Err(Error::fs(
                "reading",
                path,
                std::io::Error::other(format!("file shrank while read, {left} bytes short")),
            ));
        }
        buf.truncate(n);
        left -= n as u64;
        if !send(tx, cancel, Response::Data { data: buf }) {
            return Ok(());
        }
    }
    Ok(())
}

/// Writes the chunks into `path` (replacing it through a temp file, or appending), and
/// answers its metadata once everything is on disk.
pub fn write(
    path: &Path,
    mode: Option<u32>,
    append: bool,
    parents: bool,
    mut rx: mpsc::Receiver<Chunk>,
) -> Result<FileEntry> {
    if let Some(m) = mode {
        if m > 0o7777 {
            return Err(Error::BadRequest(format!(
                "mode {m:o} is not permission bits"
            )));
        }
    }
    let (Some(dir), Some(_)) = (path.parent(), path.file_name()) else {
        return Err(Error::BadRequest(format!(
            "{} names no file",
            path.display()
        )));
    };
    if parents {
        std::fs::create_dir_all(dir).map_err(|e| Error::fs("creating", dir, e))?;
    }
    if append {
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(mode.unwrap_or(NEW_FILE_MODE))
            .open(path)
            .map_err(|e| Error::fs("opening", path, e))?;
        copy_chunks(&mut rx, &mut f, path)?;
        return commit_file(&f, path, mode);
    }
    let keep_mode = match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            return Err(Error::BadRequest(format!(
                "{} is a directory",
                path.display()
            )))
        }
        Ok(m) => Some(m.mode() & 0o7777),
        Err(_) => None,
    };
    let mut staged = Staged::create(dir)?;
    copy_chunks(&mut rx, &mut staged.file, path)?;
    let mode = mode.or(keep_mode).unwrap_or(NEW_FILE_MODE);
    staged
        .file
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::fs("setting the mode of", &staged.path, e))?;
    staged
        .file
        .sync_all()
        .map_err(|e| Error::fs("syncing", &staged.path, e))?;
    std::fs::rename(&staged.path, path).map_err(|e| Error::fs("renaming onto", path, e))?;
    staged.committed = true;
    sync_dir(dir)?;
    let meta = std::fs::metadata(path).map_err(|e| Error::fs("stat of", path, e))?;
    Ok(entry(base_name(path), &meta, None))
}

/// Writes chunks until `End`; a queue that closes first is an interrupted write.
fn copy_chunks(rx: &mut mpsc::Receiver<Chunk>, out: &mut File, path: &Path) -> Result<()> {
    loop {
        match rx.blocking_recv() {
            Some(Chunk::Data(d)) => out
                .write_all(&d)
                .map_err(|e| Error::fs("writing", path, e))?,
            Some(Chunk::End) => return Ok(()),
            None => {
                return Err(Error::Interrupted(format!(
                    "the write of {} ended before data_end; nothing was committed",
                    path.display()
                )))
            }
        }
    }
}

fn commit_file(f: &File, path: &Path, mode: Option<u32>) -> Result<FileEntry> {
    if let Some(m) = mode {
        f.set_permissions(std::fs::Permissions::from_mode(m))
            .map_err(|e| Error::fs("setting the mode of", path, e))?;
    }
    f.sync_all().map_err(|e| Error::fs("syncing", path, e))?;
    let meta = f.metadata().map_err(|e| Error::fs("stat of", path, e))?;
    Ok(entry(base_name(path), &meta, None))
}

/// Makes a rename or create in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::fs("syncing the directory", dir, e))
}

/// A temp name in `dir`, unique within this silkd (pid + counter; `create_new` refuses
/// a clash with anything left by another process).
pub fn temp_name(dir: &Path, what: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".silkd-{}-{n}.{what}", std::process::id()))
}

/// A temp file beside the target, removed on drop unless committed.
struct Staged {
    path: PathBuf,
    file: File,
    committed: bool,
}

impl Staged {
    fn create(dir: &Path) -> Result<Staged> {
        let path = temp_name(dir, "tmp");
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::fs("creating a temp file in", dir, e))?;
        Ok(Staged {
            path,
            file,
            committed: false,
        })
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), "removing a temp file: {e}");
            }
        }
    }
}
