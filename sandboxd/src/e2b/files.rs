//! The agent's plain HTTP `/files`: `GET` streams a file's bytes (silkd `file_read`),
//! `POST` writes files from `application/octet-stream` (`?path=`) or from
//! `multipart/form-data` (parts named `file`, each `filename` a target path), parsed as
//! the body streams so that no file is held whole in memory.

use bytes::{Buf, Bytes, BytesMut};
use futures::SinkExt;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use wire::files::{self as wf, DATA_CHUNK};
use wire::{Request as Verb, Response as Answer};

use super::{json, E2b};
use crate::api::files::{stream_data, upload};
use crate::api::query::Query;
use crate::api::Body;
use crate::claims::Sandbox;
use crate::error::{Error, Result};
use crate::files::{self, unexpected};
use crate::guest::GuestConn;

/// Longest part header block accepted.
const MAX_PART_HEAD: usize = 16 * 1024;
/// Most files in one multipart upload.
const MAX_PARTS: usize = 1000;

/// `GET` or `POST /files`.
pub(super) async fn files(
    e2b: &E2b,
    sandbox: &Sandbox,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let q = Query::parse(
        req.uri().query(),
        &["path", "username", "signature", "signature_expiration"],
    )?;
    if q.get("signature").is_some() {
        return Err(Error::Unsupported("signed file URLs".into()));
    }
    let user = q
        .get("username")
        .filter(|u| !u.is_empty())
        .map(String::from);
    match *req.method() {
        Method::GET => {
            let path = q.require("path")?;
            let verb = Verb::FileRead(wf::FileRead {
                path,
                offset: 0,
                length: None,
                user,
            });
            let (conn, first) = files::open(sandbox, verb).await?;
            let Answer::Stat(stat) = first else {
                return Err(unexpected(&first));
            };
            let mut resp = Response::new(stream_data(conn, None));
            let headers = resp.headers_mut();
            headers.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(stat.size));
            Ok(resp)
        }
        Method::POST => {
            let kind = req
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            if req.headers().contains_key(hyper::header::CONTENT_ENCODING) {
                return Err(Error::Unsupported(
                    "compressed uploads (Content-Encoding)".into(),
                ));
            }
            let written = if kind.starts_with("application/octet-stream") {
                let path = q.require("path")?;
                let mut conn = open_write(sandbox, &path, user).await?;
                match upload(&e2b.node, &mut conn, req.into_body()).await? {
                    Answer::Stat(_) => vec![written_json(&path)],
                    other => return Err(unexpected(&other)),
                }
            } else if let Some(boundary) = boundary_of(&kind) {
                multipart(e2b, sandbox, req.into_body(), &boundary, user).await?
            } else {
                return Err(Error::BadRequest(format!(
                    "content type {kind:?}: send multipart/form-data or application/octet-stream"
                )));
            };
            Ok(json(StatusCode::OK, &Value::Array(written)))
        }
        _ => Err(Error::MethodNotAllowed),
    }
}

fn written_json(path: &str) -> Value {
    let name = path.rsplit('/').next().unwrap_or(path);
    json!({"name": name, "type": "file", "path": path})
}

async fn open_write(sandbox: &Sandbox, path: &str, user: Option<String>) -> Result<GuestConn> {
    let mut conn = files::connect(sandbox).await?;
    let verb = Verb::FileWrite(wf::FileWrite {
        path: path.to_string(),
        mode: None,
        append: false,
        parents: true,
        user,
    });
    conn.send(verb).await?;
    Ok(conn)
}

/// `boundary=` of a `multipart/form-data` content type.
fn boundary_of(kind: &str) -> Option<String> {
    let (main, params) = kind.split_once(';')?;
    if !main.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        let v = v.trim().trim_matches('"');
        (k.eq_ignore_ascii_case("boundary") && !v.is_empty() && v.len() <= 200)
            .then(|| v.to_string())
    })
}

/// The `filename` of a part named `file`, from its header block.
fn part_filename(head: &str) -> Result<Option<String>> {
    let disposition = head
        .split("\r\n")
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-disposition")
                .then_some(v)
        })
        .ok_or_else(|| Error::BadRequest("a multipart part has no Content-Disposition".into()))?;
    let param = |name: &str| {
        disposition.split(';').find_map(|p| {
            let (k, v) = p.trim().split_once('=')?;
            (k.trim() == name).then(|| v.trim().trim_matches('"').to_string())
        })
    };
    if param("name").as_deref() != Some("file") {
        return Ok(None);
    }
    param("filename")
        .filter(|f| !f.is_empty())
        .map(Some)
        .ok_or_else(|| Error::BadRequest("a file part has no filename (its target path)".into()))
}

/// Where the multipart parser is.
enum State {
    /// Before the first delimiter.
    Preamble,
    /// Reading a part's headers.
    Head,
    /// In a part's bytes, writing them to `conn` (None: a part we skip).
    Data(Option<(String, GuestConn)>),
    /// After the closing delimiter.
    Done,
}

async fn multipart(
    e2b: &E2b,
    sandbox: &Sandbox,
    mut body: Incoming,
    boundary: &str,
    user: Option<String>,
) -> Result<Vec<Value>> {
    let first = format!("--{boundary}");
    let delim = format!("\r\n--{boundary}");
    let seconds = e2b.node.config.http.body_timeout_seconds;
    let mut buf = BytesMut::new();
    let mut state = State::Preamble;
    let mut written = Vec::new();
    let mut eof = false;
    loop {
        // Make what progress the buffer allows; read more only when stuck.
        let progressed = match &mut state {
            State::Preamble => match find(&buf, first.as_bytes()) {
                Some(at) => {
                    buf.advance(at + first.len());
                    state = State::Head;
                    // The line break after the delimiter is consumed with the head.
                    true
                }
                None => {
                    // A preamble is ignored; keep only what could start the delimiter.
                    let keep = buf.len().min(first.len());
                    buf.advance(buf.len() - keep);
                    false
                }
            },
            State::Head => {
                if buf.starts_with(b"--") {
                    state = State::Done;
                    true
                } else if let Some(end) = find(&buf, b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.advance(end + 4);
                    state = State::Data(match part_filename(&head)? {
                        Some(path) => {
                            if written.len() == MAX_PARTS {
                                return Err(Error::BadRequest(format!(
                                    "more than {MAX_PARTS} files in one upload"
                                )));
                            }
                            let conn = open_write(sandbox, &path, user.clone()).await?;
                            Some((path, conn))
                        }
                        None => None,
                    });
                    true
                } else if buf.len() > MAX_PART_HEAD {
                    return Err(Error::BadRequest(
                        "a multipart part's headers are too long".into(),
                    ));
                } else {
                    false
                }
            }
            State::Data(target) => {
                let (take, ends) = match find(&buf, delim.as_bytes()) {
                    Some(at) => (at, true),
                    // Keep what could be the start of a delimiter.
                    None => (buf.len().saturating_sub(delim.len()), false),
                };
                let data = buf.split_to(take).freeze();
                if let Some((_, conn)) = target {
                    send_data(conn, data).await?;
                }
                if ends {
                    buf.advance(delim.len());
                    if let Some((path, mut conn)) = target.take() {
                        conn.send(Verb::DataEnd).await?;
                        match files::next(&mut conn).await? {
                            Answer::Stat(_) => written.push(written_json(&path)),
                            other => return Err(unexpected(&other)),
                        }
                    }
                    state = State::Head;
                    true
                } else {
                    take > 0
                }
            }
            State::Done => return Ok(written),
        };
        if progressed {
            continue;
        }
        if eof {
            return Err(Error::BadRequest(
                "the multipart body ends before its closing delimiter".into(),
            ));
        }
        let frame = tokio::time::timeout(std::time::Duration::from_secs(seconds), body.frame())
            .await
            .map_err(|_| Error::BodyTimeout { seconds })?;
        match frame {
            None => eof = true,
            Some(Err(_)) => return Err(Error::ClientGone("the upload was cut off")),
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    buf.extend_from_slice(&d);
                }
            }
        }
    }
}

async fn send_data(conn: &mut GuestConn, data: Bytes) -> Result<()> {
    for chunk in data.chunks(DATA_CHUNK) {
        conn.send(Verb::Data {
            data: chunk.to_vec(),
        })
        .await?;
    }
    Ok(())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_and_part_heads() {
        assert_eq!(
            boundary_of("multipart/form-data; boundary=abc").as_deref(),
            Some("abc")
        );
        assert_eq!(
            boundary_of("multipart/form-data; boundary=\"a b\"").as_deref(),
            Some("a b")
        );
        assert_eq!(boundary_of("multipart/form-data"), None);
        assert_eq!(boundary_of("text/plain; boundary=x"), None);
        let head = "Content-Disposition: form-data; name=\"file\"; filename=\"/tmp/a b\"\r\nContent-Type: application/octet-stream";
        assert_eq!(part_filename(head).unwrap().as_deref(), Some("/tmp/a b"));
        assert_eq!(
            part_filename("Content-Disposition: form-data; name=\"x\"").unwrap(),
            None
        );
        assert!(part_filename("Content-Disposition: form-data; name=\"file\"").is_err());
        assert!(part_filename("X: y").is_err());
    }
}
