//! [`Files`]: a sandbox's files, from [`Sandbox::files`]. Downloads stream from the HTTP
//! file routes (`GET /files`, `GET /archive`; never held whole unless the caller asks
//! for a `Vec`). Uploads go over the relay as `data` frames: it is full duplex, so an
//! early refusal (a full disk, a forbidden path) arrives as a frame while the body is
//! still being sent, where an HTTP server answering before it read the body races the
//! client's write and the answer can be lost to a broken pipe. `mkdir`, `remove` and
//! `rename` are JSON calls; `stat`, `list` and `watch` use the relay too, whose typed
//! frames stat a directory (`GET /fs` lists one) and carry a watch's events.

use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::{SinkExt, Stream, StreamExt};
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use wire::files::{self as wf, FileEntry, FsEvent};
use wire::{Request, Response};

use crate::archive;
use crate::error::{Error, Result};
use crate::relay::Relay;
use crate::sandbox::Sandbox;

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
        let resp = self.http_stream(Method::GET, "files", path, &[]).await?;
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
        let data: Bytes = data.into();
        let pieces = futures::stream::iter([Ok::<_, std::io::Error>(data)]);
        self.upload_file(path, None, pieces).await
    }

    /// Writes what `source` yields until its end, streamed (never held whole), with
    /// permission bits `mode` (a new file gets 0644 otherwise). A `source` that fails
    /// cuts the upload off, which leaves nothing at `path`.
    pub async fn write_from<R>(&self, path: &str, source: R, mode: Option<u32>) -> Result<FileEntry>
    where
        R: AsyncRead + Send + 'static,
    {
        let pieces = tokio_util::io::ReaderStream::with_capacity(source, wf::DATA_CHUNK);
        self.upload_file(path, mode, pieces).await
    }

    async fn upload_file(
        &self,
        path: &str,
        mode: Option<u32>,
        pieces: impl Stream<Item = std::io::Result<Bytes>>,
    ) -> Result<FileEntry> {
        let verb = Request::FileWrite(wf::FileWrite {
            path: path.into(),
            mode,
            append: false,
            parents: true,
            user: self.user.clone(),
        });
        match self.upload(verb, pieces).await? {
            Response::Stat(e) => Ok(e),
            other => Err(Error::Protocol(format!("expected stat, got {other:?}"))),
        }
    }

    /// Sends `verb`, then `pieces` as `data` frames and `data_end`, on a fresh relay
    /// connection, and returns the answer. An answer that comes early (an error) ends the
    /// upload at once; a piece that fails drops the connection before `data_end`, so the
    /// guest commits nothing.
    async fn upload(
        &self,
        verb: Request,
        pieces: impl Stream<Item = std::io::Result<Bytes>>,
    ) -> Result<Response> {
        let relay = self.sandbox.relay().await?;
        let (mut sink, mut answers) = relay.split();
        sink.send(verb).await.map_err(Error::transport)?;
        let mut pieces = std::pin::pin!(pieces);
        loop {
            let piece = tokio::select! {
                piece = pieces.next() => piece,
                early = answers.next() => return Err(match answer(early) {
                    Err(e) => e,
                    Ok(other) => Error::Protocol(format!("an answer before data_end: {other:?}")),
                }),
            };
            match piece {
                Some(Ok(data)) => {
                    for chunk in data.chunks(wf::DATA_CHUNK) {
                        let frame = Request::Data {
                            data: chunk.to_vec(),
                        };
                        sink.send(frame).await.map_err(Error::transport)?;
                    }
                }
                Some(Err(e)) => return Err(Error::Local(format!("reading the upload: {e}"))),
                None => break,
            }
        }
        sink.send(Request::DataEnd)
            .await
            .map_err(Error::transport)?;
        answer(answers.next().await)
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
        self.http_stream(Method::DELETE, "fs", path, extra)
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
        let (pieces, packer) = archive::pack(local.to_path_buf());
        let verb = Request::TarIn(wf::TarIn {
            path: remote.into(),
            user: self.user.clone(),
        });
        let sent = self.upload(verb, pieces).await;
        // A local failure explains a cut-off upload better than what the upload saw.
        let packed = packer
            .await
            .map_err(|e| Error::Local(format!("archiving {}: {e}", local.display())))?;
        packed?;
        match sent? {
            Response::Done => Ok(()),
            other => Err(Error::Protocol(format!("expected done, got {other:?}"))),
        }
    }

    /// Copies the sandbox's directory `remote` to the local `local`, unpacked while it
    /// arrives. The archive is checked as untrusted input: entries that are absolute or
    /// hold `..`, devices, hard links leaving the directory and anything written through
    /// a symlink are refused ([`Error::Protocol`]). A `local` that did not exist appears
    /// whole or not at all; an existing one is merged into.
    pub async fn download_dir(&self, remote: &str, local: &Path) -> Result<()> {
        let resp = self
            .http_stream(Method::GET, "archive", remote, &[])
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
    ) -> Result<hyper::Response<hyper::body::Incoming>> {
        let expected = if method == Method::DELETE {
            StatusCode::NO_CONTENT
        } else {
            StatusCode::OK
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
            .stream(method, &route, self.sandbox.token(), expected)
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
    answer(relay.next().await)
}

/// A frame read from the relay as an answer.
fn answer(frame: Option<std::result::Result<Response, wire::Error>>) -> Result<Response> {
    match frame {
        Some(Ok(Response::Error { kind, message })) => Err(Error::from_guest(kind, message)),
        Some(Ok(answer)) => Ok(answer),
        Some(Err(e)) => Err(Error::transport(e)),
        None => Err(Error::Protocol("the relay closed without an answer".into())),
    }
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
}
