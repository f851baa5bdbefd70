//! Suite `throughput`: stdout of `dd if=/dev/zero bs=1M count=N` through the relay into the SDK
//! (chunks counted and dropped) and into `sbx exec` (its stdout a pipe this process
//! drains), next to the same bytes through a local pipe into this process; then 8 MiB
//! through buffered exec next to 8 MiB through a local pipe.

use std::time::{Duration, Instant};

use sandbox_sdk::{ClaimOptions, Command, Sandbox};
use testkit::{bins, ROOT};
use tokio::io::AsyncReadExt;

use crate::node::{host_pipe, BoxError, Engine, Node, Shape};
use crate::stats::{Samples, Table};

const BUFFERED: u64 = 8 << 20;

/// The producer: `dd` in 1 MiB blocks (`bytes` a multiple of 1 MiB). Not `head -c`: the
/// guest image's busybox `head` copies in small pieces and, profiled, was the slowest
/// stage of the pipe (29% of both cores), so it measured busybox, not the relay.
fn zeroes(bytes: u64) -> Command {
    Command::new("dd").args(zero_args(bytes))
}

/// `dd`'s arguments for `bytes` of zeroes; its record counts go to stderr.
fn zero_args(bytes: u64) -> [String; 3] {
    [
        "if=/dev/zero".into(),
        "bs=1048576".into(),
        format!("count={}", bytes >> 20),
    ]
}

async fn into_sdk(sandbox: &Sandbox, bytes: u64) -> Result<(), BoxError> {
    let mut p = sandbox.spawn(&zeroes(bytes)).await?;
    let mut out = p.take_stdout().ok_or("no stdout")?;
    let mut got = 0u64;
    while let Some(chunk) = out.next_chunk().await {
        got += chunk.len() as u64;
    }
    let status = p.wait().await?;
    if got != bytes || !status.success() {
        return Err(format!("got {got} of {bytes} bytes, {status:?}").into());
    }
    Ok(())
}

async fn into_sbx(url: &str, id: &str, bytes: u64) -> Result<(), BoxError> {
    let mut child = tokio::process::Command::new(bins::debug_dir().join("sbx"))
        .env("SANDBOXD_URL", url)
        .env("SANDBOXD_TOKEN", ROOT)
        .args(["exec", id, "--", "dd"])
        .args(zero_args(bytes))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut out = child.stdout.take().ok_or("no stdout")?;
    let mut buf = vec![0u8; 256 << 10];
    let mut got = 0u64;
    loop {
        let k = out.read(&mut buf).await?;
        if k == 0 {
            break;
        }
        got += k as u64;
    }
    let status = child.wait().await?;
    if got != bytes || !status.success() {
        return Err(format!("sbx: got {got} of {bytes} bytes, {status}").into());
    }
    Ok(())
}

/// A bound on one transfer of `bytes`, so that a stalled stream is counted as a failure
/// and the suite goes on: 10 s plus 1 s per MiB, far beyond any healthy run here (a qemu
/// guest's output stream once stalled for good a few hundred KiB short of its end:
/// docs/benchmarks.md).
fn bound(bytes: u64) -> Duration {
    Duration::from_secs(10 + (bytes >> 20))
}

/// `work`, or a failure once [`bound`] of `bytes` has passed (dropping it kills what it
/// started: the SDK's process, `sbx` with `kill_on_drop`).
async fn bounded(
    bytes: u64,
    work: impl std::future::Future<Output = Result<(), BoxError>>,
) -> Result<(), BoxError> {
    let limit = bound(bytes);
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or_else(|_| Err(format!("stalled: {bytes} bytes not through in {limit:?}").into()))
}

fn record(s: &mut Samples, t: Instant, r: Result<(), BoxError>) {
    match r {
        Ok(()) => s.push(t.elapsed()),
        Err(e) => {
            eprintln!("bench throughput: {e}");
            s.failures += 1;
        }
    }
}

pub async fn run(engine: Engine, quick: bool) -> Result<(), BoxError> {
    let (bytes, n) = match (engine, quick) {
        (Engine::Process, false) => (1u64 << 30, 3),
        (Engine::Qemu, false) => (256 << 20, 3),
        (Engine::Process, true) => (64 << 20, 2),
        (Engine::Qemu, true) => (16 << 20, 1),
    };
    let node = Node::start(
        engine,
        Shape {
            warm: 1,
            max_claims: 4,
            max_in_flight: 16,
            // Room for dd's record counts on stderr, which count against the cap too.
            max_output_bytes: BUFFERED + 4096,
        },
    )
    .await?;
    node.wait_warm(1).await;
    let sandbox = node.client().claim(ClaimOptions::new()).await?;
    let url = node.daemon.url();
    let (mut floor, mut sdk, mut sbx) =
        (Samples::default(), Samples::default(), Samples::default());
    for _ in 0..n {
        floor.push(host_pipe(bytes, 1)?.median());
        let t = Instant::now();
        record(&mut sdk, t, bounded(bytes, into_sdk(&sandbox, bytes)).await);
        let t = Instant::now();
        let r = bounded(bytes, into_sbx(&url, sandbox.id(), bytes)).await;
        record(&mut sbx, t, r);
    }
    let mib = bytes >> 20;
    let mut table = Table::new("throughput", engine.name());
    table.floor(&format!("local pipe, {mib} MiB"), &floor, Some(bytes));
    table.row(&format!("relay into the SDK, {mib} MiB"), &sdk, Some(bytes));
    table.row(
        &format!("relay into `sbx exec`, {mib} MiB"),
        &sbx,
        Some(bytes),
    );

    let (mut floor, mut buffered) = (Samples::default(), Samples::default());
    let rounds = if quick { 3 } else { 10 };
    for _ in 0..rounds {
        floor.push(host_pipe(BUFFERED, 1)?.median());
        let t = Instant::now();
        let r = bounded(BUFFERED, async {
            match sandbox.exec(&zeroes(BUFFERED)).await {
                Ok(o) if o.stdout.len() as u64 == BUFFERED => Ok(()),
                Ok(o) => Err(format!("buffered: {} bytes", o.stdout.len()).into()),
                Err(e) => Err(e.into()),
            }
        })
        .await;
        record(&mut buffered, t, r);
    }
    table.floor("local pipe, 8 MiB", &floor, Some(BUFFERED));
    table.row("buffered exec, 8 MiB", &buffered, Some(BUFFERED));
    sandbox.release().await?;
    Ok(())
}
