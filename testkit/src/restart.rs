//! What the restart tests need beyond a daemon: its state database (`data_dir/state.db`)
//! read and tampered with the way a crash, an attacker with the file, or time passing
//! would, the processes a recorded engine handle names, and one `Info` through the relay.

use std::path::{Path, PathBuf};

use futures::{SinkExt, StreamExt};
use rusqlite::Connection;
use serde_json::Value;
use tokio_util::codec::Framed;
use wire::{HostCodec, Request, Response};

use crate::relay::upgrade;

/// The daemon's state database.
pub fn state_db(data_dir: &Path) -> PathBuf {
    data_dir.join("state.db")
}

fn open(data_dir: &Path) -> Connection {
    let c = Connection::open(state_db(data_dir)).expect("opening state.db");
    c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    c
}

/// Ids of the recorded claims.
pub fn recorded_ids(data_dir: &Path) -> Vec<String> {
    let c = open(data_dir);
    let mut q = c.prepare("SELECT id FROM claims ORDER BY id").unwrap();
    let ids = q.query_map([], |r| r.get(0)).unwrap();
    ids.collect::<Result<_, _>>().unwrap()
}

/// A recorded claim's engine handle, as JSON.
pub fn handle(data_dir: &Path, id: &str) -> Value {
    let c = open(data_dir);
    let text: String = c
        .query_row("SELECT handle FROM claims WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .unwrap_or_else(|e| panic!("no handle recorded for {id}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// The guest's pids a handle names: its main process (bwrap) and the namespace init.
pub fn guest_pids(data_dir: &Path, id: &str) -> Vec<u32> {
    let h = handle(data_dir, id);
    let mut pids = vec![h["pid"].as_u64().unwrap() as u32];
    if let Some(init) = h["init"].as_array() {
        pids.push(init[0].as_u64().unwrap() as u32);
    }
    pids
}

/// Moves a claim's deadline into the past, as if it had expired while sandboxd was down.
pub fn expire(data_dir: &Path, id: &str) {
    let n = open(data_dir)
        .execute("UPDATE claims SET deadline_ms = 1 WHERE id = ?1", [id])
        .unwrap();
    assert_eq!(n, 1, "no claim {id}");
}

/// Deletes a claim's record, leaving its guest running with no record that owns it.
pub fn forget(data_dir: &Path, id: &str) {
    let n = open(data_dir)
        .execute("DELETE FROM claims WHERE id = ?1", [id])
        .unwrap();
    assert_eq!(n, 1, "no claim {id}");
}

/// Points a claim's handle at another process (`pid` with its real start time, and as
/// its namespace init too where the handle has one): what a reused pid, or a tampered
/// file, looks like.
pub fn point_at(data_dir: &Path, id: &str, pid: u32) {
    let start = start_time(pid).expect("the process to point at is running");
    let mut h = handle(data_dir, id);
    h["pid"] = pid.into();
    h["start_time"] = start.into();
    if !h["init"].is_null() {
        h["init"] = serde_json::json!([pid, start]);
    }
    let n = open(data_dir)
        .execute(
            "UPDATE claims SET handle = ?2 WHERE id = ?1",
            [id, &h.to_string()],
        )
        .unwrap();
    assert_eq!(n, 1);
}

/// Overwrites the middle of the database file with garbage (a torn disk, a bad edit).
pub fn corrupt(data_dir: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let path = state_db(data_dir);
    let len = std::fs::metadata(&path).unwrap().len();
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // Page 1 holds the header and schema; ruin everything past the first 100 bytes.
    f.seek(SeekFrom::Start(100)).unwrap();
    f.write_all(&vec![0xa5; (len.max(8192) - 100) as usize])
        .unwrap();
    for side in ["state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(data_dir.join(side));
    }
}

/// A process's start time (`/proc/PID/stat` field 22), `None` once it is gone.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Asks for the relay with `token` and sends `Info` through it: true when silkd answers.
pub async fn relay_info(addr: std::net::SocketAddr, id: &str, token: &str) -> bool {
    let (status, stream, rest) =
        upgrade(addr, &format!("/v1/sandboxes/{id}/agent"), Some(token)).await;
    if status != 101 {
        return false;
    }
    assert!(rest.is_empty(), "bytes before the first frame: {rest:?}");
    let mut conn = Framed::new(stream, HostCodec::new());
    conn.send(Request::Info).await.unwrap();
    matches!(conn.next().await, Some(Ok(Response::Info { .. })))
}

/// Starts `argv` through the relay and reads nothing past `Started`: its output backs up
/// in the guest channel, as it does when the daemon is killed mid-stream. The connection
/// is returned so the backlog lasts as long as the caller holds it.
pub async fn exec_unread(
    addr: std::net::SocketAddr,
    id: &str,
    token: &str,
    argv: &[&str],
) -> Framed<tokio::net::TcpStream, HostCodec> {
    let (status, stream, rest) =
        upgrade(addr, &format!("/v1/sandboxes/{id}/agent"), Some(token)).await;
    assert_eq!(status, 101);
    assert!(rest.is_empty(), "bytes before the first frame: {rest:?}");
    let mut conn = Framed::new(stream, HostCodec::new());
    conn.send(Request::Exec {
        detach: false,
        pty: None,
        argv: argv.iter().map(|a| a.to_string()).collect(),
        cwd: None,
        env: None,
        user: None,
        stdin: false,
        timeout_ms: None,
    })
    .await
    .unwrap();
    match conn.next().await {
        Some(Ok(Response::Started { .. })) => conn,
        other => panic!("expected Started, got {other:?}"),
    }
}

/// `kill -9`s `d`, then starts `binary` with `config` in `dir` (the same data dir): the new
/// daemon, its start-to-serving wall time, and the reconciliation time it logged
/// (`elapsed=` of its "reconciled the state database" line, as sandboxd prints it).
pub async fn kill_and_restart(
    d: &mut crate::DaemonProcess,
    binary: &Path,
    dir: &Path,
    config: &str,
) -> Result<(crate::DaemonProcess, std::time::Duration, String), String> {
    d.process().kill();
    let started = std::time::Instant::now();
    let next = crate::DaemonProcess::start(binary, dir, config).await;
    let wall = started.elapsed();
    let reconcile = next
        .log_text()
        .lines()
        .find(|l| l.contains("reconciled the state database"))
        .and_then(|l| l.split_once("elapsed="))
        .map(|(_, v)| v.split_whitespace().next().unwrap_or("").to_string())
        .ok_or("no reconciliation line in the log")?;
    Ok((next, wall, reconcile))
}
