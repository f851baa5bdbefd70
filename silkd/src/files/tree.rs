//! The metadata verbs, on the verb's thread: stat (links not followed), list (one level
//! or a bounded depth, streamed in frames), mkdir, remove, rename.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use wire::files::{FileEntry, ENTRIES_PER_FRAME};
use wire::Response;

use super::io::{base_name, entry};
use super::{send, Cancel};
use crate::conn::Out;
use crate::{Error, Result};

/// One path's metadata; a symlink is described, not followed.
pub fn stat(path: &Path) -> Result<FileEntry> {
    let m = std::fs::symlink_metadata(path).map_err(|e| Error::fs("stat of", path, e))?;
    Ok(entry(base_name(path), &m, link_target(path, &m)))
}

fn link_target(path: &Path, m: &std::fs::Metadata) -> Option<String> {
    m.file_type()
        .is_symlink()
        .then(|| std::fs::read_link(path).ok())
        .flatten()
        .map(|t| t.to_string_lossy().into_owned())
}

/// Lists `path` down to `depth` levels, sorted by name within each directory, in
/// `entries` frames. Subdirectories the user cannot open are listed without contents;
/// the listed directory itself must be readable.
pub fn list(path: &Path, depth: u32, tx: &Out, cancel: &Cancel) -> Result<()> {
    let m = std::fs::metadata(path).map_err(|e| Error::fs("stat of", path, e))?;
    if !m.is_dir() {
        return Err(Error::BadRequest(format!(
            "{} is not a directory",
            path.display()
        )));
    }
    let mut batch = Vec::with_capacity(ENTRIES_PER_FRAME);
    // Depth-first with an explicit stack of (directory, its name relative to `path`).
    let mut stack = vec![(path.to_path_buf(), String::new(), 1u32)];
    let mut first = true;
    while let Some((dir, rel, level)) = stack.pop() {
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if first => return Err(Error::fs("listing", &dir, e)),
            Err(_) => continue,
        };
        first = false;
        let mut names: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            let full = dir.join(&name);
            let Ok(m) = std::fs::symlink_metadata(&full) else {
                continue; // gone since read_dir
            };
            let name = if rel.is_empty() {
                name.to_string_lossy().into_owned()
            } else {
                format!("{rel}/{}", name.to_string_lossy())
            };
            if m.is_dir() && level < depth {
                subdirs.push((full.clone(), name.clone(), level + 1));
            }
            batch.push(entry(name, &m, link_target(&full, &m)));
            if batch.len() == ENTRIES_PER_FRAME {
                let entries = std::mem::take(&mut batch);
                if !send(tx, cancel, Response::Entries { entries }) {
                    return Ok(());
                }
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    if !batch.is_empty() {
        send(tx, cancel, Response::Entries { entries: batch });
    }
    Ok(())
}

/// Creates a directory (with `parents`, its missing parents too, and an existing
/// directory is success).
pub fn mkdir(path: &Path, parents: bool, mode: Option<u32>) -> Result<()> {
    let mode = mode.unwrap_or(0o755);
    if mode > 0o7777 {
        return Err(Error::BadRequest(format!(
            "mode {mode:o} is not permission bits"
        )));
    }
    std::fs::DirBuilder::new()
        .recursive(parents)
        .mode(mode)
        .create(path)
        .map_err(|e| Error::fs("creating", path, e))
}

/// Removes a file or link, an empty directory, or with `recursive` a whole tree (links
/// inside it are removed, never followed).
pub fn remove(path: &Path, recursive: bool) -> Result<()> {
    let m = std::fs::symlink_metadata(path).map_err(|e| Error::fs("stat of", path, e))?;
    let r = if m.is_dir() && recursive {
        std::fs::remove_dir_all(path)
    } else if m.is_dir() {
        std::fs::remove_dir(path)
    } else {
        std::fs::remove_file(path)
    };
    r.map_err(|e| Error::fs("removing", path, e))
}

/// Renames `from` to `to` (both in the sandbox).
pub fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to)
        .map_err(|e| Error::fs(&format!("renaming {} to", from.display()), to, e))
}
