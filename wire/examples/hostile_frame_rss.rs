//! Peak RSS of decoding one hostile maximal frame: an 8 MiB `Exec` whose `env` holds
//! ~1.7 M one-byte pairs (what a guest reads), or an 8 MiB `Procs` whose `argv` holds
//! ~8 M empty strings (what a host reads). `raw` decodes it with rmp-serde directly, as
//! the codec did before the shape check; `codec` goes through the codec.
//!
//! `cargo run --release -p wire --example hostile_frame_rss -- {raw|codec} {env|procs}`

use bytes::BytesMut;
use tokio_util::codec::Decoder;
use wire::{GuestCodec, HostCodec, Request, Response, MAX_FRAME};

fn str8(out: &mut Vec<u8>, s: &str) {
    out.push(0xa0 | s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

fn env_body() -> Vec<u8> {
    let pairs = ((MAX_FRAME - 64) / 5) as u32;
    let mut b = vec![0x83];
    str8(&mut b, "type");
    str8(&mut b, "exec");
    str8(&mut b, "argv");
    b.push(0x91);
    str8(&mut b, "true");
    str8(&mut b, "env");
    b.push(0xdd);
    b.extend_from_slice(&pairs.to_be_bytes());
    for _ in 0..pairs {
        b.extend_from_slice(&[0x92, 0xa1, b'k', 0xa1, b'v']);
    }
    b
}

fn procs_body() -> Vec<u8> {
    let n = (MAX_FRAME - 64) as u32;
    let mut b = vec![0x82];
    str8(&mut b, "type");
    str8(&mut b, "procs");
    str8(&mut b, "procs");
    b.extend_from_slice(&[0x91, 0x83]);
    str8(&mut b, "pid");
    b.push(0x01);
    str8(&mut b, "argv");
    b.push(0xdd);
    b.extend_from_slice(&n.to_be_bytes());
    b.resize(b.len() + n as usize, 0xa0);
    str8(&mut b, "state");
    str8(&mut b, "running");
    b
}

fn hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (how, what) = match args.as_slice() {
        [how, what] => (how.as_str(), what.as_str()),
        _ => {
            eprintln!("usage: hostile_frame_rss raw|codec env|procs");
            std::process::exit(2);
        }
    };
    let body = match what {
        "env" => env_body(),
        "procs" => procs_body(),
        _ => panic!("env or procs"),
    };
    let mut frame = BytesMut::new();
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    drop(body);
    let before = hwm_kib();
    let outcome = match (how, what) {
        ("raw", "env") => rmp_serde::from_slice::<Request>(&frame[4..])
            .map(|_| "decoded".to_string())
            .unwrap_or_else(|e| e.to_string()),
        ("raw", "procs") => rmp_serde::from_slice::<Response>(&frame[4..])
            .map(|_| "decoded".to_string())
            .unwrap_or_else(|e| e.to_string()),
        ("codec", "env") => match GuestCodec::new().decode(&mut frame) {
            Ok(_) => "decoded".into(),
            Err(e) => format!("refused: {e}"),
        },
        ("codec", "procs") => match HostCodec::new().decode(&mut frame) {
            Ok(_) => "decoded".into(),
            Err(e) => format!("refused: {e}"),
        },
        _ => panic!("raw or codec"),
    };
    let after = hwm_kib();
    println!(
        "{how} {what}: {outcome}; peak RSS {} MiB before decoding, {} MiB after (+{} MiB)",
        before / 1024,
        after / 1024,
        (after - before) / 1024
    );
}
