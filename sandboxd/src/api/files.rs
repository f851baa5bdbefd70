//! The file routes (DESIGN section 12): `/files` (raw bytes, `Range`), `/fs` (stat, listing,
//! delete, mkdir, rename, and `/fs/watch` as Server-Sent Events), `/archive` (tar).
//! Bodies stream both ways through bounded queues and are never held whole; uploads have
//! no size cap but the sandbox's disk, and `[http] body_timeout_seconds` bounds the wait
//! for each piece of an upload (not the whole). A client that leaves mid-upload drops the
//! guest stream before `data_end`, so silkd commits nothing.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures::SinkExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{
    HeaderValue, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE,
};
use hyper::{Request, Response, StatusCode};
use tokio::sync::mpsc;
use wire::files::{self as wf, DATA_CHUNK};
use wire::{Request as Verb, Response as Answer};

use super::query::Query;
use super::{awake_for, empty, json, read_json, Body};
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::files::{self, entry_json, unexpected};
use crate::guest::GuestConn;
use crate::node::Node;

/// Body pieces queued towards a client: with 256 KiB `data` frames, about 1 MiB per
/// download in flight.
const OUT_QUEUE: usize = 4;

/// `PUT /files?path=P[&mode=0644][&append=true][&user=U]`: the body into P.
pub(super) async fn put_file(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = awake_for(node, caller, id).await?;
    let q = Query::parse(req.uri().query(), &["path", "mode", "append", "user"])?;
    let verb = Verb::FileWrite(wf::FileWrite {
        path: q.require("path")?,
        mode: q.mode()?,
        append: q.flag("append")?,
        parents: true,
        user: q.get("user").map(Into::into),
    });
    let mut conn = files::connect(&sandbox).await?;
    conn.send(verb).await?;
    match upload(node, &mut conn, req.into_body()).await? {
        Answer::Stat(e) => Ok(json(StatusCode::OK, &entry_json(e))),
        other => Err(unexpected(&other)),
    }
}

/// `PUT /archive?path=P[&user=U]`: a tar body unpacked into the directory P.
pub(super) async fn put_archive(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = awake_for(node, caller, id).await?;
    let q = Query::parse(req.uri().query(), &["path", "user"])?;
    let verb = Verb::TarIn(wf::TarIn {
        path: q.require("path")?,
        user: q.get("user").map(Into::into),
    });
    let mut conn = files::connect(&sandbox).await?;
    conn.send(verb).await?;
    match upload(node, &mut conn, req.into_body()).await? {
        Answer::Done => no_content(),
        other => Err(unexpected(&other)),
    }
}

/// Feeds the request body to a write or unpack as `data` frames, then `data_end`, and
/// returns silkd's answer. An early answer (a full disk, a refused entry) ends the upload
/// at once; so does a client that leaves or goes quiet, before any `data_end`.
pub(crate) async fn upload(
    node: &Node,
    conn: &mut GuestConn,
    mut body: Incoming,
) -> Result<Answer> {
    let seconds = node.config.http.body_timeout_seconds;
    loop {
        let piece = tokio::select! {
            p = tokio::time::timeout(Duration::from_secs(seconds), body.frame()) => p,
            early = files::next(conn) => return Err(early.err().unwrap_or_else(|| {
                Error::Guest("silkd answered a write before its data_end".into())
            })),
        };
        let data = match piece {
            Err(_) => {
                node.metrics.http_body_timeouts.inc();
                return Err(Error::BodyTimeout { seconds });
            }
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(Error::ClientGone("the upload was cut off")),
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(d) => d,
                Err(_) => continue, // trailers
            },
        };
        for chunk in data.chunks(DATA_CHUNK) {
            conn.send(Verb::Data {
                data: chunk.to_vec(),
            })
            .await?;
        }
    }
    conn.send(Verb::DataEnd).await?;
    files::next(conn).await
}

/// `GET /files?path=P[&user=U]`, with `Range: bytes=A-B | A- | -N`: the raw bytes.
pub(super) async fn get_file(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = awake_for(node, caller, id).await?;
    let q = Query::parse(req.uri().query(), &["path", "user"])?;
    let (path, user) = (q.require("path")?, q.get("user").map(String::from));
    let range = match req.headers().get(RANGE) {
        Some(v) => Some(parse_range(v.to_str().unwrap_or(""))?),
        None => None,
    };
    let read = |offset, length| {
        Verb::FileRead(wf::FileRead {
            path: path.clone(),
            offset,
            length,
            user: user.clone(),
        })
    };
    let (offset, length) = match range {
        None => (0, None),
        Some(ByteRange::From(a)) => (a, None),
        Some(ByteRange::Span(a, b)) => (a, Some(b - a + 1)),
        Some(ByteRange::Suffix(n)) => {
            // The suffix needs the size first: a zero-length read answers only its stat.
            let (_, first) = files::open(&sandbox, read(0, Some(0))).await?;
            let Answer::Stat(e) = first else {
                return Err(unexpected(&first));
            };
            (e.size.saturating_sub(n), None)
        }
    };
    let (conn, first) = files::open(&sandbox, read(offset, length)).await?;
    let Answer::Stat(stat) = first else {
        return Err(unexpected(&first));
    };
    let size = stat.size;
    if range.is_some() && offset >= size {
        drop(conn);
        return Err(Error::RangeNotSatisfiable { size });
    }
    let count = size.saturating_sub(offset).min(length.unwrap_or(u64::MAX));
    let mut resp = Response::new(stream_data(conn, None));
    resp.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(count));
    resp.headers_mut()
        .insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if range.is_some() {
        *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
        let end = offset + count.max(1) - 1;
        let value = format!("bytes {offset}-{end}/{size}");
        resp.headers_mut()
            .insert(CONTENT_RANGE, HeaderValue::try_from(value).expect("ascii"));
    }
    Ok(resp)
}

/// `GET /archive?path=P[&user=U]`: the directory P as a tar stream.
pub(super) async fn get_archive(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = awake_for(node, caller, id).await?;
    let q = Query::parse(req.uri().query(), &["path", "user"])?;
    let verb = Verb::TarOut(wf::PathArg {
        path: q.require("path")?,
        user: q.get("user").map(Into::into),
    });
    // The first frame decides the status: an error is still a 404/400/403.
    let (conn, first) = files::open(&sandbox, verb).await?;
    let first = match first {
        Answer::Data { data } => Some(data),
        Answer::Done => None,
        other => return Err(unexpected(&other)),
    };
    let mut resp = Response::new(stream_data(conn, first));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/x-tar"));
    Ok(resp)
}

/// A response body fed from a guest stream's `data` frames until `done`. A guest failure
/// midway ends the body short, which hyper turns into a broken connection (with a
/// `Content-Length`, or a chunked body without its last chunk): never a silent truncation.
pub(crate) fn stream_data(mut conn: GuestConn, first: Option<Vec<u8>>) -> Body {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(OUT_QUEUE);
    tokio::spawn(async move {
        if let Some(d) = first {
            if tx.send(Ok(Bytes::from(d))).await.is_err() {
                return;
            }
        }
        loop {
            let frame = tokio::select! {
                f = files::next(&mut conn) => f,
                () = tx.closed() => return,
            };
            match frame {
                Ok(Answer::Data { data }) => {
                    if tx.send(Ok(Bytes::from(data))).await.is_err() {
                        return;
                    }
                }
                Ok(Answer::Done) => return,
                Ok(other) => return tracing::warn!("{}", unexpected(&other)),
                Err(e) => return tracing::debug!("download cut short: {e}"),
            }
        }
    });
    channel_body(rx)
}

pub(crate) fn channel_body(rx: mpsc::Receiver<Result<Bytes, Infallible>>) -> Body {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (b.map(Frame::data), rx))
    });
    StreamBody::new(stream).boxed()
}

/// `GET /fs?path=P[&depth=N][&user=U]`: a path's stat, or a directory's listing.
pub(super) async fn get_fs(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = awake_for(node, caller, id).await?;
    let q = Query::parse(req.uri().query(), &["path", "depth", "user"])?;
    let (path, user) = (q.require("path")?, q.get("user").map(String::from));
    let depth = q.number("depth")?.unwrap_or(1);
    let stat = files::stat_of(
        &sandbox,
        Verb::Stat(wf::PathArg {
            path: path.clone(),
            user: user.clone(),
        }),
    )
    .await?;
    if stat.kind != wf::FileKind::Dir {
        return Ok(json(StatusCode::OK, &entry_json(stat)));
    }
    let (mut conn, mut frame) =
        files::open(&sandbox, Verb::List(wf::List { path, depth, user })).await?;
    // `{"entries": [...]}` written row by row as frames arrive.
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(OUT_QUEUE);
    tokio::spawn(async move {
        let mut first = true;
        let mut out = b"{\"entries\":[".to_vec();
        loop {
            match frame {
                Answer::Entries { entries } => {
                    for e in entries {
                        if !first {
                            out.push(b',');
                        }
                        first = false;
                        serde_json::to_writer(&mut out, &entry_json(e)).expect("serializes");
                    }
                }
                Answer::Done => {
                    out.extend_from_slice(b"]}");
                    let _ = tx.send(Ok(Bytes::from(out))).await;
                    return;
                }
                other => return tracing::warn!("{}", unexpected(&other)),
            }
            if tx
                .send(Ok(Bytes::from(std::mem::take(&mut out))))
                .await
                .is_err()
            {
                return;
            }
            frame = match files::next(&mut conn).await {
                Ok(f) => f,
                Err(e) => return tracing::debug!("listing cut short: {e}"),
            };
        }
    });
    let mut resp = Response::new(channel_body(rx));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

/// `DELETE /fs?path=P[&recursive=true][&user=U]`.
pub(super) async fn delete_fs(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = awake_for(node, caller, id).await?;
    let q = Query::parse(req.uri().query(), &["path", "recursive", "user"])?;
    let verb = Verb::Remove(wf::Remove {
        path: q.require("path")?,
        recursive: q.flag("recursive")?,
        user: q.get("user").map(Into::into),
    });
    files::done(&sandbox, verb).await?;
    no_content()
}

/// `POST /fs/mkdir` `{path, parents?, mode?, user?}`.
pub(super) async fn mkdir(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = awake_for(node, caller, id).await?;
    let body: api::files::MkdirRequest = read_json(node, req, false).await?;
    let verb = Verb::Mkdir(wf::Mkdir {
        path: body.path,
        parents: body.parents.unwrap_or(true),
        mode: body.mode,
        user: body.user,
    });
    files::done(&sandbox, verb).await?;
    no_content()
}

/// `POST /fs/rename` `{from, to, user?}`.
pub(super) async fn rename(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = awake_for(node, caller, id).await?;
    let body: api::files::RenameRequest = read_json(node, req, false).await?;
    let verb = Verb::Rename(wf::Rename {
        from: body.from,
        to: body.to,
        user: body.user,
    });
    files::done(&sandbox, verb).await?;
    no_content()
}

/// `GET /fs/watch?path=P[&recursive=true][&user=U]`: Server-Sent Events, one per change
/// (`event: create|modify|delete|rename`, `data: {kind, path, from?}`), until the client
/// leaves or the directory is removed.
pub(super) async fn watch(
    node: &Node,
    caller: &Caller,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let sandbox = awake_for(node, caller, id).await?;
    let q = Query::parse(req.uri().query(), &["path", "recursive", "user"])?;
    let verb = Verb::Watch(wf::Watch {
        path: q.require("path")?,
        recursive: q.flag("recursive")?,
        user: q.get("user").map(Into::into),
    });
    let (mut conn, first) = files::open(&sandbox, verb).await?;
    if !matches!(first, Answer::Stat(_)) {
        return Err(unexpected(&first));
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(OUT_QUEUE);
    tokio::spawn(async move {
        // A comment line first, so the client sees the watch is set.
        if tx
            .send(Ok(Bytes::from_static(b": watching\n\n")))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let frame = tokio::select! {
                f = files::next(&mut conn) => f,
                () = tx.closed() => return,
            };
            let e = match frame {
                Ok(Answer::Event(e)) => e,
                Ok(Answer::Done) => return,
                Ok(other) => return tracing::warn!("{}", unexpected(&other)),
                Err(e) => return tracing::debug!("watch ended: {e}"),
            };
            let kind = serde_json::to_value(e.kind).expect("serializes");
            let kind = kind.as_str().unwrap_or("modify").to_string();
            let data = serde_json::to_string(&api::files::FsEvent {
                kind: kind.clone(),
                path: e.path,
                from: e.from,
            })
            .expect("serializes");
            let text = format!("event: {kind}\ndata: {data}\n\n");
            if tx.send(Ok(Bytes::from(text))).await.is_err() {
                return;
            }
        }
    });
    let mut resp = Response::new(channel_body(rx));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

fn no_content() -> Result<Response<Body>> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    Ok(resp)
}

/// One byte range (multiple ranges are refused: 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ByteRange {
    /// `A-`
    From(u64),
    /// `A-B` (inclusive)
    Span(u64, u64),
    /// `-N`: the last N bytes.
    Suffix(u64),
}

fn parse_range(v: &str) -> Result<ByteRange> {
    let bad = || Error::BadRequest(format!("unsupported Range {v:?}: want bytes=A-B, A- or -N"));
    let spec = v.trim().strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
    match (a.trim().is_empty(), b.trim().is_empty()) {
        (false, true) => Ok(ByteRange::From(num(a)?)),
        (false, false) => {
            let (a, b) = (num(a)?, num(b)?);
            if b < a {
                return Err(bad());
            }
            Ok(ByteRange::Span(a, b))
        }
        (true, false) => Ok(ByteRange::Suffix(num(b)?)),
        (true, true) => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9").unwrap(), ByteRange::Span(0, 9));
        assert_eq!(parse_range("bytes=5-").unwrap(), ByteRange::From(5));
        assert_eq!(parse_range("bytes=-3").unwrap(), ByteRange::Suffix(3));
        for bad in [
            "",
            "bytes=",
            "bytes=-",
            "bytes=9-1",
            "bytes=0-1,3-4",
            "items=0-1",
            "bytes=a-",
        ] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
    }
}
