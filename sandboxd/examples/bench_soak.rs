//! `cargo run --release -p sandboxd --example bench_soak [-- --quick] [-- --no-restart]`:
//! the soak of issue 11 (what `cargo xtask bench soak` runs).
//!
//! Starts the real sandboxd binary (beside this example, process engine), claims 8
//! sandboxes and runs 10,000 buffered execs (500 with `--quick`) at concurrency 64, each
//! printing a marker of its own. 5% of clients hang up at random mid-exec (a `sleep`
//! that is then killed). Halfway through, sandboxd is `kill -9`ed and started again with
//! the same binary, config and data_dir. An exec whose answer was lost to the restart
//! (no connection, a 5xx inside the window, or a 401/404 for a sandbox that did not
//! survive it) is retried; a lost sandbox is claimed again once and counted.
//!
//! Prints: completed replies and how many carried their own marker (must be all), 5xx
//! outside the restart window (must be 0), sandboxes lost at restart, leaked processes
//! afterwards (must be 0), and sandboxd's RSS at the start vs the end. Exits non-zero when
//! a must is broken.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::json;
use testkit::leftovers::Census;
use testkit::{try_call, DaemonProcess, Endpoint, Setup, ROOT};

const SANDBOXES: usize = 8;
const CONCURRENCY: usize = 64;
const HANGUP_PERCENT: u32 = 5;

/// One claimed sandbox; `generation` rises each time it is claimed again.
#[derive(Clone)]
struct Slot {
    id: String,
    token: String,
    generation: u64,
}

/// Everything the clients share.
struct Soak {
    endpoint: Endpoint,
    slots: Vec<Mutex<Slot>>,
    /// Held while a slot is claimed again, so its 8 clients claim one sandbox, not 8.
    reclaiming: Vec<tokio::sync::Mutex<()>>,
    /// Milliseconds since `t0` of the kill and of the restarted daemon serving
    /// (`u64::MAX` until then): the restart window.
    t0: Instant,
    killed_at: AtomicU64,
    serving_at: AtomicU64,
    next: AtomicUsize,
    total: usize,
    completed: AtomicUsize,
    own_marker: AtomicUsize,
    wrong: AtomicUsize,
    hung_up: AtomicUsize,
    retried: AtomicUsize,
    server_errors_outside: AtomicUsize,
    server_errors_inside: AtomicUsize,
    other: AtomicUsize,
    lost: AtomicUsize,
}

impl Soak {
    fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// Whether [start, end] overlaps the restart window.
    fn in_window(&self, start: u64, end: u64) -> bool {
        let killed = self.killed_at.load(Ordering::SeqCst);
        killed != u64::MAX && end >= killed && start <= self.serving_at.load(Ordering::SeqCst)
    }

    async fn claim(&self) -> Result<(String, String), String> {
        let r = try_call(&self.endpoint, "POST", "/v1/claim", Some(ROOT), Some("{}")).await?;
        if r.status != 200 {
            return Err(format!("claim answered {}: {}", r.status, r.text()));
        }
        let v = r.json();
        Ok((
            v["id"].as_str().unwrap().into(),
            v["token"].as_str().unwrap().into(),
        ))
    }

    /// A sandbox answered 404: claim its slot again, once per generation.
    async fn reclaim(&self, n: usize, generation: u64) {
        let _one_at_a_time = self.reclaiming[n].lock().await;
        if self.slots[n].lock().unwrap().generation != generation {
            return;
        }
        let (id, token) = match self.claim().await {
            Ok(claimed) => claimed,
            Err(e) => return eprintln!("soak: claiming sandbox {n} again: {e}"),
        };
        let mut slot = self.slots[n].lock().unwrap();
        if slot.generation == generation {
            *slot = Slot {
                id,
                token,
                generation: generation + 1,
            };
            self.lost.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// One client: takes exec numbers until there are none left.
    async fn client(self: Arc<Self>, worker: usize) {
        loop {
            let i = self.next.fetch_add(1, Ordering::SeqCst);
            if i >= self.total {
                return;
            }
            let hang_up = rand::thread_rng().gen_range(0..100) < HANGUP_PERCENT;
            self.exec(worker % SANDBOXES, i, hang_up).await;
        }
    }

    /// Exec number `i` in slot `n` until it has an answer that is not the restart's.
    async fn exec(&self, n: usize, i: usize, hang_up: bool) {
        let marker = format!("soak-{i}-{:016x}", rand::thread_rng().gen::<u64>());
        let argv = if hang_up {
            json!(["sh", "-c", format!("sleep 5; echo {marker}")])
        } else {
            json!(["echo", marker])
        };
        let body = json!({ "argv": argv }).to_string();
        for _attempt in 0..1000 {
            let slot = self.slots[n].lock().unwrap().clone();
            let path = format!("/v1/sandboxes/{}/exec", slot.id);
            let start = self.now_ms();
            let call = try_call(
                &self.endpoint,
                "POST",
                &path,
                Some(&slot.token),
                Some(&body),
            );
            if hang_up {
                // The command sleeps 5 s: the client is gone long before it answers.
                let wait = rand::thread_rng().gen_range(20..300);
                let _ = tokio::time::timeout(Duration::from_millis(wait), call).await;
                self.hung_up.fetch_add(1, Ordering::SeqCst);
                return;
            }
            let answer = call.await;
            let end = self.now_ms();
            let in_window = self.in_window(start, end);
            match answer {
                Ok(r) if r.status == 200 => {
                    self.completed.fetch_add(1, Ordering::SeqCst);
                    let v = r.json();
                    if v["stdout"] == format!("{marker}\n") && v["exit_code"] == 0 {
                        self.own_marker.fetch_add(1, Ordering::SeqCst);
                    } else {
                        self.wrong.fetch_add(1, Ordering::SeqCst);
                        eprintln!("soak: exec {i} answered {v} (marker {marker})");
                    }
                    return;
                }
                // A sandbox that did not survive the restart: its token is unknown (401)
                // or, asked as root, its id (404).
                Ok(r)
                    if (r.status == 401 || r.status == 404)
                        && self.killed_at.load(Ordering::SeqCst) != u64::MAX =>
                {
                    self.reclaim(n, slot.generation).await;
                }
                Ok(r) if r.status.is_server_error() && in_window => {
                    self.server_errors_inside.fetch_add(1, Ordering::SeqCst);
                }
                Ok(r) if r.status.is_server_error() => {
                    self.server_errors_outside.fetch_add(1, Ordering::SeqCst);
                    eprintln!("soak: exec {i}: {} {}", r.status, r.text());
                    return;
                }
                Ok(r) => {
                    self.other.fetch_add(1, Ordering::SeqCst);
                    eprintln!("soak: exec {i}: {} {}", r.status, r.text());
                    return;
                }
                Err(_) if in_window || self.serving_at.load(Ordering::SeqCst) == u64::MAX => {}
                Err(e) => {
                    self.other.fetch_add(1, Ordering::SeqCst);
                    eprintln!("soak: exec {i}: {e}");
                    return;
                }
            }
            self.retried.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("soak: exec {i}: no answer after 1000 attempts");
        self.other.fetch_add(1, Ordering::SeqCst);
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn mean(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len().max(1) as f64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let restart = !args.iter().any(|a| a == "--no-restart");
    let total = if quick { 500 } else { 10_000 };
    let bin = testkit::bins::debug_dir(); // target/release for a release example
    let sandboxd = bin.join("sandboxd");

    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let setup = Setup {
        warm: 1,
        max_claims: 16,
        max_in_flight: 256,
        max_output_bytes: 64 * 1024,
        memory_budget_bytes: 16 * 1024 * 1024,
        default_ttl_seconds: 3600,
        max_ttl_seconds: 3600,
        ..Setup::default()
    };
    let config = setup.toml(&data, &format!("127.0.0.1:{port}"));
    let mut daemons = vec![DaemonProcess::start(&sandboxd, tmp.path(), &config).await];
    let endpoint = Endpoint::parse(&format!("127.0.0.1:{port}"));

    let mut slots = Vec::new();
    let soak = Soak {
        endpoint: endpoint.clone(),
        slots: Vec::new(),
        reclaiming: (0..SANDBOXES)
            .map(|_| tokio::sync::Mutex::new(()))
            .collect(),
        t0: Instant::now(),
        killed_at: AtomicU64::new(u64::MAX),
        serving_at: AtomicU64::new(u64::MAX),
        next: AtomicUsize::new(0),
        total,
        completed: AtomicUsize::new(0),
        own_marker: AtomicUsize::new(0),
        wrong: AtomicUsize::new(0),
        hung_up: AtomicUsize::new(0),
        retried: AtomicUsize::new(0),
        server_errors_outside: AtomicUsize::new(0),
        server_errors_inside: AtomicUsize::new(0),
        other: AtomicUsize::new(0),
        lost: AtomicUsize::new(0),
    };
    for _ in 0..SANDBOXES {
        let (id, token) = soak.claim().await.expect("initial claim");
        slots.push(Mutex::new(Slot {
            id,
            token,
            generation: 0,
        }));
    }
    let soak = Arc::new(Soak { slots, ..soak });
    let census = Census::new(&data, testkit::setup::uid_range(&data));
    daemons[0]
        .wait_pool(Duration::from_secs(30), "one warm", |p| p["warm"] == 1)
        .await;
    let baseline = census.count();

    // RSS of whichever daemon runs, once a second, tagged with the daemon's number.
    let pid = Arc::new(AtomicU64::new(daemons[0].process().pid() as u64));
    let samples: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let sampler = {
        let (pid, samples) = (pid.clone(), samples.clone());
        tokio::spawn(async move {
            let mut generation = 0;
            let mut last = 0;
            loop {
                let p = pid.load(Ordering::SeqCst);
                if p != last && last != 0 {
                    generation += 1;
                }
                last = p;
                if let Some(kib) = rss_kib(p as u32) {
                    samples.lock().unwrap().push((generation, kib));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };

    let started = Instant::now();
    let clients: Vec<_> = (0..CONCURRENCY)
        .map(|w| tokio::spawn(soak.clone().client(w)))
        .collect();
    if restart {
        while soak.completed.load(Ordering::SeqCst) < total / 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        soak.killed_at.store(soak.now_ms(), Ordering::SeqCst);
        daemons[0]
            .process()
            .signal(nix::sys::signal::Signal::SIGKILL);
        daemons[0].process().wait_exit(Duration::from_secs(10));
        let again = DaemonProcess::start(&sandboxd, tmp.path(), &config).await;
        soak.serving_at.store(soak.now_ms(), Ordering::SeqCst);
        daemons.push(again);
        let last = daemons.last_mut().unwrap();
        pid.store(last.process().pid() as u64, Ordering::SeqCst);
    }
    for c in clients {
        c.await.unwrap();
    }
    let elapsed = started.elapsed();
    sampler.abort();

    // Hung-up execs' `sleep 5` must be killed, not left running.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut after = census.count();
    while after.processes != baseline.processes && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = census.count();
    }
    let leaked = after.processes.saturating_sub(baseline.processes);

    let s = &soak;
    let completed = s.completed.load(Ordering::SeqCst);
    let own = s.own_marker.load(Ordering::SeqCst);
    let outside = s.server_errors_outside.load(Ordering::SeqCst);
    let other = s.other.load(Ordering::SeqCst) + s.wrong.load(Ordering::SeqCst);
    println!(
        "soak: {total} execs at concurrency {CONCURRENCY} over {SANDBOXES} sandboxes in {:.1} s \
         ({:.0} execs/s){}",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        if restart {
            ", one kill -9 + restart"
        } else {
            ", no restart"
        }
    );
    println!("soak: completed replies: {completed}, carrying their own marker: {own}");
    println!(
        "soak: clients that hung up: {}",
        s.hung_up.load(Ordering::SeqCst)
    );
    if restart {
        let (k, r) = (
            s.killed_at.load(Ordering::SeqCst),
            s.serving_at.load(Ordering::SeqCst),
        );
        println!(
            "soak: restart window: {} ms (kill -9 to serving again)",
            r - k
        );
        println!(
            "soak: answers lost to the restart and retried: {} (5xx inside the window: {})",
            s.retried.load(Ordering::SeqCst),
            s.server_errors_inside.load(Ordering::SeqCst)
        );
        println!(
            "soak: sandboxes lost at restart: {}",
            s.lost.load(Ordering::SeqCst)
        );
    }
    println!("soak: 5xx outside the restart window: {outside}");
    println!("soak: other failures (wrong output, 4xx, errors outside the window): {other}");
    println!(
        "soak: leaked processes afterwards: {leaked} (baseline {} with 8 claimed + 1 warm, after {})",
        baseline.processes, after.processes
    );
    let samples = samples.lock().unwrap().clone();
    for generation in 0..=samples.last().map_or(0, |s| s.0) {
        let kib: Vec<u64> = samples
            .iter()
            .filter(|s| s.0 == generation)
            .map(|s| s.1)
            .collect();
        // First vs last minute, or quarter when the daemon ran under four minutes.
        let window = (kib.len() / 4).clamp(1, 60);
        let (first, last) = (
            mean(&kib[..window.min(kib.len())]),
            mean(&kib[kib.len().saturating_sub(window)..]),
        );
        println!(
            "soak: sandboxd #{} RSS: first {window} s {:.1} MiB, last {window} s {:.1} MiB (ratio {:.2})",
            generation + 1,
            first / 1024.0,
            last / 1024.0,
            last / first.max(1.0)
        );
    }
    drop(daemons);
    let ok = completed == own
        && own + s.hung_up.load(Ordering::SeqCst) == total
        && outside == 0
        && other == 0
        && leaked == 0;
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("bench_soak: FAILED (see the counts above)");
        std::process::ExitCode::FAILURE
    }
}
