//! Terminals, detached commands and ports in a real VM (`engine = "qemu"` under TCG, the
//! `default` template, one daemon and one claimed guest for every check, silkd as the
//! guest's PID 1 over virtio-serial): a pty exec (`tty` is a /dev/pts/N, `stty size`
//! follows a resize, byte 0x03 interrupts `sleep`, the exit code comes back); the
//! detached counter outliving its client, listed, re-attached with retained then live
//! output, and killed; the template's `detach_ring_bytes` keeping the newest bytes; a
//! Python `http.server` started detached answering through `connect_port` and `sbx
//! port-forward`; a closed port refused with 502 before any 101.
//!
//! Needs `qemu-system-x86_64` and `target/images/default` (`cargo xtask image --template
//! default`, which `cargo xtask test` runs); it FAILS, naming what is missing, without
//! them.

use std::path::Path;
use std::time::Duration;

use sandbox_sdk::{ClaimOptions, Command, Error, ExitStatus, ProcState, Sandbox};
use testkit::detach::{
    counter_survives_is_listed_attached_and_killed, ring_keeps_the_newest_bytes,
};
use testkit::images::template_image;
use testkit::ports::{assert_hello, http_get, port_forward, serve_hello, HELLO_PORT};
use testkit::pty::read_process_until;
use testkit::relay::upgrade_to;
use testkit::sdk::assert_nothing_runs;
use testkit::{DaemonProcess, ROOT};

/// The template's detach ring: small, so the ring check fills it quickly under TCG, and
/// still far more than the counter prints before it is attached.
const RING: usize = 4096;

/// Bound on the whole test body (TCG guests are slow; the golden is built first).
const BOUND: Duration = Duration::from_secs(240);

fn config(data: &Path, mem_dir: &Path, image: &Path) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
on_stop = "destroy"
boot_timeout_seconds = 90
warmup_timeout_seconds = 90

[qemu]
accel = "tcg"
memory_dir = "{mem}"

[templates.default]
image = "{image}"
detach_ring_bytes = {RING}

[sizes.small]
cpus = 1
memory_mib = 384
disk_mib = 64

[[pools]]
template = "default"
size = "small"
warm = 0
warm_max = 1
# Python's modules in the golden's page cache: the server starts fast in the clone.
warmup = ["python3", "-c", "import http.server"]
"#,
        data = data.display(),
        mem = mem_dir.display(),
        image = image.display(),
    )
}

/// A shell under a 24x80 pty: a controlling terminal, the size, a resize, the exit code;
/// then Ctrl-C as a byte interrupting `sleep`.
async fn pty_checks(sandbox: &Sandbox) {
    let mut shell = sandbox
        .spawn(&Command::new("sh").pty(24, 80))
        .await
        .unwrap();
    let mut keys = shell.stdin().expect("a pty command always has stdin");
    // Markers are computed by the shell, so the terminal's echo cannot satisfy a wait.
    keys.send(b"tty; stty size; echo m$((0+1))\n")
        .await
        .unwrap();
    let screen = read_process_until(&mut shell, "m1\r\n").await;
    assert!(screen.contains("/dev/pts/"), "{screen:?}");
    assert!(screen.contains("24 80\r\n"), "{screen:?}");
    shell.resize(50, 120).await.unwrap();
    keys.send(b"stty size; echo m$((0+2))\n").await.unwrap();
    let screen = read_process_until(&mut shell, "m2\r\n").await;
    assert!(screen.contains("50 120\r\n"), "{screen:?}");
    keys.send(b"exit 42\n").await.unwrap();
    assert_eq!(shell.wait().await.unwrap(), ExitStatus::Code(42));

    let mut sleeper = sandbox
        .spawn(&Command::new("sleep").arg("600").pty(24, 80))
        .await
        .unwrap();
    sleeper.stdin().unwrap().send(&[0x03]).await.unwrap();
    assert_eq!(
        sleeper.wait().await.unwrap(),
        ExitStatus::Signal(libc::SIGINT)
    );
}

/// The detached server answers through `connect_port` (in `serve_hello`) and through
/// `sbx port-forward`; nothing listening is the guest's refusal, and 502 over HTTP.
async fn port_checks(d: &DaemonProcess, sandbox: &Sandbox) {
    let server = serve_hello(sandbox, Duration::from_secs(90)).await;
    let row = sandbox.processes().await.unwrap();
    let row = row.iter().find(|p| p.pid == server).expect("listed");
    assert!(row.detached && row.state == ProcState::Running, "{row:?}");

    let dir = tempfile::tempdir().unwrap();
    let sbx = Path::new(env!("CARGO_BIN_EXE_sbx"));
    let (_fwd, local) =
        port_forward(sbx, &d.url(), ROOT, sandbox.id(), HELLO_PORT, dir.path()).await;
    let mut conn = tokio::net::TcpStream::connect(local).await.unwrap();
    assert_hello(&http_get(&mut conn, "/hello.txt").await);

    match sandbox.connect_port(8001).await {
        Err(Error::Guest(m)) => assert!(m.contains("127.0.0.1:8001"), "{m}"),
        other => panic!("connect to a closed port: {other:?}"),
    }
    let path = format!("/v1/sandboxes/{}/ports/8001", sandbox.id());
    let (status, ..) = upgrade_to(d.endpoint.addr(), &path, sandbox.token(), Some("tcp")).await;
    assert_eq!(status, 502, "refused before any 101");

    let mut attached = sandbox.attach(server).await.unwrap();
    attached.kill().await.unwrap();
    assert_eq!(attached.wait().await.unwrap(), ExitStatus::Signal(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminals_detached_commands_and_ports_in_a_vm() {
    testkit::vm::require();
    let image = template_image("default");
    let tmp = tempfile::tempdir().unwrap();
    let (data, mem_dir) = (tmp.path().join("data"), tmp.path().join("shm"));
    std::fs::create_dir(&mem_dir).unwrap();
    let text = config(&data, &mem_dir, &image);
    let d = DaemonProcess::start(testkit::bins::sandboxd(), tmp.path(), &text).await;
    tokio::time::timeout(BOUND, async {
        let root = d.root();
        let sandbox = root.claim(ClaimOptions::new()).await.unwrap();
        // The guest is a VM: the accelerator is settled by its boot.
        let info = root.info().await.unwrap();
        assert_eq!(
            (
                info.engine.name.as_str(),
                info.engine.accelerator.as_deref()
            ),
            ("qemu", Some("tcg"))
        );
        pty_checks(&sandbox).await;
        counter_survives_is_listed_attached_and_killed(&sandbox).await;
        ring_keeps_the_newest_bytes(&sandbox, RING, Duration::from_secs(60)).await;
        port_checks(&d, &sandbox).await;
        assert_nothing_runs(&sandbox).await;
        sandbox.release().await.unwrap();
        assert_eq!(root.list().await.unwrap().len(), 0, "released");
    })
    .await
    .expect("test body exceeded its time bound");
}
