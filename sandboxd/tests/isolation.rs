//! Attacks from inside process-engine sandboxes (real sandboxd, silkd and bwrap over the
//! guest image's busybox rootfs): each must fail, leave the node and the other sandboxes
//! working, and leave nothing behind (processes, sandbox dirs, sockets, cgroups counted
//! before and after).

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use testkit::leftovers::Census;
use testkit::procs::{self, marker, procs_with, wait_running};
use testkit::setup::{uid_range, UID_BLOCK};
use testkit::{wait_until, Api, Daemon, DaemonProcess, Setup, ROOT};

/// What one command in a sandbox gave back.
#[derive(Debug)]
struct Ran {
    status: u16,
    exit: Option<i64>,
    signal: Option<i64>,
    out: String,
}

async fn sh(api: &Api, (id, token): &(String, String), script: &str, timeout: u32) -> Ran {
    let body = json!({"argv": ["sh", "-c", script], "timeout_seconds": timeout});
    let r = api.exec(id, token, body).await;
    let v: Value = serde_json::from_str(&r.text()).unwrap_or(Value::Null);
    Ran {
        status: r.status.into(),
        exit: v["exit_code"].as_i64(),
        signal: v["signal"].as_i64(),
        // Scripts here fold stderr into stdout (2>&1) where they check it.
        out: v["stdout"].as_str().unwrap_or_default().to_string(),
    }
}

/// Runs `sleep MARKER` in a sandbox until released (a spawned exec), and returns the
/// sleep's host pid once it runs.
async fn park(api: &Api, sandbox: &(String, String), n: u32) -> u32 {
    let m = marker(n);
    let (api2, sandbox2, m2) = (api.clone(), sandbox.clone(), m.clone());
    tokio::spawn(async move { sh(&api2, &sandbox2, &format!("sleep {m2}"), 60).await });
    wait_running(&m).await;
    procs_with(&m)[0]
}

fn uid_of(pid: u32) -> u32 {
    procs::status_field(pid, "Uid:").expect("a live process") as u32
}

/// The v1 (or v2) cgroup directory of `pid` for `controller`.
fn cgroup_dir(pid: u32, controller: &str) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctls, path) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        if ctls.split(',').any(|c| c == controller) {
            return Path::new("/sys/fs/cgroup").join(ctls).join(&path[1..]);
        }
    }
    panic!("pid {pid} has no {controller} cgroup:\n{text}");
}

async fn release(api: &Api, id: &str) {
    let r = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/release"),
            Some(ROOT),
            None,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
}

async fn steady(api: &Api) {
    api.wait_pool(Duration::from_secs(20), "1 warm", |p| p["warm"] == 1)
        .await;
}

/// Reading the node's config (with every token), its data dir and another sandbox's
/// socket; signalling the daemon and another sandbox's process; and, as if a mount had
/// leaked, the other sandbox's files and processes under this sandbox's host uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_and_other_sandboxes_are_out_of_reach() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let setup = Setup::default();
    let text = setup.toml(&data, "127.0.0.1:0");
    let mut d = DaemonProcess::start(env!("CARGO_BIN_EXE_sandboxd"), tmp.path(), &text).await;
    let config = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "toml"))
        .unwrap();
    steady(&d).await;
    let census = Census::new(&data, uid_range(&data));
    let before = census.count();

    let a = d.claim().await;
    let b = d.claim().await;
    let b_pid = park(&d, &b, 1).await;
    let a_pid = park(&d, &a, 2).await;
    let (a_uid, b_uid) = (uid_of(a_pid), uid_of(b_pid));
    assert!(uid_range(&data).contains(&a_uid) && uid_range(&data).contains(&b_uid));
    // Root in each (busybox: no template user) is the first uid of its own block.
    assert!(
        a_uid.abs_diff(b_uid) >= UID_BLOCK,
        "blocks overlap: {a_uid} and {b_uid} ({UID_BLOCK} ids each)"
    );
    let r = sh(&d, &b, "echo secret-of-b > /tmp/secret", 10).await;
    assert_eq!(r.exit, Some(0), "{r:?}");
    let b_dir = std::fs::read_dir(data.join("sandboxes"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| std::fs::metadata(p.join("sock")).is_ok_and(|m| m.uid() == b_uid))
        .expect("b's sandbox dir");
    let b_sock = b_dir.join("sock/silkd.sock");
    assert!(b_sock.exists());
    let daemon_pid = d.process().pid();

    let script = format!(
        r#"
        cat {config} 2>&1; echo "config=$?"
        ls {data} 2>&1; echo "data=$?"
        ls {b_dir} 2>&1; echo "b_dir=$?"
        test -e {b_sock}; echo "b_sock=$?"
        files() {{ find / \( -path /proc -o -path /sys \) -prune -o -type f -print 2>/dev/null; }}
        echo "files=$(files | wc -l)"
        echo "token_found=$(files | xargs grep -sl {ROOT} | wc -l)"
        echo "sockets=$(find / -type s 2>/dev/null | grep -v ^/proc)"
        echo "unix_paths=$(awk 'NR>1 && $8 != "" {{print $8}}' /proc/net/unix | sort -u | tr '\n' ' ')"
        kill -9 {b_pid} 2>&1; echo "kill_b=$?"
        kill -9 {daemon_pid} 2>&1; echo "kill_daemon=$?"
        "#,
        config = config.display(),
        data = data.display(),
        b_dir = b_dir.display(),
        b_sock = b_sock.display(),
    );
    let r = sh(&d, &a, &script, 30).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        !r.out.contains("files=0"),
        "the token search saw files: {r:?}"
    );
    for expected in [
        "config=1",
        "data=1",
        "b_dir=1",
        "b_sock=1",
        "token_found=0",
        "sockets=/run/silkd/silkd.sock\n",
        "unix_paths=/run/silkd/silkd.sock \n",
        "kill_b=1",
        "kill_daemon=1",
        "No such file or directory",
        "No such process",
    ] {
        assert!(
            r.out.contains(expected),
            "missing {expected:?} in:\n{}",
            r.out
        );
    }
    assert!(procs::alive(b_pid) && procs::alive(daemon_pid));

    // As if a mount had leaked B's paths into A: A's host uid still can neither signal
    // B's process nor read B's files or socket directory. Root can (the paths are right).
    // (std's `uid()` also drops the supplementary groups when run as root.)
    // Any id of A's block: its root (the first) and its last.
    let as_a_id = |id: u32, prog: &str, arg: &str| {
        let out = std::process::Command::new(prog)
            .arg(arg)
            .uid(id)
            .gid(id)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let as_a = |prog: &str, arg: &str| as_a_id(a_uid, prog, arg);
    let b_secret = format!("/proc/{b_pid}/root/tmp/secret");
    assert_eq!(std::fs::read_to_string(&b_secret).unwrap(), "secret-of-b\n");
    for id in [a_uid, a_uid + UID_BLOCK - 1] {
        let (ok, err) = as_a_id(id, "cat", &b_secret);
        assert!(!ok && err.contains("Permission denied"), "{id}: {err}");
    }
    let (ok, err) = as_a("ls", &b_dir.join("sock").display().to_string());
    assert!(!ok && err.contains("Permission denied"), "{err}");
    let out = std::process::Command::new("kill")
        .args(["-0", &b_pid.to_string()])
        .uid(a_uid)
        .gid(a_uid)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Operation not permitted"),
        "{err}"
    );
    assert!(procs::alive(b_pid));

    // B is unaffected.
    let r = sh(&d, &b, "cat /tmp/secret", 10).await;
    assert_eq!(r.out, "secret-of-b\n", "{r:?}");
    release(&d, &a.0).await;
    release(&d, &b.0).await;
    census.wait_back_to(&before).await;
}

/// A fork bomb stops at the size's pids limit; meanwhile the node and another sandbox
/// answer; the timeout kills it and the release leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_hits_the_pids_limit() {
    let d = Daemon::start(Setup::default()).await;
    steady(&d).await;
    let census = Census::new(&d.dir, uid_range(&d.dir));
    let before = census.count();
    let a = d.claim().await;
    let b = d.claim().await;
    let a_pid = park(&d, &a, 3).await;
    let pids = cgroup_dir(a_pid, "pids");

    let (api, sandbox) = ((*d).clone(), a.clone());
    let bomb = tokio::spawn(async move {
        sh(
            &api,
            &sandbox,
            "exec 2>/dev/null; b() { b | b & }; b; wait",
            4,
        )
        .await
    });
    let max_events = || {
        let text = std::fs::read_to_string(pids.join("pids.events")).unwrap_or_default();
        text.split_whitespace()
            .nth(1)
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    wait_until(
        Duration::from_secs(10),
        "forks refused at pids.max",
        async || max_events() > 0,
    )
    .await;
    let current: u64 = std::fs::read_to_string(pids.join("pids.current"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(current <= 256, "pids.current {current}");
    // While it rages: another sandbox and the node answer.
    let r = sh(&d, &b, "echo fine", 10).await;
    assert_eq!((r.status, r.out.as_str()), (200, "fine\n"), "{r:?}");
    assert_eq!(
        d.call("GET", "/v1/info", Some(ROOT), None).await.status,
        200
    );
    // The bomb collapses on its own once forks fail (200), or its timeout kills it (504).
    let r = bomb.await.unwrap();
    assert!(matches!(r.status, 200 | 504), "{r:?}");
    release(&d, &a.0).await;
    release(&d, &b.0).await;
    census.wait_back_to(&before).await;
    d.stop().await;
}

/// Allocating past the size's memory limit kills the allocating process only; the
/// sandbox's silkd and the other sandbox keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocating_past_the_memory_limit_is_killed() {
    let d = Daemon::start(Setup::default()).await;
    steady(&d).await;
    let census = Census::new(&d.dir, uid_range(&d.dir));
    let before = census.count();
    let a = d.claim().await;
    let b = d.claim().await;
    let a_pid = park(&d, &a, 4).await;
    let memory = cgroup_dir(a_pid, "memory");
    // busybox dd allocates its whole block: 400 MiB against a 256 MiB limit.
    let r = sh(&d, &a, "dd if=/dev/zero of=/dev/null bs=400M count=1", 30).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.signal == Some(9) || r.exit.is_some_and(|c| c != 0),
        "{r:?}"
    );
    let oom = std::fs::read_to_string(memory.join("memory.oom_control")).unwrap();
    assert!(!oom.contains("oom_kill 0"), "{oom}");
    let peak: u64 = std::fs::read_to_string(memory.join("memory.max_usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(peak <= 256 << 20, "peak {peak}");
    for sandbox in [&a, &b] {
        let r = sh(&d, sandbox, "echo alive", 10).await;
        assert_eq!(r.out, "alive\n", "{r:?}");
    }
    release(&d, &a.0).await;
    release(&d, &b.0).await;
    census.wait_back_to(&before).await;
    d.stop().await;
}

/// Filling the writable layer and every tmpfs gives the sandbox ENOSPC at `disk_mib`
/// (64 MiB here) and the host's disk nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filling_the_disk_and_tmp_gives_enospc() {
    let d = Daemon::start(Setup::default()).await;
    steady(&d).await;
    let census = Census::new(&d.dir, uid_range(&d.dir));
    let before = census.count();
    let host_bytes = || -> u64 {
        fn walk(p: &Path) -> u64 {
            std::fs::read_dir(p).map_or(0, |d| {
                d.flatten()
                    .map(|e| match e.metadata() {
                        Ok(m) if m.is_dir() => walk(&e.path()),
                        Ok(m) => m.len(),
                        Err(_) => 0,
                    })
                    .sum()
            })
        }
        walk(&d.dir)
    };
    let host_before = host_bytes();
    let a = d.claim().await;
    let b = d.claim().await;
    // One at a time: tmpfs pages also count against memory_mib (256 MiB here), and four
    // full ones at once would be the memory limit's case, not this one.
    for dir in ["/home/sandbox", "/tmp", "/run", "/dev/shm"] {
        let script = format!(
            "dd if=/dev/zero of={dir}/fill bs=1M count=100 2>&1; echo rc=$?; \
             echo size=$(($(wc -c < {dir}/fill) / 1048576)); rm {dir}/fill"
        );
        let r = sh(&d, &a, &script, 30).await;
        assert!(r.out.contains("No space left on device"), "{dir}: {r:?}");
        assert!(r.out.contains("rc=1"), "{dir}: {r:?}");
        assert!(
            r.out.contains("size=6"),
            "{dir} filled to about 64 MiB: {r:?}"
        );
    }
    // The root and /dev are read-only.
    let r = sh(&d, &a, "touch /fill 2>&1; touch /dev/fill 2>&1", 10).await;
    assert_eq!(r.out.matches("Read-only file system").count(), 2, "{r:?}");
    assert!(
        host_bytes() < host_before + (1 << 20),
        "the host's disk took the writes"
    );
    let r = sh(&d, &b, "echo fine > /tmp/x && cat /tmp/x", 10).await;
    assert_eq!(r.out, "fine\n", "{r:?}");
    release(&d, &a.0).await;
    release(&d, &b.0).await;
    census.wait_back_to(&before).await;
    d.stop().await;
}

/// Inside: root of its own user namespace (the first uid of its block) with only the
/// capabilities root's work on its own files needs (never CAP_SYS_ADMIN), no_new_privs,
/// the seccomp filter loaded, new user namespaces and mounts denied with EPERM. The
/// measuring opt-out turns the filter off, and the second layer (the namespace's
/// max_user_namespaces of 0) still refuses new user namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_and_the_user_namespace_hold() {
    let script = "id -u; grep -E '^(Seccomp|NoNewPrivs|CapEff|CapBnd):' /proc/self/status; \
                  unshare -U true 2>&1; echo unshare_user=$?; \
                  unshare -m true 2>&1; echo unshare_mount=$?; \
                  mount -t tmpfs none /tmp 2>&1; echo mount=$?";
    let d = Daemon::start(Setup::default()).await;
    let a = d.claim().await;
    let r = sh(&d, &a, script, 10).await;
    for expected in [
        "0\n",
        "Seccomp:\t2",
        "NoNewPrivs:\t1",
        // CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID (0-7),
        // NET_BIND_SERVICE (10): in the sandbox's user namespace only.
        "CapEff:\t00000000000004ff",
        "CapBnd:\t00000000000004ff",
        "unshare(0x10000000): Operation not permitted",
        "unshare_user=1",
        "unshare_mount=1",
        "mount=",
    ] {
        assert!(r.out.contains(expected), "missing {expected:?} in {r:?}");
    }
    assert!(!r.out.contains("mount=0"), "{r:?}");
    let pid = park(&d, &a, 5).await;
    assert!(uid_range(&d.dir).contains(&uid_of(pid)));
    // Those capabilities are in its own user namespace, which maps exactly its block:
    // never host root, nothing outside the block.
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/user")).unwrap();
    assert_ne!(ns(&pid.to_string()), ns("self"));
    for map in ["uid_map", "gid_map"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/{map}")).unwrap();
        let fields: Vec<&str> = text.split_whitespace().collect();
        let want = [
            "0".to_string(),
            uid_of(pid).to_string(),
            UID_BLOCK.to_string(),
        ];
        assert_eq!(fields, want, "{map}: {text}");
    }
    d.stop().await;

    let d = Daemon::start(Setup {
        process_extra: "unsafe_no_seccomp = true\n".into(),
        ..Setup::default()
    })
    .await;
    let warnings = d.info().await["engine"]["warnings"].to_string();
    assert!(warnings.contains("unsafe_no_seccomp is set"), "{warnings}");
    let a = d.claim().await;
    let r = sh(&d, &a, script, 10).await;
    assert!(r.out.contains("Seccomp:\t0"), "{r:?}");
    assert!(
        r.out
            .contains("unshare(0x10000000): No space left on device"),
        "{r:?}"
    );
    d.stop().await;
}

/// A give-up kill reaches what the command started even after it left its process group
/// (`setsid`): the sandbox's cgroup2 directory is delegated to it, and silkd runs each
/// command in a child cgroup of it and kills that cgroup. The delegated directory is the
/// sandbox's own: writing a pid of it above is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_reaches_setsid_escapees() {
    let d = Daemon::start(Setup::default()).await;
    steady(&d).await;
    let census = Census::new(&d.dir, uid_range(&d.dir));
    let before = census.count();
    let a = d.claim().await;
    let m = marker(6);
    let r = sh(&d, &a, &format!("setsid sleep {m} & sleep {m}"), 1).await;
    assert_eq!(r.status, 504, "{r:?}");
    // SIGKILL through cgroup.kill is synchronous for the kernel, the reaping is not.
    wait_until(Duration::from_secs(5), "no sleep left", async || {
        procs_with(&m).is_empty()
    })
    .await;
    // The cgroup is mounted at /sys/fs/cgroup; the host's cgroup tree above it is not
    // there to write to (cgroup namespace + bind of the sandbox's own directory).
    let r = sh(
        &d,
        &a,
        "ls /sys/fs/cgroup/cgroup.procs && echo $$ > /sys/fs/cgroup/../cgroup.procs; echo up=$?",
        5,
    )
    .await;
    assert!(r.out.contains("/sys/fs/cgroup/cgroup.procs"), "{r:?}");
    assert!(!r.out.contains("up=0"), "{r:?}");
    release(&d, &a.0).await;
    census.wait_back_to(&before).await;
    d.stop().await;
}

/// `rootfs = "/"` runs only with the loud opt-in, which `/v1/info` then reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_rootfs_needs_the_opt_in() {
    let host = Setup {
        rootfs: Some("/".into()),
        ..Setup::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let err = sandboxd::Config::parse(&host.toml(dir.path(), "127.0.0.1:0"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unsafe_host_rootfs"), "{err}");
    let d = Daemon::start(Setup {
        process_extra: "unsafe_host_rootfs = true\n".into(),
        ..host
    })
    .await;
    let warnings = d.info().await["engine"]["warnings"].to_string();
    assert!(warnings.contains("unsafe_host_rootfs is set"), "{warnings}");
    let a = d.claim().await;
    let r = sh(&d, &a, "test -x /usr/bin/bwrap && echo host-tree", 10).await;
    assert_eq!(r.out, "host-tree\n", "{r:?}");
    d.stop().await;
}
