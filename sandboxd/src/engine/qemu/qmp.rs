//! A small typed QMP client: one command at a time over QEMU's `-qmp unix:` socket,
//! events skipped, errors returned with QEMU's own class and description.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use crate::error::{Error, Result};

/// Bound on any single QMP exchange.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// A negotiated QMP session.
pub struct Qmp {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Qmp {
    /// Connects (retrying while QEMU creates the socket, up to `within`), reads the
    /// greeting and enters command mode.
    pub async fn connect(path: &Path, within: Duration) -> Result<Qmp> {
        let start = tokio::time::Instant::now();
        let stream = loop {
            match UnixStream::connect(path).await {
                Ok(s) => break s,
                Err(_) if start.elapsed() < within => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(e) => return Err(Error::Engine(format!("QMP socket {}: {e}", path.display()))),
            }
        };
        let (r, w) = stream.into_split();
        let mut qmp = Qmp {
            reader: BufReader::new(r),
            writer: w,
        };
        let greeting = qmp.read_message().await?;
        if greeting.get("QMP").is_none() {
            return Err(Error::Engine(format!(
                "QMP: unexpected greeting {greeting}"
            )));
        }
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    /// Runs one command and returns its `return` value.
    pub async fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut line = msg.to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .await
            .map_err(|e| Error::Engine(format!("QMP {command}: {e}")))?;
        loop {
            let reply = self.read_message().await?;
            if reply.get("event").is_some() {
                continue;
            }
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                return Err(Error::Engine(format!(
                    "QMP {command}: {} ({})",
                    e.get("desc").and_then(Value::as_str).unwrap_or("?"),
                    e.get("class").and_then(Value::as_str).unwrap_or("?")
                )));
            }
            return Err(Error::Engine(format!(
                "QMP {command}: unexpected reply {reply}"
            )));
        }
    }

    /// Polls `query-migrate` until it completes (or fails), bounded by `within`.
    pub async fn wait_migration(&mut self, within: Duration) -> Result<()> {
        let start = tokio::time::Instant::now();
        loop {
            let status = self.execute("query-migrate", None).await?;
            match status.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(()),
                Some("failed") | Some("cancelled") => {
                    return Err(Error::Engine(format!(
                        "migration failed: {}",
                        status
                            .get("error-desc")
                            .and_then(Value::as_str)
                            .unwrap_or("no detail")
                    )))
                }
                _ if start.elapsed() > within => {
                    return Err(Error::Engine(format!(
                        "migration did not complete within {within:?}: {status}"
                    )))
                }
                _ => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
    }

    async fn read_message(&mut self) -> Result<Value> {
        let mut line = String::new();
        let n = tokio::time::timeout(REPLY_TIMEOUT, self.reader.read_line(&mut line))
            .await
            .map_err(|_| Error::Engine("QMP: no reply within 30 s".into()))?
            .map_err(|e| Error::Engine(format!("QMP read: {e}")))?;
        if n == 0 {
            return Err(Error::Engine("QMP: QEMU closed the monitor".into()));
        }
        serde_json::from_str(&line).map_err(|e| Error::Engine(format!("QMP: bad JSON {e}: {line}")))
    }
}
