//! [`Files`]: a sandbox's files, from [`Sandbox::files`]. Bytes travel over the HTTP file
//! routes, streamed both ways (`/files`, `/archive`; never held whole unless the caller
//! asks for a `Vec`); `mkdir`, `remove` and `rename` are JSON calls; `stat`, `list` and
//! `watch` use the relay, whose typed frames stat a directory (the HTTP `GET /fs` lists
//! one) and carry a watch's events without an event-stream parser.

use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::{SinkExt, Stream, StreamExt, TryStreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Method, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use wire::files::{self as wf, FileEntry, FsEvent};
use wire::{Request, Response};

use crate::archive;
use crate::error::{Error, Result};
use crate::relay::Relay;
use crate::sandbox::Sandbox;
use crate::transport::{self, Body};

/// A sandbox's files. Paths are absolute, or relative to the template's workdir; every
/// call acts as the template's user unless [`as_user`](Files::as_user) says otherwise,
/// and the guest's kernel checks each access ([`Error::Forbidden`] when it refuses). A
/// missing path is [`Error::NotFound`], a full disk [`Error::NoSpace`] (nothing is left
/// behind). No call has a timeout of its own: a transfer lasts as long as its bytes.
#[derive(Debug, Clone)]
pub struct Files {
    sandbox: Sandbox,
    user: Option<String>,
}

impl Sandbox {
    /// This sandbox's files.
    pub fn files(&self) -> Files {
        Files {
            sandbox: self.clone(),
            user: None,
        }
    }
}

impl Files {
    /// Acts as `user` (a name or uid in the guest) rather than the template's user.
    pub fn as_user(mut self, user: impl Into<String>) -> Files {
        self.user = Some(user.into());
        self
    }

    /// The whole file.
    pub async fn read(&self, path: &str) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_to(path, &mut out).await?;
        Ok(out)
    }

    /// Streams the file into `out` as it arrives; returns the bytes written. A download
    /// cut short (the guest failed) is an error, never a short success.
    pub async fn read_to<W: AsyncWrite + Unpin>(&self, path: &str, out: &mut W) -> Result<u64> {
        let resp = self
            .http_stream(
                Method::GET,
                "files",
                path,
                &[],
                transport::full(Bytes::new()),
            )
            .await?;
        let mut body = resp.into_body();
        let mut total = 0;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(Error::transport)?;
            if let Ok(data) = frame.into_data() {
                out.write_all(&data)
                    .await
                    .map_err(|e| Error::Local(format!("writing what {path} holds: {e}")))?;
                total += data.len() as u64;
            }
        }
        out.flush()
            .await
            .map_err(|e| Error::Local(format!("writing what {path} holds: {e}")))?;
        Ok(total)
    }

    /// Writes `data` to the file (parents created), replacing it whole: a reader in the
    /// sandbox sees the old file or the new one, never half of one.
    pub async fn write(&self, path: &str, data: impl Into<Bytes>) -> Result<FileEntry> {
        self.upload_file(path, None, transport::full(data.into()))
            .await
    }

    /// Writes what `source` yields until its end, streamed (never held whole), with
    /// permission bits `mode` (a new file gets 0644 otherwise). A `source` that fails
    /// cuts the upload off, which leaves nothing at `path`.
    pub async fn write_from<R>(&self, path: &str, source: R, mode: Option<u32>) -> Result<FileEntry>
    where
        R: AsyncRead + Send + 'static,
    {
        let frames = tokio_util::io::ReaderStream::with_capacity(source, wf::DATA_CHUNK)
            .map_ok(Frame::data)
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
        self.upload_file(path, mode, StreamBody::new(frames).boxed_unsync())
            .await
    }

    async fn upload_file(&self, path: &str, mode: Option<u32>, body: Body) -> Result<FileEntry> {
        let mode = mode.map(|m| format!("{m:o}"));
        let extra: Vec<(&str, &str)> = mode.iter().map(|m| ("mode", m.as_str())).collect();
        let resp = self
            .http_stream(Method::PUT, "files", path, &extra, body)
            .await?;
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(Error::transport)?
            .to_bytes();
        entry_from_json(&body)
    }

    /// One path's metadata; a symlink is described, not followed.
    pub async fn stat(&self, path: &str) -> Result<FileEntry> {
        let req = Request::Stat(wf::PathArg {
            path: path.into(),
            user: self.user.clone(),
        });
        match self.rpc(req).await? {
            Response::Stat(e) => Ok(e),
            other => Err(Error::Protocol(format!("expected stat, got {other:?}"))),
        }
    }

    /// A directory's entries, one level.
    pub async fn list(&self, path: &str) -> Result<Vec<FileEntry>> {
        self.list_depth(path, 1).await
    }

    /// A directory's entries down to `depth` levels (at most 64), named relative to it.
    pub async fn list_depth(&self, path: &str, depth: u32) -> Result<Vec<FileEntry>> {
        let mut relay = self.sandbox.relay().await?;
        send(
            &mut relay,
            Request::List(wf::List {
                path: path.into(),
                depth,
                user: self.user.clone(),
            }),
        )
        .await?;
        let mut all = Vec::new();
        loop {
            match next(&mut relay).await? {
                Response::Entries { entries } => all.extend(entries),
                Response::Done => return Ok(all),
                other => return Err(Error::Protocol(format!("expected entries, got {other:?}"))),
            }
        }
    }

    /// Creates a directory and any missing parents; an existing one is fine.
    pub async fn mkdir(&self, path: &str) -> Result<()> {
        let body = api::files::MkdirRequest {
            path: path.into(),
            parents: Some(true),
            mode: None,
            user: self.user.clone(),
        };
        self.json_call("fs/mkdir", &body).await
    }

    /// Removes a file, a link (not what it points to) or an empty directory; a directory
    /// with its contents when `recursive`.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let extra: &[(&str, &str)] = if recursive {
            &[("recursive", "true")]
        } else {
            &[]
        };
        self.http_stream(
            Method::DELETE,
            "fs",
            path,
            extra,
            transport::full(Bytes::new()),
        )
        .await
        .map(drop)
    }

    /// Renames (moves) `from` to `to` inside the sandbox.
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        let body = api::files::RenameRequest {
            from: from.into(),
            to: to.into(),
            user: self.user.clone(),
        };
        self.json_call("fs/rename", &body).await
    }

    /// Copies the local directory `local` to `remote` as a tar stream built while it is
    /// sent (modes, mtimes and symlinks kept; links are never followed). A `remote` that
    /// did not exist appears whole or not at all; an existing one is merged into.
    pub async fn upload_dir(&self, local: &Path, remote: &str) -> Result<()> {
        let (stream, packer) = archive::pack(local.to_path_buf());
        let frames = stream
            .map_ok(Frame::data)
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
        let sent = self
            .http_stream(
                Method::PUT,
                "archive",
                remote,
                &[],
                StreamBody::new(frames).boxed_unsync(),
            )
            .await;
        // A local failure explains a cut-off upload better than the transport error.
        let packed = packer
            .await
            .map_err(|e| Error::Local(format!("archiving {}: {e}", local.display())))?;
        packed?;
        sent.map(drop)
    }

    /// Copies the sandbox's directory `remote` to the local `local`, unpacked while it
    /// arrives. The archive is checked as untrusted input: entries that are absolute or
    /// hold `..`, devices, hard links leaving the directory and anything written through
    /// a symlink are refused ([`Error::Protocol`]). A `local` that did not exist appears
    /// whole or not at all; an existing one is merged into.
    pub async fn download_dir(&self, remote: &str, local: &Path) -> Result<()> {
        let resp = self
            .http_stream(
                Method::GET,
                "archive",
                remote,
                &[],
                transport::full(Bytes::new()),
            )
            .await?;
        let unpacker = archive::unpack(local.to_path_buf());
        let mut body = resp.into_body();
        let mut broken = None;
        while let Some(frame) = body.frame().await {
            let piece = match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(data) => Ok(data),
                    Err(_) => continue,
                },
                Err(e) => {
                    broken = Some(Error::transport(e));
                    Err(std::io::Error::other("the download broke off"))
                }
            };
            let failed = piece.is_err();
            // A closed queue means the unpacker stopped (it says why below).
            if unpacker.tx.send(piece).await.is_err() || failed {
                break;
            }
        }
        drop(unpacker.tx);
        let unpacked = unpacker
            .task
            .await
            .map_err(|e| Error::Local(format!("unpacking into {}: {e}", local.display())))?;
        match (broken, unpacked) {
            (Some(e), _) => Err(e),
            (None, r) => r,
        }
    }

    /// Watches the directory `path` (and its subdirectories when `recursive`); returns
    /// once the watch is set, so a change made after this returns is seen. Dropping the
    /// [`Watch`] ends it in the guest.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<Watch> {
        let mut relay = self.sandbox.relay().await?;
        send(
            &mut relay,
            Request::Watch(wf::Watch {
                path: path.into(),
                recursive,
                user: self.user.clone(),
            }),
        )
        .await?;
        match next(&mut relay).await? {
            Response::Stat(_) => Ok(Watch { relay: Some(relay) }),
            other => Err(Error::Protocol(format!("expected stat, got {other:?}"))),
        }
    }

    async fn rpc(&self, req: Request) -> Result<Response> {
        let mut relay = self.sandbox.relay().await?;
        send(&mut relay, req).await?;
        next(&mut relay).await
    }

    async fn json_call<T: serde::Serialize>(&self, verb: &str, body: &T) -> Result<()> {
        let json = serde_json::to_vec(body).expect("a file request always serializes");
        self.sandbox
            .http()
            .send(
                Method::POST,
                &self.sandbox.path(verb),
                self.sandbox.token(),
                Some(json),
            )
            .await?
            .expect(StatusCode::NO_CONTENT)
    }

    /// `verb?path=P&...&user=U` with `body`; the answer when it is the route's success.
    async fn http_stream(
        &self,
        method: Method,
        verb: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: Body,
    ) -> Result<hyper::Response<hyper::body::Incoming>> {
        let expected = match (&method, verb) {
            (&Method::DELETE, _) => StatusCode::NO_CONTENT,
            (&Method::PUT, "archive") => StatusCode::NO_CONTENT,
            _ => StatusCode::OK,
        };
        let mut query = format!("path={}", encode(path));
        for (k, v) in extra {
            query.push_str(&format!("&{k}={}", encode(v)));
        }
        if let Some(user) = &self.user {
            query.push_str(&format!("&user={}", encode(user)));
        }
        let route = format!("{}?{query}", self.sandbox.path(verb));
        self.sandbox
            .http()
            .stream(method, &route, self.sandbox.token(), body, expected)
            .await
    }
}

/// A running watch: a stream of the changes under the directory, ending when the
/// directory is removed or the sandbox goes. Dropping it ends the watch in the guest.
pub struct Watch {
    relay: Option<Relay>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("open", &self.relay.is_some())
            .finish()
    }
}

impl Stream for Watch {
    type Item = Result<FsEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(relay) = self.relay.as_mut() else {
            return Poll::Ready(None);
        };
        let item = match futures::ready!(relay.poll_next_unpin(cx)) {
            Some(Ok(Response::Event(e))) => return Poll::Ready(Some(Ok(e))),
            Some(Ok(Response::Done)) | None => None,
            Some(Ok(Response::Error { kind, message })) => {
                Some(Err(Error::from_guest(kind, message)))
            }
            Some(Ok(other)) => Some(Err(Error::Protocol(format!(
                "expected event, got {other:?}"
            )))),
            Some(Err(e)) => Some(Err(Error::transport(e))),
        };
        self.relay = None; // an end or an error closes the watch
        Poll::Ready(item)
    }
}

async fn send(relay: &mut Relay, req: Request) -> Result<()> {
    relay.send(req).await.map_err(Error::transport)
}

/// The next answer; a guest `Error` frame becomes the matching [`Error`].
async fn next(relay: &mut Relay) -> Result<Response> {
    match relay.next().await {
        Some(Ok(Response::Error { kind, message })) => Err(Error::from_guest(kind, message)),
        Some(Ok(answer)) => Ok(answer),
        Some(Err(e)) => Err(Error::transport(e)),
        None => Err(Error::Protocol("the relay closed without an answer".into())),
    }
}

/// The `{name, type, size, mode, mtime, target?}` of a write's answer, typed.
fn entry_from_json(body: &[u8]) -> Result<FileEntry> {
    let e: api::files::FileEntry = serde_json::from_slice(body)
        .map_err(|e| Error::Protocol(format!("cannot decode the write's answer: {e}")))?;
    let kind = serde_json::from_value(serde_json::Value::String(e.kind.clone()))
        .map_err(|_| Error::Protocol(format!("unknown file type {:?}", e.kind)))?;
    Ok(FileEntry {
        name: e.name,
        kind,
        size: e.size,
        mode: e.mode,
        mtime: e.mtime,
        target: e.target,
    })
}

/// Percent-encodes a query value: everything but unreserved characters and `/`.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            encode("/home/user/a b&c=d%é"),
            "/home/user/a%20b%26c%3Dd%25%C3%A9"
        );
    }

    #[test]
    fn a_write_answer_becomes_a_typed_entry() {
        let e = entry_from_json(br#"{"name":"f","type":"file","size":3,"mode":420,"mtime":7}"#)
            .unwrap();
        assert_eq!((e.kind, e.size, e.mode), (wf::FileKind::File, 3, 0o644));
        assert!(matches!(
            entry_from_json(br#"{"name":"f","type":"blob","size":3,"mode":420,"mtime":7}"#),
            Err(Error::Protocol(_))
        ));
    }
}
