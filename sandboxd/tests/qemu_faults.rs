//! Faults inside real VMs (qemu engine, TCG), on one sandbox while a bystander sandbox
//! must stay untouched: a command exhausting guest memory, a fork bomb, and silkd's
//! death (silkd is the guest's PID 1, which no process can kill; its death is a kernel
//! panic, which `panic=-1` + `-no-reboot` turn into QEMU's exit: forced here with
//! sysrq `c`). QEMUs and run directories are counted before and after. A QEMU killed
//! from the host is `qemu.rs`'s `killed_qemu_fails_its_sandbox_and_the_pool_refills`.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::procs::procs_with;
use testkit::{wait_until, Daemon, ROOT};

/// Cold-booted guests of `base`, no pool: the only guests are the test's own.
fn config(data: &Path, mem_dir: &Path) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
# A stopped test daemon leaves nothing behind (the default keeps claimed VMs).
on_stop = "destroy"
boot_timeout_seconds = 60
default_ttl_seconds = 900
max_ttl_seconds = 900

[qemu]
accel = "tcg"
memory_dir = "{mem}"

[templates.base]
image = "{image}"

[sizes.small]
cpus = 1
memory_mib = 256
"#,
        data = data.display(),
        mem = mem_dir.display(),
        image = testkit::vm::guest_image().display(),
    )
}

async fn exec(d: &Daemon, id: &str, token: &str, body: Value) -> (u16, Value) {
    let r = d.exec(id, token, body).await;
    let status = r.status.as_u16();
    (status, r.json())
}

async fn echo(d: &Daemon, id: &str, token: &str, text: &str) {
    let (status, v) = exec(d, id, token, json!({"argv": ["echo", text]})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"], format!("{text}\n"));
}

fn run_dirs(data: &Path) -> usize {
    std::fs::read_dir(data.join("qemu/run"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_exhaustion_fork_bomb_and_silkd_death_stay_inside_their_vm() {
    testkit::vm::require();
    let tmp = tempfile::tempdir().unwrap();
    let (data, mem_dir) = (tmp.path().join("data"), tmp.path().join("shm"));
    std::fs::create_dir_all(&mem_dir).unwrap();
    let marker = data.to_string_lossy().into_owned();
    assert_eq!(procs_with(&marker).len(), 0);
    let d = Daemon::start_text(&data, &config(&data, &mem_dir)).await;
    let (id, token) = d.claim().await;
    let (other, other_token) = d.claim().await;
    echo(&d, &other, &other_token, "bystander").await;
    assert_eq!((procs_with(&marker).len(), run_dirs(&data)), (2, 2));

    // Memory: a string doubling without end in a 256 MiB guest. The guest's OOM killer
    // ends the command (SIGKILL); silkd (PID 1, never OOM-killed) answers.
    let (status, v) = exec(
        &d,
        &id,
        &token,
        json!({"argv": ["awk", "BEGIN { s = \"x\"; while (1) s = s s }"], "timeout_seconds": 120}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["exit_code"].clone(), v["signal"].clone()),
        (Value::Null, json!(9)),
        "{v}"
    );
    echo(&d, &id, &token, "after the OOM").await;
    echo(&d, &other, &other_token, "bystander after the OOM").await;

    // A fork bomb, bounded by the exec's timeout: 504, every process of it killed, and
    // the guest serves again.
    let (status, v) = exec(
        &d,
        &id,
        &token,
        json!({"argv": ["sh", "-c", "b() { b | b & }; b; sleep 100"], "timeout_seconds": 5}),
    )
    .await;
    assert_eq!(status, 504, "{v}");
    // The killed bomb's processes take the guest a moment to reap: until then a spawn is
    // refused for want of pids (503, "guest out of resources"), never anything else.
    wait_until(
        Duration::from_secs(30),
        "the guest serving after the fork bomb",
        async || match exec(&d, &id, &token, json!({"argv": ["sh", "-c", "ps | wc -l"]})).await {
            (200, _) => Ok(()),
            (503, v)
                if v["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("out of resources")) =>
            {
                Err(v)
            }
            (status, v) => panic!("after the fork bomb: {status} {v}"),
        },
    )
    .await;
    echo(&d, &other, &other_token, "bystander after the fork bomb").await;

    // silkd's death: the guest kernel panics, QEMU exits, the sandbox is failed (502)
    // and listed so; the bystander serves on.
    let r = d
        .exec(
            &id,
            &token,
            json!({"argv": ["sh", "-c", "echo c > /proc/sysrq-trigger"]}),
        )
        .await;
    assert_eq!(r.status, 502, "{}", r.text());
    let msg = wait_until(
        Duration::from_secs(20),
        "exec answering failed",
        async || {
            let r = d.exec(&id, ROOT, json!({"argv": ["true"]})).await;
            let text = r.text();
            if r.status == 502 && text.contains("has failed") {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
    .await;
    assert!(msg.contains("QEMU exited"), "{msg}");
    let row = d
        .call("GET", &format!("/v1/sandboxes/{id}"), Some(ROOT), None)
        .await
        .json();
    assert_eq!(row["state"], "failed", "{row}");
    echo(&d, &other, &other_token, "bystander after silkd died").await;
    assert_eq!(
        procs_with(&marker).len(),
        1,
        "only the bystander's QEMU runs"
    );

    d.stop().await;
    assert_eq!((procs_with(&marker).len(), run_dirs(&data)), (0, 0));
}
