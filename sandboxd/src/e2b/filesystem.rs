//! `filesystem.Filesystem` onto silkd's file verbs: `Stat`, `ListDir`, `MakeDir`,
//! `Move`, `Remove`; `WatchDir` (a server stream, the async SDK's watch) and the polled
//! watchers (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`, the sync SDK's), both
//! on silkd's `watch`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use wire::files::{self as wf, FileEntry, FileKind, FsEvent, FsEventKind};
use wire::{Request as Verb, Response as Answer};

use super::connect::{self, Stream};
use super::rest::rfc3339;
use super::{E2b, User};
use crate::api::Body;
use crate::claims::Sandbox;
use crate::error::{Error, Result};
use crate::files::{self, unexpected};

/// Polled watchers held at once, node-wide: each holds a guest stream and a task.
const MAX_WATCHERS: usize = 256;
/// Polled watchers one sandbox may hold, so one client cannot take them all.
const MAX_WATCHERS_PER_SANDBOX: usize = 32;
/// Events a polled watcher keeps between polls; older ones are dropped.
const MAX_PENDING_EVENTS: usize = 4096;

#[derive(Deserialize)]
struct PathReq {
    path: String,
}

#[derive(Deserialize)]
struct ListReq {
    path: String,
    #[serde(default)]
    depth: u32,
}

#[derive(Deserialize)]
struct MoveReq {
    source: String,
    destination: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchReq {
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherReq {
    #[serde(alias = "watcher_id")]
    watcher_id: String,
}

/// One polled watcher: its events so far and the task filling them.
struct Watcher {
    sandbox: String,
    events: Arc<Mutex<VecDeque<Value>>>,
    task: JoinHandle<()>,
}

/// The polled watchers, by id.
#[derive(Default)]
pub(super) struct Watchers(Mutex<HashMap<String, Watcher>>);

impl Drop for Watchers {
    fn drop(&mut self) {
        for w in self.0.get_mut().expect("watchers lock").values() {
            w.task.abort();
        }
    }
}

/// Serves one `filesystem.Filesystem` method.
pub(super) async fn call(
    e2b: &E2b,
    sandbox: Arc<Sandbox>,
    method: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let stream = connect::is_stream(req.headers());
    let user = match super::basic_user(req.headers()) {
        Ok(u) => u,
        Err(e) => return connect::error_response(&e, stream),
    };
    let answer = match method {
        "Stat" => stat(e2b, &sandbox, &user, req).await,
        "ListDir" => list(e2b, &sandbox, &user, req).await,
        "MakeDir" => return make_dir(e2b, &sandbox, &user, req).await,
        "Move" => rename(e2b, &sandbox, &user, req).await,
        "Remove" => remove(e2b, &sandbox, &user, req).await,
        "WatchDir" => watch_dir(e2b, &sandbox, &user, req).await,
        "CreateWatcher" => create_watcher(e2b, &sandbox, &user, req).await,
        "GetWatcherEvents" => watcher_events(e2b, &sandbox, req).await,
        "RemoveWatcher" => remove_watcher(e2b, &sandbox, req).await,
        _ => Err(Error::NotFound),
    };
    answer.unwrap_or_else(|e| connect::error_response(&e, stream))
}

fn join(dir: &str, rel: &str) -> String {
    if rel.is_empty() || rel == "." {
        dir.to_string()
    } else {
        format!("{}/{rel}", dir.trim_end_matches('/'))
    }
}

/// E2B's `EntryInfo` for silkd's entry at `path`.
fn entry_info(e: &FileEntry, path: &str) -> Value {
    let (kind, letter) = match e.kind {
        FileKind::File => ("FILE_TYPE_FILE", '-'),
        FileKind::Dir => ("FILE_TYPE_DIRECTORY", 'd'),
        FileKind::Symlink => ("FILE_TYPE_SYMLINK", 'l'),
        FileKind::Other => ("FILE_TYPE_UNSPECIFIED", '?'),
    };
    let mut perms = String::from(letter);
    for shift in [6, 3, 0] {
        let bits = (e.mode >> shift) & 7;
        perms.push(if bits & 4 != 0 { 'r' } else { '-' });
        perms.push(if bits & 2 != 0 { 'w' } else { '-' });
        perms.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    let name = e.name.rsplit('/').next().unwrap_or(&e.name);
    let mut v = json!({
        "name": name,
        "type": kind,
        "path": path,
        "size": e.size.to_string(),
        "mode": e.mode,
        "permissions": perms,
        "owner": "",
        "group": "",
        "modifiedTime": rfc3339(e.mtime.max(0) as u64),
    });
    if let Some(t) = &e.target {
        v["symlinkTarget"] = Value::from(t.as_str());
    }
    v
}

async fn stat_entry(sandbox: &Sandbox, user: &User, path: &str) -> Result<Value> {
    let verb = Verb::Stat(wf::PathArg {
        path: path.to_string(),
        user: user.clone(),
    });
    Ok(entry_info(&files::stat_of(sandbox, verb).await?, path))
}

async fn stat(
    e2b: &E2b,
    sandbox: &Sandbox,
    user: &User,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let body: PathReq = connect::read_unary(e2b, req).await?;
    Ok(connect::ok(
        json!({"entry": stat_entry(sandbox, user, &body.path).await?}),
    ))
}

async fn list(
    e2b: &E2b,
    sandbox: &Sandbox,
    user: &User,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let body: ListReq = connect::read_unary(e2b, req).await?;
    let verb = Verb::List(wf::List {
        path: body.path.clone(),
        depth: body.depth.max(1),
        user: user.clone(),
    });
    let (mut conn, mut frame) = files::open(sandbox, verb).await?;
    let mut entries = Vec::new();
    loop {
        match frame {
            Answer::Entries { entries: rows } => {
                for e in rows {
                    entries.push(entry_info(&e, &join(&body.path, &e.name)));
                }
            }
            Answer::Done => break,
            other => return Err(unexpected(&other)),
        }
        frame = files::next(&mut conn).await?;
    }
    Ok(connect::ok(json!({"entries": entries})))
}

/// `mkdir -p`, answered `already_exists` when the path is there (the SDK returns False).
async fn make_dir(
    e2b: &E2b,
    sandbox: &Sandbox,
    user: &User,
    req: Request<Incoming>,
) -> Response<Body> {
    let run = async {
        let body: PathReq = connect::read_unary(e2b, req).await?;
        match stat_entry(sandbox, user, &body.path).await {
            Ok(_) => return Ok(None),
            Err(Error::PathNotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let verb = Verb::Mkdir(wf::Mkdir {
            path: body.path.clone(),
            parents: true,
            mode: None,
            user: user.clone(),
        });
        files::done(sandbox, verb).await?;
        Ok(Some(stat_entry(sandbox, user, &body.path).await?))
    };
    match run.await {
        Ok(Some(entry)) => connect::ok(json!({"entry": entry})),
        Ok(None) => connect::already_exists("the directory already exists"),
        Err(e) => connect::error_response(&e, false),
    }
}

async fn rename(
    e2b: &E2b,
    sandbox: &Sandbox,
    user: &User,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let body: MoveReq = connect::read_unary(e2b, req).await?;
    let verb = Verb::Rename(wf::Rename {
        from: body.source,
        to: body.destination.clone(),
        user: user.clone(),
    });
    files::done(sandbox, verb).await?;
    Ok(connect::ok(
        json!({"entry": stat_entry(sandbox, user, &body.destination).await?}),
    ))
}

async fn remove(
    e2b: &E2b,
    sandbox: &Sandbox,
    user: &User,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let body: PathReq = connect::read_unary(e2b, req).await?;
    files::done(
        sandbox,
        Verb::Remove(wf::Remove {
            path: body.path,
            recursive: true,
            user: user.clone(),
        }),
    )
    .await?;
    Ok(connect::ok(json!({})))
}

/// E2B's events for one of silkd's: a rename is the old name's `RENAME` then the new
/// name's `CREATE` (what inotify-based watchers, E2B's agent among them, report).
fn events_of(dir: &str, e: FsEvent) -> Vec<Value> {
    let rel = |p: &str| {
        let prefix = format!("{}/", dir.trim_end_matches('/'));
        p.strip_prefix(&prefix)
            .unwrap_or_else(|| p.rsplit('/').next().unwrap_or(p))
            .to_string()
    };
    let one = |kind: &str, p: &str| json!({"name": rel(p), "type": kind});
    match e.kind {
        FsEventKind::Create => vec![one("EVENT_TYPE_CREATE", &e.path)],
        FsEventKind::Modify => vec![one("EVENT_TYPE_WRITE", &e.path)],
        FsEventKind::Delete => vec![one("EVENT_TYPE_REMOVE", &e.path)],
        FsEventKind::Rename => {
            let mut v = Vec::new();
            if let Some(from) = &e.from {
                v.push(one("EVENT_TYPE_RENAME", from));
            }
            v.push(one("EVENT_TYPE_CREATE", &e.path));
            v
        }
    }
}

/// Opens silkd's watch and waits until it is set (its first answer, a `stat`).
async fn open_watch(
    sandbox: &Sandbox,
    user: &User,
    req: &WatchReq,
) -> Result<crate::guest::GuestConn> {
    let verb = Verb::Watch(wf::Watch {
        path: req.path.clone(),
        recursive: req.recursive,
        user: user.clone(),
    });
    let (conn, first) = files::open(sandbox, verb).await?;
    match first {
        Answer::Stat(e) if e.kind == FileKind::Dir => Ok(conn),
        Answer::Stat(_) => Err(Error::BadRequest(format!(
            "{} is not a directory",
            req.path
        ))),
        other => Err(unexpected(&other)),
    }
}

async fn watch_dir(
    e2b: &E2b,
    sandbox: &Sandbox,
    user: &User,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let body: WatchReq = connect::read_stream_request(e2b, req).await?;
    let mut conn = open_watch(sandbox, user, &body).await?;
    let (out, resp) = Stream::open();
    tokio::spawn(async move {
        if !out.send(json!({"start": {}})).await {
            return;
        }
        let end = loop {
            let frame = tokio::select! {
                f = files::next(&mut conn) => f,
                () = out.closed() => return,
            };
            match frame {
                Ok(Answer::Event(ev)) => {
                    for fs in events_of(&body.path, ev) {
                        if !out.send(json!({"filesystem": fs})).await {
                            return;
                        }
                    }
                }
                Ok(other) => break Some(unexpected(&other)),
                Err(e) => break Some(e),
            }
        };
        out.end(end.as_ref()).await;
    });
    Ok(resp)
}

async fn create_watcher(
    e2b: &E2b,
    sandbox: &Sandbox,
    user: &User,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let body: WatchReq = connect::read_unary(e2b, req).await?;
    let full = {
        let mut map = e2b.watchers.0.lock().expect("watchers lock");
        // A watcher whose sandbox is gone will never be polled again by anyone who can.
        map.retain(|_, w| !w.task.is_finished() || e2b.node.claims.get(&w.sandbox).is_some());
        let here = map.values().filter(|w| w.sandbox == sandbox.id).count();
        map.len() >= MAX_WATCHERS || here >= MAX_WATCHERS_PER_SANDBOX
    };
    if full {
        return Err(Error::Busy {
            reason: "too many watchers are open (the node's or this sandbox's limit)".into(),
            retry_after: 1,
        });
    }
    let mut conn = open_watch(sandbox, user, &body).await?;
    let events = Arc::new(Mutex::new(VecDeque::new()));
    let sink = events.clone();
    let task = tokio::spawn(async move {
        while let Some(Ok(Answer::Event(ev))) = conn.next().await {
            let mut q = sink.lock().expect("watcher events lock");
            for fs in events_of(&body.path, ev) {
                if q.len() == MAX_PENDING_EVENTS {
                    q.pop_front();
                }
                q.push_back(fs);
            }
        }
    });
    let mut raw = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut raw);
    let id = hex::encode(raw);
    let watcher = Watcher {
        sandbox: sandbox.id.clone(),
        events,
        task,
    };
    e2b.watchers
        .0
        .lock()
        .expect("watchers lock")
        .insert(id.clone(), watcher);
    Ok(connect::ok(json!({"watcherId": id})))
}

async fn watcher_events(
    e2b: &E2b,
    sandbox: &Sandbox,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let body: WatcherReq = connect::read_unary(e2b, req).await?;
    let map = e2b.watchers.0.lock().expect("watchers lock");
    let w = map
        .get(&body.watcher_id)
        .filter(|w| w.sandbox == sandbox.id)
        .ok_or(Error::NotFound)?;
    let events: Vec<Value> = w
        .events
        .lock()
        .expect("watcher events lock")
        .drain(..)
        .collect();
    if events.is_empty() && w.task.is_finished() {
        return Err(Error::Guest(
            "the watch ended: the sandbox's agent closed it".into(),
        ));
    }
    Ok(connect::ok(json!({"events": events})))
}

async fn remove_watcher(
    e2b: &E2b,
    sandbox: &Sandbox,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let body: WatcherReq = connect::read_unary(e2b, req).await?;
    let mut map = e2b.watchers.0.lock().expect("watchers lock");
    match map.get(&body.watcher_id) {
        Some(w) if w.sandbox == sandbox.id => {
            w.task.abort();
            map.remove(&body.watcher_id);
            Ok(connect::ok(json!({})))
        }
        _ => Err(Error::NotFound),
    }
}
