//! Buffered exec against a real sandboxd, real silkd and real bubblewrap: exact bytes,
//! encodings, every status `docs/api.md` lists for the route, and that no give-up leaves a process.

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::json;
use testkit::procs::{self, assert_gone, marker, procs_with, wait_running};
use testkit::{wait_until, Daemon, Setup, ROOT};
use tokio::io::AsyncWriteExt;

fn b64(v: &serde_json::Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("a base64 string"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_bytes_encodings_and_spill() {
    // A 4 KiB node budget: most of the larger outputs below spill to the temp file.
    let d = Daemon::start(Setup {
        memory_budget_bytes: 4096,
        ..Setup::default()
    })
    .await;
    let (id, token) = d.claim().await;

    // Non-UTF-8 bytes come back byte-identical through stdout_b64.
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["head", "-c", "64", "/bin/busybox"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let busybox = testkit::vm::guest_image().join("rootfs/bin/busybox");
    let expected = &std::fs::read(busybox).unwrap()[..64];
    assert_eq!(b64(&v["stdout_b64"]), expected);
    assert!(v.get("stdout").is_none(), "{v}");
    assert_eq!(v["stderr"], "");
    assert_eq!(v["exit_code"], 0);

    // Valid UTF-8 is a plain string; stderr and exit code are kept apart.
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["sh", "-c", "printf 'h\u{e9}llo \"q\"\\n'; echo oops >&2; exit 7"],
                   "env": {"X": "1"}, "cwd": "/tmp"}),
        )
        .await;
    let v = r.json();
    assert_eq!(v["stdout"], "h\u{e9}llo \"q\"\n");
    assert_eq!(v["stderr"], "oops\n");
    assert_eq!(v["exit_code"], 7);

    // encoding: base64 forces the _b64 fields even for text.
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["echo", "text"], "encoding": "base64"}),
        )
        .await;
    let v = r.json();
    assert_eq!(b64(&v["stdout_b64"]), b"text\n");
    assert_eq!(b64(&v["stderr_b64"]), b"");
    assert!(v.get("stdout").is_none());

    // 60 000 bytes of every byte value: larger than the budget, so it spills; still exact.
    let script = "i=0; while [ $i -lt 235 ]; do cat /tmp/all; i=$((i+1)); done";
    let prep = "printf \"$(printf '\\\\%03o' $(seq 0 255))\" > /tmp/all";
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["sh", "-c", format!("{prep}; {script}")]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = b64(&r.json()["stdout_b64"]);
    let one: Vec<u8> = (0..=255u8).collect();
    assert_eq!(got.len(), 256 * 235);
    assert!(got.chunks(256).all(|c| c == one.as_slice()));

    // A signal ends the command: exit_code null, signal set.
    let r = d
        .exec(&id, &token, json!({"argv": ["sh", "-c", "kill -9 $$"]}))
        .await;
    let v = r.json();
    assert_eq!(v["exit_code"], serde_json::Value::Null, "{v}");
    assert_eq!(v["signal"], 9);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_answer_400_and_413() {
    let d = Daemon::start(Setup::default()).await;
    let (id, token) = d.claim().await;
    for body in [
        json!({"argv": []}),
        json!({"argv": ["true"], "timeout_seconds": -1}),
        json!({"argv": ["true"], "timeout_seconds": 0}),
        json!({"argv": ["true"], "bogus": 1}),
        json!({"argv": ["true"], "encoding": "latin1"}),
        json!({"argv": ["/nonexistent/command"]}),
        json!({"argv": ["true"], "cwd": "/nonexistent-dir"}),
    ] {
        let r = d.exec(&id, &token, body.clone()).await;
        assert_eq!(r.status, 400, "{body} → {}", r.text());
        assert!(r.json()["error"].is_string());
    }
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&token),
            Some("not json"),
        )
        .await;
    assert_eq!(r.status, 400);
    // Request bodies are capped at 1 MiB.
    let huge = json!({"argv": ["echo", "x".repeat(1024 * 1024)]}).to_string();
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&token),
            Some(&huge),
        )
        .await;
    assert_eq!(r.status, 413, "{}", r.text());
    d.stop().await;
}

/// What the guest's kernel would refuse (NUL bytes, one argument over 128 KiB, a NUL in
/// cwd) is silkd's `bad_request`, so a 400 naming the fault, never a 500 or 502; and the
/// sandbox still runs commands afterwards. (argv + env over ARG_MAX, 2 MiB, cannot pass
/// the 1 MiB body cap; `silkd/tests/limits.rs` covers it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strings_the_kernel_refuses_answer_400() {
    let d = Daemon::start(Setup::default()).await;
    let (id, token) = d.claim().await;
    let long = "x".repeat(128 * 1024);
    for (body, needle) in [
        (json!({"argv": ["echo", "a\0b"]}), "NUL"),
        (json!({"argv": ["true"], "env": {"K": "v\0"}}), "NUL"),
        (json!({"argv": ["true"], "cwd": "/tmp\0x"}), "NUL"),
        (json!({"argv": ["echo", long]}), "per string"),
    ] {
        let r = d.exec(&id, &token, body).await;
        assert_eq!(r.status, 400, "{needle}: {}", r.text());
        let error = r.json()["error"].as_str().unwrap().to_string();
        assert!(error.contains(needle), "{error}");
    }
    let r = d.exec(&id, &token, json!({"argv": ["true"]})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_cap_is_exact_and_kills() {
    let cap = 64 * 1024;
    let d = Daemon::start(Setup {
        max_output_bytes: cap,
        ..Setup::default()
    })
    .await;
    let (id, token) = d.claim().await;
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["head", "-c", cap.to_string(), "/dev/zero"], "encoding": "base64"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(b64(&r.json()["stdout_b64"]).len() as u64, cap);

    // One byte more (split across stdout and stderr, which count together) → 413, and the
    // command that would have slept on is gone.
    let m = marker(1);
    let script = format!(
        "head -c {} /dev/zero; head -c 1 /dev/zero >&2; sleep {m}",
        cap
    );
    let r = d
        .exec(&id, &token, json!({"argv": ["sh", "-c", script]}))
        .await;
    assert_eq!(r.status, 413, "{}", r.text());
    // The answer keeps the first `cap` bytes (all of stdout), marked truncated.
    let v = r.json();
    assert_eq!(v["truncated"], true, "{v}");
    assert_eq!(v["signal"], 9, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("max_output_bytes"),
        "{v}"
    );
    assert_eq!(v["stdout"].as_str().unwrap().len() as u64, cap);
    assert_eq!(v["stderr"], "");
    assert_gone(&m).await;

    // Escaping does not count: 60 KiB of 0x01 is 360 KiB of JSON and still fits.
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["sh", "-c", "head -c 61440 /dev/zero | tr '\\0' '\\1'"]}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["stdout"].as_str().unwrap().len(), 61440);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_answers_504_and_kills() {
    let d = Daemon::start(Setup::default()).await;
    let (id, token) = d.claim().await;
    let m = marker(2);
    let started = Instant::now();
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["sh", "-c", format!("echo before; printf '\\377' >&2; sleep {m} & sleep {m}")], "timeout_seconds": 1}),
        )
        .await;
    assert_eq!(r.status, 504, "{}", r.text());
    // What it wrote before the timeout comes back, exact bytes included.
    let v = r.json();
    assert_eq!(v["timed_out"], true, "{v}");
    assert_eq!(v["stdout"], "before\n", "{v}");
    assert_eq!(v["stderr_b64"], "/w==", "{v}");
    assert!(v["error"].as_str().unwrap().contains("timed out"), "{v}");
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_gone(&m).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hanging_up_leaves_no_process() {
    let d = Daemon::start(Setup::default()).await;
    let (id, token) = d.claim().await;
    let m = marker(3);
    let body = json!({"argv": ["sleep", m]}).to_string();
    let mut stream = tokio::net::TcpStream::connect(d.addr()).await.unwrap();
    let req = format!(
        "POST /v1/sandboxes/{id}/exec HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    wait_running(&m).await;
    drop(stream);
    assert_gone(&m).await;
    // The sandbox itself is fine afterwards.
    let r = d.exec(&id, &token, json!({"argv": ["true"]})).await;
    assert_eq!(r.status, 200);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_limit_answers_503_with_retry_after() {
    let d = Daemon::start(Setup {
        max_in_flight: 1,
        ..Setup::default()
    })
    .await;
    let (id, token) = d.claim().await;
    let m = marker(4);
    let addr = d.addr();
    let (id2, token2) = (id.clone(), token.clone());
    let slow = tokio::spawn(async move {
        let body = json!({"argv": ["sh", "-c", format!("sleep 1.5; : {m}")]}).to_string();
        testkit::call(
            addr,
            "POST",
            &format!("/v1/sandboxes/{id2}/exec"),
            Some(&token2),
            Some(&body),
        )
        .await
    });
    wait_running(&marker(4)).await;
    let r = d.exec(&id, &token, json!({"argv": ["true"]})).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(slow.await.unwrap().status, 200);
    let r = d.exec(&id, &token, json!({"argv": ["true"]})).await;
    assert_eq!(r.status, 200);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_guest_answers_502() {
    let d = Daemon::start(Setup::default()).await;
    let (id, token) = d.claim().await;
    // Kill silkd from inside: the exec's own connection breaks mid-command.
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["sh", "-c", "kill -9 $PPID; sleep 5"]}),
        )
        .await;
    assert_eq!(r.status, 502, "{}", r.text());
    let r = d.exec(&id, &token, json!({"argv": ["true"]})).await;
    assert_eq!(r.status, 502, "{}", r.text());
    let r = d
        .call("GET", &format!("/v1/sandboxes/{id}"), Some(ROOT), None)
        .await;
    assert_eq!(r.json()["state"], "failed", "{}", r.text());
    let r = d
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/release"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    d.stop().await;
}

/// The cgroup path of `pid` for a v1 controller, from /proc/PID/cgroup.
fn cgroup_of(pid: u32, controller: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctls, path) = (parts.next()?, parts.next()?, parts.next()?);
        ctls.split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroup_limits_apply_or_are_reported() {
    // Where the host has cgroup v1 controllers (this machine), a sandbox's processes sit
    // in a group carrying the size's limits.
    if std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists() {
        let d = Daemon::start(Setup::default()).await;
        let (id, token) = d.claim().await;
        let m = marker(5);
        let addr = d.addr();
        let body = json!({"argv": ["sleep", m.clone()], "timeout_seconds": 5}).to_string();
        let path = format!("/v1/sandboxes/{id}/exec");
        let running = tokio::spawn(async move {
            testkit::call(addr, "POST", &path, Some(&token), Some(&body)).await
        });
        wait_running(&m).await;
        let pid = procs_with(&m)[0];
        let read = |ctl: &str, file: &str| {
            let group = cgroup_of(pid, ctl).expect("in a cgroup");
            assert!(group.starts_with("/sandboxd/"), "{ctl} group {group}");
            std::fs::read_to_string(format!("/sys/fs/cgroup/{ctl}{group}/{file}"))
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(
            read("memory", "memory.limit_in_bytes"),
            (256u64 << 20).to_string()
        );
        assert_eq!(read("pids", "pids.max"), "256");
        assert_eq!(read("cpu", "cpu.cfs_quota_us"), "100000");
        let info = d.info().await;
        let warnings = info["engine"]["warnings"].to_string();
        assert!(!warnings.contains("no memory limit"), "{warnings}");
        d.call(
            "POST",
            &format!("/v1/sandboxes/{id}/release"),
            Some(ROOT),
            None,
        )
        .await;
        let _ = running.await;
        assert_gone(&m).await;
        d.stop().await;
    }
    // Without any hierarchy the node refuses to start, naming what is missing and the
    // opt-out; with the opt-out, sandboxes run and /v1/info says which limits are off.
    let empty = tempfile::tempdir().unwrap();
    let bare = Setup {
        cgroup_root: Some(empty.path().to_path_buf()),
        ..Setup::default()
    };
    let text = bare.toml(&empty.path().join("data"), "127.0.0.1:0");
    let config = sandboxd::Config::parse(&text).unwrap();
    let listener = sandboxd::Listener::bind(&config).await.unwrap();
    let err = sandboxd::run(listener, config, std::future::pending())
        .await
        .unwrap_err()
        .to_string();
    for needed in [
        "no memory limit",
        "no pids limit",
        "no cpu limit",
        "allow_missing_cgroups",
    ] {
        assert!(err.contains(needed), "{err}");
    }
    let d = Daemon::start(Setup {
        allow_missing_cgroups: true,
        ..bare
    })
    .await;
    let (id, token) = d.claim().await;
    assert_eq!(
        d.exec(&id, &token, json!({"argv": ["true"]})).await.status,
        200
    );
    let warnings = d.info().await["engine"]["warnings"].to_string();
    for ctl in ["cpu", "memory", "pids"] {
        assert!(warnings.contains(&format!("no {ctl} limit")), "{warnings}");
    }
    assert!(
        warnings.contains("allow_missing_cgroups is set"),
        "{warnings}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_sandbox_that_died_is_not_handed_out() {
    let d = Daemon::start(Setup::default()).await;
    d.wait_pool(Duration::from_secs(10), "1 warm", |p| p["warm"] == 1)
        .await;
    // Kill the idle sandbox's outer bwrap (the daemon's child); its supervisor then kills
    // the rest of it through its cgroup.
    let ours = procs_with(&d.dir.display().to_string());
    let outer: Vec<u32> = ours
        .iter()
        .copied()
        .filter(|&pid| procs::stat(pid).is_some_and(|s| s.ppid == std::process::id()))
        .collect();
    assert_eq!(outer.len(), 1, "one idle sandbox: {outer:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(outer[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_until(
        Duration::from_secs(5),
        "the idle sandbox dead",
        async || testkit::wait::empty(ours.iter().copied().filter(|&p| procs::alive(p)).collect()),
    )
    .await;
    let (id, token) = d.claim().await;
    let r = d.exec(&id, &token, json!({"argv": ["true"]})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    d.stop().await;
}
