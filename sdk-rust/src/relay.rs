//! The relay: `wire` frames over a sandbox's `agent` route upgraded to `silkd`, each
//! connection a fresh silkd stream. Opens connections and makes one-answer RPCs; knows
//! nothing of claims, buffered exec or spawned processes.

use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

use crate::error::{Error, Result};
use crate::transport::Http;

/// A relay connection: wire frames over the upgraded HTTP stream to a fresh silkd stream.
pub(crate) type Relay = Framed<TokioIo<hyper::upgrade::Upgraded>, HostCodec>;

/// A fresh relay connection through `path` (a sandbox's `agent` route).
pub(crate) async fn connect(http: &Http, path: &str, token: Option<&str>) -> Result<Relay> {
    let upgraded = http.upgrade(path, token, "silkd").await?;
    Ok(Framed::new(TokioIo::new(upgraded), HostCodec::new()))
}

/// One request on a fresh relay connection and its single answer; a silkd `Error` frame
/// becomes the matching [`Error`].
pub(crate) async fn rpc(
    http: &Http,
    path: &str,
    token: Option<&str>,
    req: Request,
) -> Result<Response> {
    let mut relay = connect(http, path, token).await?;
    relay.send(req).await.map_err(Error::transport)?;
    match relay.next().await {
        Some(Ok(Response::Error { kind, message })) => Err(Error::from_guest(kind, message)),
        Some(Ok(answer)) => Ok(answer),
        Some(Err(e)) => Err(Error::transport(e)),
        None => Err(Error::Protocol("the relay closed without an answer".into())),
    }
}
