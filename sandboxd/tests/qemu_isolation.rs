//! The qemu engine against hostile guests and hostile local users, with real QEMU and the
//! real guest image: each QEMU runs as its own non-root uid under seccomp in a limited
//! cgroup; every per-VM file and the golden files are private; a guest spamming its
//! console costs the host a bounded tail; a file planted where a golden belongs is never
//! mapped; a planted private directory stops the engine. Leftovers (QEMUs, run dirs,
//! cgroups) are counted before and after.
//!
//! Needs root (QEMUs under their own uids), `qemu-system-x86_64` and the guest image; it
//! FAILS, naming what is missing, without them. One daemon serves every VM check, to keep
//! TCG boots few.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use testkit::host::{cgroup_value, maps_inode, readable_as};
use testkit::procs::{procs_with, status_field};
use testkit::{wait_until, Daemon, ROOT};

/// `[qemu] uid_base` default: the readers group; QEMUs run as the ids above it.
const UID_BASE: u32 = 2_100_000_000;
/// An unprivileged local user.
const NOBODY: u32 = 65_534;
/// What the spamming guest writes to its console.
const SPAM_BYTES: u64 = 4_000_000;

fn config(data: &Path, mem_dir: &Path) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
# A stopped node leaves nothing (qemu_restart.rs covers "keep").
on_stop = "destroy"
boot_timeout_seconds = 60
warmup_timeout_seconds = 60

[qemu]
accel = "tcg"
memory_dir = "{mem}"

[templates.base]
image = "{image}"

[sizes.small]
cpus = 1
memory_mib = 256

[[pools]]
template = "base"
size = "small"
warm = 1
warm_max = 2
"#,
        data = data.display(),
        mem = mem_dir.display(),
        image = testkit::vm::guest_image().display(),
    )
}

fn require() {
    testkit::vm::require();
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests check QEMUs under their own uids: run them as root (.ci/run does)"
    );
}

/// The instance name the engine derives from a data dir (`sandboxd-` + 12 hex digits).
fn instance(data: &Path) -> String {
    hex::encode(&Sha256::digest(data.as_os_str().as_encoded_bytes())[..6])
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Counts of what a daemon's VMs leave on the host.
#[derive(Debug, PartialEq, Eq)]
struct Leftovers {
    qemus: usize,
    run_dirs: usize,
    cgroups: usize,
}

fn leftovers(data: &Path) -> Leftovers {
    let count = |p: PathBuf| std::fs::read_dir(p).map_or(0, |d| d.flatten().count());
    // A v1 group directory also holds control files: count only the groups in it.
    let groups = |c: &str| {
        std::fs::read_dir(format!("/sys/fs/cgroup/{c}/sandboxd/{}", instance(data)))
            .map_or(0, |d| d.flatten().filter(|e| e.path().is_dir()).count())
    };
    Leftovers {
        qemus: procs_with(&data.to_string_lossy()).len(),
        run_dirs: count(data.join("qemu/run")),
        cgroups: ["memory", "pids", "cpu"].iter().map(|c| groups(c)).sum(),
    }
}

fn none() -> Leftovers {
    Leftovers {
        qemus: 0,
        run_dirs: 0,
        cgroups: 0,
    }
}

async fn exec(d: &Daemon, id: &str, token: &str, argv: &[&str]) -> Value {
    let r = d
        .exec(id, token, json!({ "argv": argv, "timeout_seconds": 120 }))
        .await;
    assert_eq!(r.status, 200, "exec {argv:?}: {}", r.text());
    r.json()
}

/// The QEMU serving sandbox `id` (its hostname carries the run dir's name).
async fn qemu_of(d: &Daemon, id: &str, token: &str) -> u32 {
    let host = exec(d, id, token, &["hostname"]).await["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .to_string();
    let guest = host.strip_prefix("sbx-").expect("sbx- hostname");
    let pids = procs_with(&format!("qemu/run/{guest}"));
    assert_eq!(pids.len(), 1, "the sandbox's QEMU: {pids:?}");
    pids[0]
}

fn uid_of(pid: u32) -> u64 {
    status_field(pid, "Uid:").expect("QEMU's Uid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_and_local_users_reach_nothing() {
    require();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // memory_dir like /dev/shm: world-writable and sticky.
    let mem_dir = tmp.path().join("shm");
    std::fs::create_dir(&mem_dir).unwrap();
    std::fs::set_permissions(&mem_dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(leftovers(&data), none());

    let d = Daemon::start_text(&data, &config(&data, &mem_dir)).await;
    d.wait_pool(Duration::from_secs(180), "golden and 1 warm clone", |p| {
        p["golden"]["state"] == "ready" && p["warm"] == 1
    })
    .await;

    // 1. Every QEMU: its own non-root uid from the range, seccomp filter, no_new_privs,
    // a cgroup with guest RAM + margin and a task limit.
    let run_root = data.join("qemu/run");
    let qemus = procs_with(&run_root.to_string_lossy());
    assert_eq!(qemus.len(), 1, "one warm clone's QEMU: {qemus:?}");
    let warm = qemus[0];
    let uid = uid_of(warm);
    assert!(
        (u64::from(UID_BASE) + 1..u64::from(UID_BASE) + 65_536).contains(&uid),
        "QEMU runs as uid {uid}"
    );
    assert_eq!(
        status_field(warm, "Seccomp:"),
        Some(2),
        "QEMU has no seccomp filter"
    );
    assert_eq!(status_field(warm, "NoNewPrivs:"), Some(1));
    let status = std::fs::read_to_string(format!("/proc/{warm}/status")).unwrap();
    let groups = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
    assert_eq!(
        groups.split_whitespace().nth(1),
        Some(&*UID_BASE.to_string()),
        "{groups}"
    );
    let limit: u64 = cgroup_value(warm, "memory", "memory.limit_in_bytes")
        .or_else(|| cgroup_value(warm, "memory", "memory.max"))
        .expect("QEMU's memory cgroup")
        .parse()
        .unwrap();
    assert_eq!(
        limit,
        (256 + 128 + 64) << 20,
        "guest RAM + overhead + TCG cache"
    );
    assert_eq!(
        cgroup_value(warm, "pids", "pids.max").as_deref(),
        Some("128")
    );

    // 2. Private files. Run dirs: root's, 0700, holding only the two sockets (no console
    // or log file grows on disk).
    assert_eq!(mode(&data.join("qemu")), 0o700);
    assert_eq!(mode(&run_root), 0o700);
    for dir in std::fs::read_dir(&run_root).unwrap().flatten() {
        assert_eq!(mode(&dir.path()), 0o700, "{}", dir.path().display());
        assert_eq!(dir.metadata().unwrap().uid(), 0);
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["qmp.sock", "silkd.sock"]);
    }
    // Golden files: root's, group = readers, 0440; their directory root's 0700.
    let private = mem_dir.join(format!("sandboxd-{}", instance(&data)));
    assert_eq!(mode(&private), 0o700);
    let mems: Vec<PathBuf> = std::fs::read_dir(&private)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(mems.len(), 1, "{mems:?}");
    let state = data.join("goldens/base.small/state.mig");
    for f in [&mems[0], &state] {
        let m = std::fs::metadata(f).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o7777),
            (0, UID_BASE, 0o440),
            "{}",
            f.display()
        );
        // Neither a local user nor a QEMU uid (even with the readers group) can open it
        // by path: only the fd sandboxd hands a clone reaches it.
        assert!(
            !readable_as(NOBODY, NOBODY, &[], f),
            "nobody reads {}",
            f.display()
        );
        assert!(
            !readable_as(UID_BASE + 7, UID_BASE + 7, &[UID_BASE], f),
            "a QEMU uid reads {} by path",
            f.display()
        );
    }
    for dir in std::fs::read_dir(&run_root).unwrap().flatten() {
        let sock = dir.path().join("silkd.sock");
        assert!(!readable_as(uid as u32, uid as u32, &[], &sock));
    }

    // 3. A guest spams its console: the host keeps a bounded tail, on no disk, and the
    // node keeps answering meanwhile.
    let (spammer, spam_token) = d.claim().await;
    let spam_qemu = qemu_of(&d, &spammer, &spam_token).await;
    let rss_before = status_field(std::process::id(), "VmRSS:").unwrap();
    let spam = format!("yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | head -c {SPAM_BYTES} > /dev/ttyS0; echo spammed");
    let spam_task = {
        let (api, id, tok) = ((*d).clone(), spammer.clone(), spam_token.clone());
        tokio::spawn(async move {
            api.exec(
                &id,
                &tok,
                json!({ "argv": ["sh", "-c", spam], "timeout_seconds": 300 }),
            )
            .await
        })
    };
    // While it spams: the pool refills, another sandbox is claimed and runs a command.
    d.wait_pool(Duration::from_secs(180), "refill during the spam", |p| {
        p["warm"] == 1
    })
    .await;
    let (other, other_token) = d.claim().await;
    let out = exec(&d, &other, &other_token, &["echo", "alive"]).await;
    assert_eq!(out["stdout"], "alive\n");
    let spammed = spam_task.await.unwrap();
    assert_eq!(spammed.status, 200, "{}", spammed.text());
    assert_eq!(spammed.json()["stdout"], "spammed\n");
    let rss_after = status_field(std::process::id(), "VmRSS:").unwrap();
    let grown_kib = rss_after.saturating_sub(rss_before);
    eprintln!("console spam: {SPAM_BYTES} bytes, test process RSS grew {grown_kib} KiB");
    assert!(
        grown_kib * 1024 < SPAM_BYTES / 2,
        "sandboxd grew by {grown_kib} KiB while the guest wrote {SPAM_BYTES} bytes"
    );
    let on_disk: u64 = walk_sizes(&run_root);
    assert_eq!(on_disk, 0, "files grew under the run dirs");
    // The console's end shows in the failure of that sandbox, to root (a sandbox token
    // gets no host detail): its tail only.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(spam_qemu as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let msg = wait_until(Duration::from_secs(10), "exec answering 502", async || {
        let r = d.exec(&spammer, ROOT, json!({ "argv": ["true"] })).await;
        if r.status == 502 {
            Ok(r.json()["error"].as_str().unwrap().to_string())
        } else {
            Err(r.status)
        }
    })
    .await;
    let total: u64 = msg
        .split("console (")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no console count in {msg}"));
    assert!(total >= SPAM_BYTES, "host saw {total} console bytes: {msg}");
    assert!(msg.contains("xxxxxxxxxx"), "{msg}");
    assert!(
        msg.len() < 2_000,
        "the error carries the whole console: {} bytes",
        msg.len()
    );

    // 4. A golden memory file replaced by one another user made (as if planted at its
    // predictable name): never mapped; the pool boots cold instead.
    let planted = mems[0].clone();
    std::fs::remove_file(&planted).unwrap();
    std::fs::write(&planted, vec![0u8; 4096]).unwrap();
    std::os::unix::fs::chown(&planted, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o440)).unwrap();
    let planted_ino = std::fs::metadata(&planted).unwrap().ino();
    let (taken, taken_token) = d.claim().await;
    d.wait_pool(Duration::from_secs(180), "a refill after the plant", |p| {
        p["warm"] == 1
    })
    .await;
    let running = procs_with(&run_root.to_string_lossy());
    for &pid in &running {
        assert!(
            !maps_inode(pid, planted_ino),
            "QEMU {pid} maps the planted file"
        );
        assert!(uid_of(pid) != 0);
    }
    let cold = running.iter().filter(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        !String::from_utf8_lossy(&cmdline).contains("memory-backend-file")
    });
    assert_eq!(cold.count(), 1, "the refill after the plant boots cold");
    let out = exec(&d, &taken, &taken_token, &["echo", "ok"]).await;
    assert_eq!(out["stdout"], "ok\n");

    d.stop().await;
    assert_eq!(leftovers(&data), none(), "after shutdown");
}

/// Bytes in regular files under `dir`.
fn walk_sizes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let m = e.metadata().unwrap();
        if m.is_dir() {
            total += walk_sizes(&e.path());
        } else if m.is_file() {
            total += m.len();
        }
    }
    total
}

#[test]
fn a_private_directory_planted_by_another_user_stops_the_engine() {
    require();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = tmp.path().join("data");
    let shm = tmp.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o1777)).unwrap();
    // Another local user guesses the daemon's directory name and makes it first, with a
    // "golden" of theirs inside.
    let planted = shm.join(format!("sandboxd-{}", instance(&data)));
    std::fs::create_dir(&planted).unwrap();
    std::fs::write(planted.join("golden-0000000000000000.mem"), b"evil").unwrap();
    std::os::unix::fs::chown(&planted, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o700)).unwrap();
    let cfg = sandboxd::config::QemuConfig {
        accel: sandboxd::config::AccelChoice::Tcg,
        memory_dir: shm.clone(),
        ..Default::default()
    };
    let engine = sandboxd::engine::qemu::QemuEngine::new(
        &cfg,
        &data,
        Path::new("/sys/fs/cgroup"),
        Duration::from_secs(10),
        None,
    );
    let err = engine
        .err()
        .expect("the engine accepted a planted directory")
        .to_string();
    assert!(
        err.contains("refusing") && err.contains(&*planted.to_string_lossy()),
        "{err}"
    );
    // A memory_dir others may write to without the sticky bit is refused as well.
    std::fs::remove_dir_all(&planted).unwrap();
    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = sandboxd::engine::qemu::QemuEngine::new(
        &cfg,
        &data,
        Path::new("/sys/fs/cgroup"),
        Duration::from_secs(10),
        None,
    )
    .err()
    .expect("the engine accepted a non-sticky world-writable memory_dir")
    .to_string();
    assert!(err.contains("not sticky"), "{err}");
    assert_eq!(leftovers(&data), none());
}
