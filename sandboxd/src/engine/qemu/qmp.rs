//! A small typed QMP client: one command at a time over QEMU's `-qmp unix:` socket,
//! events skipped, errors returned with QEMU's own class and description.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
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
        self.reply(command).await
    }

    /// Hands `fd` to QEMU under `name` (`getfd`, the descriptor riding in SCM_RIGHTS) for
    /// an `fd:NAME` migration URI: QEMU opens nothing of sandboxd's by path, so a file it
    /// may not open itself reaches it this way, and only this one.
    pub async fn send_fd(&mut self, name: &str, fd: BorrowedFd<'_>) -> Result<()> {
        let mut line = json!({ "execute": "getfd", "arguments": { "fdname": name } }).to_string();
        line.push('\n');
        let sock: &UnixStream = self.writer.as_ref();
        let fail = |e: std::io::Error| Error::Engine(format!("QMP getfd: {e}"));
        loop {
            sock.writable().await.map_err(fail)?;
            match sock.try_io(tokio::io::Interest::WRITABLE, || {
                send_with_fd(sock.as_raw_fd(), line.as_bytes(), fd.as_raw_fd())
            }) {
                Ok(n) if n == line.len() => break,
                Ok(n) => return Err(Error::Engine(format!("QMP getfd: short write ({n} bytes)"))),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(fail(e)),
            }
        }
        self.reply("getfd").await.map(drop)
    }

    async fn reply(&mut self, command: &str) -> Result<Value> {
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

/// One `sendmsg` of `bytes` with `fd` attached as SCM_RIGHTS; the bytes fit one small
/// message, so a short write means the socket is broken.
fn send_with_fd(sock: RawFd, bytes: &[u8], fd: RawFd) -> std::io::Result<usize> {
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    // SAFETY: `control` holds CMSG_SPACE(one fd) bytes, so the first header and its data
    // (one RawFd) lie inside it; the pointers stay valid for the sendmsg call.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut RawFd, fd);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}
