//! Watching a directory with inotify, on the verb's thread: create, modify, delete and
//! rename events (a move within the watch is paired into one rename by its cookie; one
//! that leaves or enters the watch is a delete or a create). The thread polls the
//! inotify fd with a short timeout so a peer that left is noticed without an event.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use wire::files::{FsEvent, FsEventKind, MAX_LIST_DEPTH};
use wire::Response;

use super::{send, tree, Cancel};
use crate::conn::Out;
use crate::{Error, Result};

/// How often an idle watch checks whether its peer is still there.
const IDLE_CHECK_MS: u16 = 250;
/// Most directories one recursive watch follows (each is an inotify watch, a kernel
/// resource the guest's user limit also bounds).
const MAX_WATCHED_DIRS: usize = 8192;

/// Watches `path` until the peer leaves or the directory goes away.
pub fn run(path: &Path, recursive: bool, tx: &Out, cancel: &Cancel) -> Result<()> {
    let root = tree::stat(path)?;
    if root.kind != wire::files::FileKind::Dir {
        return Err(Error::BadRequest(format!(
            "{} is not a directory",
            path.display()
        )));
    }
    let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
        .map_err(|e| Error::fs("inotify for", path, e.into()))?;
    let mut w = Watcher {
        ino,
        dirs: HashMap::new(),
        recursive,
    };
    let root_wd = w
        .add(path)
        .map_err(|e| Error::fs("watching", path, e.into()))?;
    if recursive {
        w.add_tree(path, 1);
    }
    if !send(tx, cancel, Response::Stat(root)) {
        return Ok(());
    }
    loop {
        if cancel.is_set() || tx.is_closed() {
            return Ok(());
        }
        let mut fds = [PollFd::new(w.ino.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(IDLE_CHECK_MS)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(Error::fs("polling the watch on", path, e.into())),
        }
        let events = match w.ino.read_events() {
            Ok(ev) => ev,
            Err(nix::errno::Errno::EAGAIN) => continue,
            Err(e) => return Err(Error::fs("reading the watch on", path, e.into())),
        };
        let mut out = Vec::new();
        let mut moved_from: Vec<(u32, PathBuf)> = Vec::new();
        let mut root_gone = false;
        for ev in events {
            if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                w.dirs.remove(&ev.wd);
                root_gone |= ev.wd == root_wd;
                continue;
            }
            let Some(dir) = w.dirs.get(&ev.wd) else {
                continue;
            };
            let Some(name) = ev.name else {
                continue; // an event on the directory itself (IN_DELETE_SELF...)
            };
            let full = dir.join(name);
            let m = ev.mask;
            let kind = if m.contains(AddWatchFlags::IN_MOVED_FROM) {
                moved_from.push((ev.cookie, full));
                continue;
            } else if m.contains(AddWatchFlags::IN_MOVED_TO) {
                if m.contains(AddWatchFlags::IN_ISDIR) {
                    w.add_tree_and_root(&full);
                }
                match moved_from.iter().position(|(c, _)| *c == ev.cookie) {
                    Some(i) => {
                        let (_, from) = moved_from.remove(i);
                        out.push(event(FsEventKind::Rename, &full, Some(&from)));
                        continue;
                    }
                    None => FsEventKind::Create,
                }
            } else if m.contains(AddWatchFlags::IN_CREATE) {
                if m.contains(AddWatchFlags::IN_ISDIR) {
                    w.add_tree_and_root(&full);
                }
                FsEventKind::Create
            } else if m.contains(AddWatchFlags::IN_DELETE) {
                FsEventKind::Delete
            } else {
                FsEventKind::Modify
            };
            let e = event(kind, &full, None);
            // A write burst is many IN_MODIFY in a row: one event per burst.
            if kind == FsEventKind::Modify && out.last() == Some(&e) {
                continue;
            }
            out.push(e);
        }
        out.extend(
            moved_from
                .into_iter()
                .map(|(_, p)| event(FsEventKind::Delete, &p, None)),
        );
        for e in out {
            if !send(tx, cancel, Response::Event(e)) {
                return Ok(());
            }
        }
        if root_gone {
            return Ok(());
        }
    }
}

fn event(kind: FsEventKind, path: &Path, from: Option<&Path>) -> FsEvent {
    FsEvent {
        kind,
        path: path.to_string_lossy().into_owned(),
        from: from.map(|p| p.to_string_lossy().into_owned()),
    }
}

struct Watcher {
    ino: Inotify,
    dirs: HashMap<WatchDescriptor, PathBuf>,
    recursive: bool,
}

impl Watcher {
    fn add(&mut self, dir: &Path) -> nix::Result<WatchDescriptor> {
        let mask = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_DONT_FOLLOW
            | AddWatchFlags::IN_ONLYDIR;
        let wd = self.ino.add_watch(dir, mask)?;
        self.dirs.insert(wd, dir.to_path_buf());
        Ok(wd)
    }

    /// A directory that appeared under a recursive watch, with what it already holds.
    fn add_tree_and_root(&mut self, dir: &Path) {
        if self.recursive && self.dirs.len() < MAX_WATCHED_DIRS && self.add(dir).is_ok() {
            self.add_tree(dir, 1);
        }
    }

    /// Subdirectories of `dir`, depth first, within the bounds; unreadable ones skipped.
    fn add_tree(&mut self, dir: &Path, level: u32) {
        if level > MAX_LIST_DEPTH {
            return;
        }
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            if self.dirs.len() >= MAX_WATCHED_DIRS {
                return;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) && self.add(&e.path()).is_ok() {
                self.add_tree(&e.path(), level + 1);
            }
        }
    }
}
