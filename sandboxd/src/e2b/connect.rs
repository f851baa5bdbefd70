//! The Connect protocol with the JSON codec, as the E2B agent speaks it: unary calls are
//! a JSON body answered by JSON (errors: a non-200 status and `{"code","message"}` with
//! Connect's code names); server streams take one request envelope and answer 200 with
//! envelopes written as events happen, ending with an end-of-stream envelope (`{}`, or
//! `{"error": ...}`).

use std::convert::Infallible;

use bytes::{Bytes, BytesMut};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::envelope::{self, END_STREAM, MAX_REQUEST_MESSAGE};
use super::E2b;
use crate::api::files::channel_body;
use crate::api::{full, status_of, tenant_message, Body, MAX_BODY};
use crate::error::{Error, Result};

/// Events queued for one stream's body: small, so a client that does not read holds the
/// guest's output back instead of our memory.
const STREAM_QUEUE: usize = 8;

/// Whether the request is a server-stream call (`application/connect+json`).
pub fn is_stream(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/connect+"))
}

/// Connect's name for an error, and the HTTP status its spec pairs with it.
fn code_of(error: &Error) -> (&'static str, StatusCode) {
    match status_of(error).as_u16() {
        400 | 413 => ("invalid_argument", StatusCode::BAD_REQUEST),
        401 => ("unauthenticated", StatusCode::UNAUTHORIZED),
        403 => ("permission_denied", StatusCode::FORBIDDEN),
        404 => ("not_found", StatusCode::NOT_FOUND),
        408 | 504 => ("deadline_exceeded", StatusCode::GATEWAY_TIMEOUT),
        409 => ("already_exists", StatusCode::CONFLICT),
        429 | 507 => ("resource_exhausted", StatusCode::TOO_MANY_REQUESTS),
        501 => ("unimplemented", StatusCode::NOT_IMPLEMENTED),
        502 | 503 => ("unavailable", StatusCode::SERVICE_UNAVAILABLE),
        _ => ("internal", StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// The error object; host detail hidden (agent callers are never root).
fn error_json(error: &Error) -> Value {
    let (code, status) = code_of(error);
    let incident = format!("e2b-{:08x}", rand::random::<u32>());
    let expected = [StatusCode::SERVICE_UNAVAILABLE, StatusCode::NOT_IMPLEMENTED];
    if status.is_server_error() && !expected.contains(&status) {
        tracing::warn!(%incident, "e2b agent call: {error}");
    }
    let message = tenant_message(error, &incident).unwrap_or_else(|| error.to_string());
    json!({"code": code, "message": message})
}

/// An error answer: a unary one, or a whole stream that is only its end.
pub fn error_response(error: &Error, stream: bool) -> Response<Body> {
    if stream {
        let body = envelope::encode(
            END_STREAM,
            json!({"error": error_json(error)}).to_string().as_bytes(),
        );
        return with_type(StatusCode::OK, "application/connect+json", body);
    }
    let status = code_of(error).1;
    with_type(
        status,
        "application/json",
        Bytes::from(error_json(error).to_string()),
    )
}

/// A unary success.
pub fn ok(value: Value) -> Response<Body> {
    with_type(
        StatusCode::OK,
        "application/json",
        Bytes::from(value.to_string()),
    )
}

fn with_type(status: StatusCode, kind: &'static str, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    resp
}

/// Reads a unary request (`application/json`, at most [`MAX_BODY`]).
pub async fn read_unary<T: DeserializeOwned>(e2b: &E2b, req: Request<Incoming>) -> Result<T> {
    if is_stream(req.headers()) {
        return Err(Error::BadRequest(
            "this method is unary: send application/json".into(),
        ));
    }
    let kind = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !kind.is_empty() && !kind.starts_with("application/json") {
        return Err(Error::Unsupported(format!(
            "content type {kind:?}: only the Connect JSON codec is served"
        )));
    }
    let bytes = read_capped(e2b, req.into_body(), MAX_BODY).await?;
    decode_message(if bytes.is_empty() { b"{}" } else { &bytes })
}

/// Reads a server-stream request: exactly one envelope.
pub async fn read_stream_request<T: DeserializeOwned>(
    e2b: &E2b,
    req: Request<Incoming>,
) -> Result<T> {
    if !is_stream(req.headers()) {
        return Err(Error::BadRequest(
            "this method is a server stream: send application/connect+json".into(),
        ));
    }
    let mut buf =
        BytesMut::from(&read_capped(e2b, req.into_body(), MAX_REQUEST_MESSAGE + 5).await?[..]);
    let env = envelope::decode(&mut buf, MAX_REQUEST_MESSAGE)?
        .ok_or_else(|| Error::BadRequest("the request envelope is cut short".into()))?;
    if !buf.is_empty() || env.flags != 0 {
        return Err(Error::BadRequest(
            "a server stream takes exactly one request message".into(),
        ));
    }
    decode_message(&env.data)
}

fn decode_message<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::BadRequest(format!("invalid message: {e}")))
}

async fn read_capped(e2b: &E2b, body: Incoming, cap: usize) -> Result<Bytes> {
    crate::api::read_body(&e2b.node, body, cap).await
}

/// The sending side of a server stream's body.
pub struct Stream {
    tx: mpsc::Sender<std::result::Result<Bytes, Infallible>>,
}

impl Stream {
    /// A stream and the 200 response that carries it.
    pub fn open() -> (Stream, Response<Body>) {
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let mut resp = Response::new(channel_body(rx));
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/connect+json"),
        );
        (Stream { tx }, resp)
    }

    /// Sends one message; false once the client has gone.
    pub async fn send(&self, message: Value) -> bool {
        let bytes = envelope::encode(0, message.to_string().as_bytes());
        self.tx.send(Ok(bytes)).await.is_ok()
    }

    /// Ends the stream, with the error when there is one.
    pub async fn end(self, error: Option<&Error>) {
        let end = match error {
            Some(e) => json!({"error": error_json(e)}),
            None => json!({}),
        };
        let _ = self
            .tx
            .send(Ok(envelope::encode(END_STREAM, end.to_string().as_bytes())))
            .await;
    }

    /// Resolves when the client has gone.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// `already_exists` (409), which no node error stands for: E2B's `make_dir` reads it as
/// "it was there".
pub fn already_exists(message: &str) -> Response<Body> {
    let body = json!({"code": "already_exists", "message": message});
    with_type(
        StatusCode::CONFLICT,
        "application/json",
        Bytes::from(body.to_string()),
    )
}
