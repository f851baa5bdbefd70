//! Buffered exec against a scripted fake silkd (in-memory streams, paused clock): the
//! answers real silkd rarely gives — `resource_exhausted`, `internal`, a command that never
//! ends, a `Kill` that fails or is never answered — and that every give-up sends `Kill` for
//! the right pid on a fresh stream before answering, within the 5 s bound. Then a hostile
//! one (the guest is as hostile as its user): maximal frames forever, tiny frames forever,
//! empty frames, endless `Started`, frames of the wrong type, frames built to cost memory;
//! each ends in a clear status, a checked `Kill`, and bounded memory.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use sandboxd::api::status_of;
use sandboxd::claims::{now_ms, Claims, Sandbox};
use sandboxd::config::ExecConfig;
use sandboxd::engine::{Fate, Guest, GuestStream};
use sandboxd::exec::{self, Execs};
use sandboxd::metrics::Metrics;
use tokio::io::AsyncWriteExt;
use tokio_util::codec::Framed;
use wire::{ErrorKind, GuestCodec, Request, Response};

/// How the fake silkd answers.
#[derive(Clone, Copy)]
enum Script {
    /// `Exec` → `Error{kind}`.
    Refuse(ErrorKind),
    /// `Exec` → `Started`, then silence; `Kill` → `Done`.
    Hang,
    /// `Exec` → `Started`, `Exit{timed_out: true}`.
    SilkdTimeout,
    /// `Exec` → `Started`, then `Stdout` frames of this many bytes forever.
    Flood(usize),
    /// `Exec` → `Started`, then a frame prefix announcing the 8 MiB protocol maximum and
    /// its bytes, forever.
    Maximal,
    /// `Exec` → `Started`, then empty `Stdout` frames forever.
    EmptyFrames,
    /// `Exec` → `Started` forever.
    EndlessStarted,
    /// `Exec` → `Started`, then `Procs` (not an exec's answer).
    WrongType,
    /// `Exec` → `Started`, then a 100 KB frame of 100 000 values.
    ValueFlood,
    /// `Exec` → `Started`, then silence; `Kill` → `Error{internal}`.
    HangKillRefused,
    /// `Exec` → `Started`, then silence; `Kill` is never answered.
    HangKillIgnored,
}

const PID: u32 = 4242;

struct FakeGuest {
    script: Script,
    /// Pids of `Kill` requests, each received on its own connection.
    kills: Arc<Mutex<Vec<u32>>>,
    connections: Arc<Mutex<u32>>,
    /// Never written: the fake never dies.
    fate: Fate,
}

impl Guest for FakeGuest {
    fn id(&self) -> &str {
        "fake"
    }

    fn dial(&self) -> BoxFuture<'_, sandboxd::Result<GuestStream>> {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let (script, kills) = (self.script, self.kills.clone());
        *self.connections.lock().unwrap() += 1;
        tokio::spawn(async move {
            let mut conn = Framed::new(theirs, GuestCodec::new());
            while let Some(Ok(req)) = conn.next().await {
                match req {
                    Request::Exec { .. } => match script {
                        Script::Refuse(kind) => {
                            let _ = conn.send(Response::error(kind, "scripted")).await;
                        }
                        Script::SilkdTimeout => {
                            let _ = conn.send(Response::Started { pid: PID }).await;
                            let _ = conn
                                .send(Response::Exit {
                                    code: None,
                                    signal: Some(9),
                                    timed_out: true,
                                })
                                .await;
                        }
                        Script::Flood(n) => {
                            let _ = conn.send(Response::Started { pid: PID }).await;
                            let data = vec![b'x'; n];
                            while conn
                                .send(Response::Stdout { data: data.clone() })
                                .await
                                .is_ok()
                            {}
                            return;
                        }
                        Script::Maximal => {
                            let _ = conn.send(Response::Started { pid: PID }).await;
                            let mut raw = conn.into_inner();
                            let _ = raw.write_all(&(wire::MAX_FRAME as u32).to_be_bytes()).await;
                            let zeros = vec![0u8; 64 * 1024];
                            while raw.write_all(&zeros).await.is_ok() {}
                            return;
                        }
                        Script::EmptyFrames => {
                            let _ = conn.send(Response::Started { pid: PID }).await;
                            while conn.send(Response::Stdout { data: vec![] }).await.is_ok() {}
                            return;
                        }
                        Script::EndlessStarted => {
                            while conn.send(Response::Started { pid: PID }).await.is_ok() {}
                            return;
                        }
                        Script::WrongType => {
                            let _ = conn.send(Response::Started { pid: PID }).await;
                            let _ = conn.send(Response::Procs { procs: vec![] }).await;
                        }
                        Script::ValueFlood => {
                            let _ = conn.send(Response::Started { pid: PID }).await;
                            // {"type": "stdout", "data": [nil; 100 000]}
                            let mut body = vec![0x82, 0xa4];
                            body.extend_from_slice(b"type");
                            body.push(0xa6);
                            body.extend_from_slice(b"stdout");
                            body.push(0xa4);
                            body.extend_from_slice(b"data");
                            body.push(0xdd);
                            body.extend_from_slice(&100_000u32.to_be_bytes());
                            body.resize(body.len() + 100_000, 0xc0);
                            let mut frame = (body.len() as u32).to_be_bytes().to_vec();
                            frame.extend_from_slice(&body);
                            let _ = conn.get_mut().write_all(&frame).await;
                        }
                        Script::Hang | Script::HangKillRefused | Script::HangKillIgnored => {
                            let _ = conn.send(Response::Started { pid: PID }).await;
                        }
                    },
                    Request::Kill { pid, .. } => {
                        kills.lock().unwrap().push(pid);
                        match script {
                            Script::HangKillRefused => {
                                let _ = conn
                                    .send(Response::error(ErrorKind::Internal, "cannot kill"))
                                    .await;
                            }
                            Script::HangKillIgnored => std::future::pending::<()>().await,
                            _ => {
                                let _ = conn.send(Response::Done).await;
                            }
                        }
                    }
                    other => panic!("fake silkd got {other:?}"),
                }
            }
        });
        Box::pin(async move { Ok(Box::new(ours) as GuestStream) })
    }

    fn destroy(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn fate(&self) -> &Fate {
        &self.fate
    }
}

struct Outcome {
    status: u16,
    /// The error's text, empty on success.
    message: String,
    kills: Vec<u32>,
    connections: u32,
    elapsed: Duration,
    /// Stdout bytes the answer carries (a 413 keeps the first ones, up to the cap).
    kept: usize,
}

async fn run(script: Script, timeout_seconds: Option<f64>) -> Outcome {
    run_with(script, timeout_seconds, 64 * 1024).await
}

async fn run_with(script: Script, timeout_seconds: Option<f64>, max_output: u64) -> Outcome {
    let metrics = Arc::new(Metrics::new());
    let spill = tempfile::tempdir().unwrap();
    let config = ExecConfig {
        max_output_bytes: max_output,
        memory_budget_bytes: 1024 * 1024,
        max_in_flight: 4,
        ..ExecConfig::default()
    };
    let execs = Arc::new(Execs::new(&config, spill.path().to_path_buf(), metrics));
    let kills = Arc::new(Mutex::new(Vec::new()));
    let connections = Arc::new(Mutex::new(0));
    let guest = Arc::new(FakeGuest {
        script,
        kills: kills.clone(),
        connections: connections.clone(),
        fate: Fate::new(),
    });
    let claims = Claims::new(4, Default::default());
    let slot = claims.reserve(None).unwrap();
    let (sandbox, _token): (Arc<Sandbox>, String) =
        claims.insert(slot, "t".into(), "s".into(), now_ms() + 60_000, guest);
    let req = api::ExecRequest {
        argv: vec!["cmd".into()],
        timeout_seconds,
        ..Default::default()
    };
    let started = tokio::time::Instant::now();
    let admitted = execs.admit(&sandbox.id, None).unwrap();
    let answer = exec::spawn(execs.clone(), admitted, sandbox, req)
        .await
        .expect("exec task answered");
    // A command cut short (timeout, cap) is an answer with its output and its error.
    let (status, message, kept) = match answer {
        Ok(mut finished) => {
            finished.stdout.rewind().await.unwrap();
            let mut kept = 0;
            loop {
                let chunk = finished.stdout.next_chunk(64 * 1024).await.unwrap();
                if chunk.is_empty() {
                    break;
                }
                kept += chunk.len();
            }
            match finished.cut {
                Some(e) => (status_of(&e).as_u16(), e.to_string(), kept),
                None => (200, String::new(), kept),
            }
        }
        Err(e) => (status_of(&e).as_u16(), e.to_string(), 0),
    };
    let kills = kills.lock().unwrap().clone();
    let connections = *connections.lock().unwrap();
    Outcome {
        status,
        message,
        kills,
        connections,
        elapsed: started.elapsed(),
        kept,
    }
}

#[tokio::test(start_paused = true)]
async fn silkd_refusals_map_to_statuses() {
    for (kind, status) in [
        (ErrorKind::ResourceExhausted, 503),
        (ErrorKind::BadRequest, 400),
        (ErrorKind::Internal, 502),
        (ErrorKind::Unimplemented, 502),
    ] {
        let o = run(Script::Refuse(kind), None).await;
        assert_eq!(o.status, status, "{kind:?}");
        // Nothing started, so nothing to kill.
        assert!(o.kills.is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn sandboxd_timer_kills_a_command_silkd_never_ends() {
    let o = run(Script::Hang, Some(1.0)).await;
    assert_eq!(o.status, 504);
    assert_eq!(o.kills, vec![PID]);
    assert_eq!(o.connections, 2, "Kill travels on a fresh connection");
    // timeout plus sandboxd's one second of grace for silkd's own timer.
    assert!(o.elapsed >= Duration::from_secs(2) && o.elapsed < Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn silkd_timeout_still_gets_a_checked_kill() {
    let o = run(Script::SilkdTimeout, Some(5.0)).await;
    assert_eq!(o.status, 504);
    assert_eq!(o.kills, vec![PID]);
    assert!(o.elapsed < Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn output_over_the_cap_is_killed_then_413() {
    // Frames of 1000 bytes against a 64 KiB cap: the last one kept is cut mid-frame.
    let o = run(Script::Flood(1000), None).await;
    assert_eq!(o.status, 413);
    assert_eq!(o.kills, vec![PID]);
    assert_eq!(
        o.kept,
        64 * 1024,
        "the answer keeps exactly the cap's bytes"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refused_kill_is_checked_and_the_answer_still_comes() {
    let o = run(Script::HangKillRefused, Some(1.0)).await;
    assert_eq!(o.status, 504);
    assert_eq!(o.kills, vec![PID]);
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_kill_is_bounded_by_five_seconds() {
    let o = run(Script::HangKillIgnored, Some(1.0)).await;
    assert_eq!(o.status, 504);
    assert_eq!(o.kills, vec![PID]);
    // 1 s timeout + 1 s grace + the 5 s bound on the Kill.
    assert!(
        o.elapsed >= Duration::from_secs(7) && o.elapsed < Duration::from_secs(8),
        "{:?}",
        o.elapsed
    );
}

/// Each hostile script ends in a clear status naming what the guest did, after a checked
/// `Kill` of the command it started.
#[tokio::test(start_paused = true)]
async fn a_hostile_guest_gets_a_clear_status_and_a_kill() {
    for (script, status, needle) in [
        (Script::Maximal, 502, "exceeds the 262144 byte cap"),
        (Script::Flood(200 * 1024), 413, "max_output_bytes"),
        (Script::Flood(1), 413, "max_output_bytes"),
        (Script::EmptyFrames, 502, "empty output frame"),
        (Script::EndlessStarted, 502, "second Started"),
        (Script::WrongType, 502, "unexpected frame"),
        (Script::ValueFlood, 502, "65536 values"),
    ] {
        let o = run(script, None).await;
        assert_eq!(o.status, status, "{needle}: {}", o.message);
        assert!(o.message.contains(needle), "{needle}: {}", o.message);
        assert_eq!(o.kills, vec![PID], "{needle}");
    }
}

/// Peak RSS of this test process while two hostile guests at once send what costs the
/// most: announced-maximal frames, the largest frames accepted, or one-byte frames (which
/// used to cost ~40 bytes of heap per byte of output), each against a 512 KiB
/// `max_output_bytes` and a 1 MiB node budget. Bounded by the caps, not by the floods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_floods_keep_memory_bounded() {
    let before = testkit::procs::status_field(std::process::id(), "VmHWM:").unwrap();
    for script in [Script::Maximal, Script::Flood(200 * 1024), Script::Flood(1)] {
        let runs = (0..2).map(|_| run_with(script, None, 512 * 1024));
        for o in futures::future::join_all(runs).await {
            assert!(matches!(o.status, 413 | 502), "{}", o.message);
        }
    }
    let grew_mib =
        (testkit::procs::status_field(std::process::id(), "VmHWM:").unwrap() - before) / 1024;
    eprintln!("peak RSS grew {grew_mib} MiB");
    // 2 × (512 KiB of output + a 256 KiB frame + its decoded copy + duplex buffers).
    assert!(grew_mib < 16, "peak RSS grew {grew_mib} MiB");
}
