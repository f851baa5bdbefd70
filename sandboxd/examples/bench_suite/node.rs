//! The nodes the suites measure (the real sandboxd binary beside this example, process or
//! qemu engine, on TCP) and the floors measured on the host in the same run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_sdk::Client;
use testkit::{bins, DaemonProcess, Listen, Setup, ROOT};

use crate::stats::Samples;

pub type BoxError = Box<dyn std::error::Error>;

/// Which engine a suite's node runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Engine {
    Process,
    Qemu,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Process => "process",
            Engine::Qemu => "qemu",
        }
    }
}

/// A pool's shape and the node's limits for one suite.
pub struct Shape {
    pub warm: u32,
    pub max_claims: u32,
    pub max_in_flight: u32,
    pub max_output_bytes: u64,
}

/// A running node; stopped and swept when dropped.
pub struct Node {
    pub daemon: DaemonProcess,
    _tmp: tempfile::TempDir,
}

impl Node {
    pub async fn start(engine: Engine, shape: Shape) -> Result<Node, BoxError> {
        let tmp = tempfile::tempdir()?;
        let data = tmp.path().join("data");
        let listen = Listen::Tcp.address(tmp.path());
        let setup = Setup {
            warm: shape.warm,
            warm_max: shape.warm,
            max_claims: shape.max_claims,
            tenant_a_max_claims: 1,
            max_output_bytes: shape.max_output_bytes,
            // Room for every in-flight output at once, so no exec waits for the budget.
            memory_budget_bytes: 256 << 20,
            max_in_flight: shape.max_in_flight,
            default_ttl_seconds: 600,
            max_ttl_seconds: 600,
            ..Setup::default()
        };
        let text = match engine {
            // The test setup's 32 uid blocks cap a node at 32 sandboxes; tti needs more
            // than a hundred (256 blocks stay below the qemu engine's range).
            Engine::Process => {
                let text = setup.toml(&data, &listen).replace(
                    &format!("uid_count = {}\n", 32 * testkit::setup::UID_BLOCK),
                    &format!("uid_count = {}\n", 256 * testkit::setup::UID_BLOCK),
                );
                match static_silkd() {
                    Some(p) => text.replace(
                        &format!("silkd_path = {:?}", bins::silkd().display().to_string()),
                        &format!("silkd_path = {:?}", p.display().to_string()),
                    ),
                    None => text,
                }
            }
            Engine::Qemu => qemu_toml(&setup, &data, &listen, tmp.path()),
        };
        let daemon = DaemonProcess::start(bins::sandboxd(), tmp.path(), &text).await;
        Ok(Node { daemon, _tmp: tmp })
    }

    pub fn client(&self) -> Client {
        Client::new(&self.daemon.url())
            .expect("the daemon's URL")
            .with_token(ROOT)
    }

    /// Waits until the pool holds `n` warm guests (a golden build first, for qemu).
    pub async fn wait_warm(&self, n: u32) {
        let what = format!("{n} warm sandboxes");
        self.daemon
            .wait_pool(Duration::from_secs(600), &what, |p| {
                p["warm"].as_u64() >= Some(n as u64)
            })
            .await;
    }
}

/// The static silkd `cargo xtask image` builds (what a deployment runs, `cargo xtask
/// dist`), when there is one: a plain `cargo build`'s silkd is dynamic, and the process
/// engine then binds its loader and libraries into every sandbox and starts it through
/// the loader (8% of the machine's time in `bench tti`, `perf record -a`).
fn static_silkd() -> Option<std::path::PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/static/x86_64-unknown-linux-gnu/release/silkd");
    p.is_file().then_some(p)
}

/// The qemu engine's config: the process setup's limits and pool, VM sections instead.
fn qemu_toml(setup: &Setup, data: &Path, listen: &str, tmp: &Path) -> String {
    let shm = tmp.join("shm");
    let _ = std::fs::create_dir_all(&shm);
    format!(
        r#"listen = "{listen}"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
on_stop = "destroy"
max_claims = {max_claims}
default_ttl_seconds = 600
max_ttl_seconds = 600
boot_timeout_seconds = 120
warmup_timeout_seconds = 120

[qemu]
accel = "tcg"
memory_dir = "{shm}"

[templates.base]
image = "{image}"

[sizes.small]
cpus = 1
memory_mib = 256

[[pools]]
template = "base"
size = "small"
warm = {warm}
warm_max = {warm_max}

[exec]
max_output_bytes = {max_out}
memory_budget_bytes = {budget}
max_in_flight = {in_flight}
"#,
        data = data.display(),
        shm = shm.display(),
        image = testkit::vm::require().display(),
        max_claims = setup.max_claims,
        warm = setup.warm,
        warm_max = setup.warm_max,
        max_out = setup.max_output_bytes,
        budget = setup.memory_budget_bytes,
        in_flight = setup.max_in_flight,
    )
}

/// Host floor: `argv` run by fork+exec+wait from this process, `n` times.
pub fn host_spawn(argv: &[&str], n: usize) -> Result<Samples, BoxError> {
    let mut s = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        let status = Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()?;
        s.push(t.elapsed());
        if !status.success() {
            s.failures += 1;
        }
    }
    Ok(s)
}

/// Host floor: `bytes` of zeroes from `dd bs=1M` (as the suites' producer in the
/// sandbox) through a local pipe into this process (read in 256 KiB steps and dropped),
/// `n` times.
pub fn host_pipe(bytes: u64, n: usize) -> Result<Samples, BoxError> {
    use std::io::Read;
    let mut s = Samples::default();
    let mut buf = vec![0u8; 256 << 10];
    for _ in 0..n {
        let t = Instant::now();
        let mut child = Command::new("dd")
            .args(["if=/dev/zero", "bs=1048576"])
            .arg(format!("count={}", bytes >> 20))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut out = child.stdout.take().ok_or("no stdout")?;
        let mut got = 0u64;
        loop {
            let k = out.read(&mut buf)?;
            if k == 0 {
                break;
            }
            got += k as u64;
        }
        child.wait()?;
        s.push(t.elapsed());
        if got != bytes {
            s.failures += 1;
        }
    }
    Ok(s)
}
