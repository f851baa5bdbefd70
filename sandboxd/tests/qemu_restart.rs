//! The real `sandboxd` binary, `engine = "qemu"` under TCG, restarted on the same
//! `data_dir`: after a `kill -9` the next start re-adopts every recorded VM whose QEMU is
//! alive (same id and token; its file and background process; exec and relay through a
//! fresh channel session, no stale byte from a flood cut off by the kill), drops and logs
//! the one whose QEMU was killed meanwhile, destroys the QEMU whose record was deleted
//! and the one whose record was pointed at a bystander (never signalled); a SIGTERM with `on_stop = "keep"` keeps
//! the claimed VMs and destroys the warm one; `on_stop = "destroy"` leaves nothing.
//! Leftovers (QEMUs, run dirs, sockets, memory files, cgroups) are counted throughout.
//!
//! Two claimed VMs carry traces (the process engine's test uses three): every VM is a
//! TCG guest costing real CPU on a shared runner, and two already show that adoption
//! handles each record on its own. Needs QEMU and the guest image, like `qemu.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use testkit::procs::{self, procs_with};
use testkit::restart;
use testkit::vm_leftovers::{VmCensus, VmCount};
use testkit::{wait_until, ChildGuard, DaemonProcess, ROOT};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxd");

struct Node {
    tmp: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("shm")).unwrap();
        Node { tmp }
    }

    fn data(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    fn mem_dir(&self) -> PathBuf {
        self.tmp.path().join("shm")
    }

    fn config(&self, on_stop: &str) -> String {
        format!(
            r#"listen = "127.0.0.1:0"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
on_stop = "{on_stop}"
boot_timeout_seconds = 60

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
            data = self.data().display(),
            mem = self.mem_dir().display(),
            image = testkit::vm::require().display(),
        )
    }

    async fn start(&self, on_stop: &str) -> DaemonProcess {
        let d = DaemonProcess::start(BIN, self.tmp.path(), &self.config(on_stop)).await;
        d.wait_pool(Duration::from_secs(180), "1 warm VM", |p| p["warm"] == 1)
            .await;
        d
    }
}

/// The guest's file and every command line running in it.
const LIST: &str = "cat /tmp/kept; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done";

/// Writes a file and starts a detached `sleep` in the VM; returns the sleep's argument.
async fn leave_traces(d: &DaemonProcess, id: &str, token: &str, n: u32) -> String {
    let m = format!("{}.5{n}", 4000 + n);
    let script =
        format!("echo kept-{id} > /tmp/kept && (setsid sleep {m} </dev/null >/dev/null 2>&1 &)");
    let r = d
        .exec(id, token, json!({"argv": ["sh", "-c", script]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    m
}

/// The VM answers with its own id and token: exec sees its file and its process, and the
/// relay answers `Info`.
async fn still_there(d: &DaemonProcess, id: &str, token: &str, m: &str) {
    let r = d.exec(id, token, json!({"argv": ["sh", "-c", LIST]})).await;
    assert_eq!(r.status, 200, "{id}: {}", r.text());
    let stdout = r.json()["stdout"].as_str().unwrap().to_string();
    assert!(stdout.contains(&format!("kept-{id}")), "{id}: {stdout}");
    assert!(
        stdout.contains(&format!("sleep {m}")),
        "{id}: no `sleep {m}` in {stdout}"
    );
    assert!(
        restart::relay_info(d.addr(), id, token).await,
        "{id}: relay"
    );
}

/// The QEMU pid a claim's record names.
fn qemu_pid(data: &Path, id: &str) -> u32 {
    let pids = restart::guest_pids(data, id);
    assert_eq!(pids.len(), 1, "a VM's record names its QEMU only: {pids:?}");
    pids[0]
}

fn plus(c: VmCount, vms: usize) -> VmCount {
    VmCount {
        qemus: c.qemus + vms,
        run_dirs: c.run_dirs + vms,
        sockets: c.sockets + 2 * vms,
        cgroups: c.cgroups + vms,
        ..c
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_then_restart_readopts_vms_drops_the_dead_and_sweeps_the_unowned() {
    let node = Node::new();
    let data = node.data();
    let mut first = node.start("keep").await;
    let census = VmCensus::new(&data, &node.mem_dir());
    // One warm VM, its run dir with two sockets, its cgroup, the golden's memory file.
    let warm_only = census.count();
    assert_eq!(
        warm_only,
        VmCount {
            qemus: 1,
            run_dirs: 1,
            sockets: 2,
            memory_files: 1,
            cgroups: 1
        }
    );

    let mut kept = Vec::new();
    for n in 0..2 {
        let (id, token) = first.claim().await;
        let m = leave_traces(&first, &id, &token, n).await;
        kept.push((id, token, m));
    }
    let (died, died_token) = first.claim().await;
    let (orphan, _) = first.claim().await;
    let (tampered, tampered_token) = first.claim().await;
    let died_pid = qemu_pid(&data, &died);
    let orphan_pid = qemu_pid(&data, &orphan);
    let tampered_pid = qemu_pid(&data, &tampered);
    // Five claimed VMs and the warm one the pool refilled.
    census.wait_for(plus(warm_only, 5)).await;
    // A flood nobody reads is mid-stream in the first VM when the daemon dies: its stale
    // bytes wait in the channel for the next session, which must not see one of them.
    let flood = restart::exec_unread(
        first.addr(),
        &kept[0].0,
        &kept[0].1,
        &["sh", "-c", "exec cat /dev/zero # flood-marker"],
    )
    .await;

    assert!(!first.process().kill().success());
    drop(flood);
    // Every VM outlived the daemon (its own session and cgroup).
    assert_eq!(
        census.count(),
        plus(warm_only, 5),
        "a QEMU died with sandboxd"
    );
    // While sandboxd is down: one QEMU is killed, one record is lost.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(died_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the killed QEMU gone",
        async || !procs::alive(died_pid),
    )
    .await;
    restart::forget(&data, &orphan);
    let mut bystander = ChildGuard::spawn(
        "bystander",
        Command::new("sleep").arg("1000").stdin(Stdio::null()),
    );
    restart::point_at(&data, &tampered, bystander.pid());

    let mut second = node.start("keep").await;
    for (id, token, m) in &kept {
        still_there(&second, id, token, m).await;
    }
    // The flood ended with its session: silkd killed it when the old host hung up.
    let (id, token) = (&kept[0].0, &kept[0].1);
    wait_until(Duration::from_secs(10), "the flood killed", async || {
        let r = second
            .exec(id, token, json!({"argv": ["sh", "-c", LIST]}))
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let stdout = r.json()["stdout"].as_str().unwrap().to_string();
        if stdout.contains("cat /dev/zero") {
            Err(stdout)
        } else {
            Ok(())
        }
    })
    .await;
    for id in [&died, &orphan, &tampered] {
        let r = second
            .call("GET", &format!("/v1/sandboxes/{id}"), Some(ROOT), None)
            .await;
        assert_eq!(r.status, 404, "{id}: {}", r.text());
    }
    for (id, token) in [(&died, &died_token), (&tampered, &tampered_token)] {
        let r = second.exec(id, token, json!({"argv": ["true"]})).await;
        assert_eq!(
            r.status,
            401,
            "a dropped claim's token is unknown: {}",
            r.text()
        );
    }
    // The bystander was never signalled; the real QEMUs no record owns were destroyed.
    assert!(
        bystander.try_exit().is_none(),
        "the bystander was signalled"
    );
    assert!(!procs::signalled(bystander.pid()));
    wait_until(
        Duration::from_secs(10),
        "QEMUs no record owns dead",
        async || {
            testkit::wait::empty(
                [orphan_pid, tampered_pid]
                    .into_iter()
                    .filter(|&p| procs::alive(p))
                    .collect(),
            )
        },
    )
    .await;
    let log = second.log_text();
    for (id, why) in [
        (&died, "its QEMU is gone"),
        (&tampered, "is not in its cgroup"),
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("dropping claim: its sandbox is gone")
                    && l.contains(id.as_str())
                    && l.contains(why)),
            "{id}: {why}: {log}"
        );
    }
    let mut ids: Vec<String> = kept.iter().map(|k| k.0.clone()).collect();
    ids.sort();
    assert_eq!(restart::recorded_ids(&data), ids);
    // The two adopted VMs and a fresh warm one: the earlier warm VM, the orphan, the
    // tampered one and the dead one's run dir and cgroup are gone.
    census.wait_for(plus(warm_only, 2)).await;

    // SIGTERM with "keep": the claimed VMs keep running, the warm one is destroyed.
    let kept_pids: Vec<u32> = kept.iter().map(|k| qemu_pid(&data, &k.0)).collect();
    assert!(second
        .process()
        .terminate(Duration::from_secs(60))
        .success());
    for p in &kept_pids {
        assert!(procs::alive(*p), "QEMU {p} died with a keep stop");
    }
    assert_eq!(
        census.count(),
        plus(warm_only, 1),
        "the warm VM outlived the stop"
    );

    // "destroy": re-adopted again, a release frees its VM, the stop destroys the rest.
    let mut third = node.start("destroy").await;
    for (id, token, m) in &kept {
        still_there(&third, id, token, m).await;
    }
    let path = format!("/v1/sandboxes/{}/release", kept[0].0);
    let r = third.call("POST", &path, Some(ROOT), None).await;
    assert_eq!(r.status, 204, "{}", r.text());
    census.wait_for(plus(warm_only, 1)).await;
    assert!(third.process().terminate(Duration::from_secs(60)).success());
    let golden_only = VmCount {
        qemus: 0,
        run_dirs: 0,
        sockets: 0,
        memory_files: 1,
        cgroups: 0,
    };
    assert_eq!(census.count(), golden_only);
    assert!(restart::recorded_ids(&data).is_empty());
    assert_eq!(procs_with(&data.display().to_string()), Vec::<u32>::new());
    drop((first, second, third, bystander));
}
