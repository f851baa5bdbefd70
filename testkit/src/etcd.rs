//! A real etcd cluster for a test: members on free loopback ports with data dirs in one
//! temp dir, started together, each killed (SIGKILL) and restarted on its own data, and
//! all stopped and swept when the value is dropped (a panicking test included). Needs
//! Debian's `etcd-server` (`cargo xtask deps`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::guard::ChildGuard;
use crate::http::{try_call, Endpoint};
use crate::wait::wait_until;

/// The etcd server binary (Debian's `etcd-server`).
const ETCD: &str = "etcd";

struct Member {
    name: String,
    client: u16,
    peer: u16,
    /// Where `/health` answers over plain HTTP: the client port, or under TLS a metrics
    /// port of its own.
    health: u16,
    guard: Option<ChildGuard>,
}

/// An etcd cluster of a few members on loopback.
pub struct Etcd {
    members: Vec<Member>,
    initial: String,
    dir: tempfile::TempDir,
    /// Serving on `https://` with these files, requiring client certificates.
    tls: Option<Tls>,
}

/// What [`Etcd::start_tls`] serves with.
struct Tls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

/// `n` distinct ports free now, below the kernel's ephemeral range (32768 and up on
/// Linux), so that no outgoing connection (a member dialling its peers) takes one before
/// its member binds it. All are held until all are picked, then released.
fn free_ports(n: usize) -> Vec<u16> {
    let mut held = Vec::new();
    while held.len() < n {
        let port = rand::Rng::gen_range(&mut rand::thread_rng(), 10_000..32_000);
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

impl Etcd {
    /// Starts `n` members as one new cluster; returns once it has a leader.
    pub async fn start(n: usize) -> Etcd {
        Etcd::start_with(n, None).await
    }

    /// One member serving clients on `https://` with `certs`' server certificate,
    /// accepting only clients whose certificate `certs`' CA signed (`--client-cert-auth`).
    pub async fn start_tls(certs: &crate::certs::Certs) -> Etcd {
        let (cert, key) = certs.server();
        let tls = Tls {
            cert,
            key,
            ca: certs.ca(),
        };
        Etcd::start_with(1, Some(tls)).await
    }

    async fn start_with(n: usize, tls: Option<Tls>) -> Etcd {
        let found = Command::new(ETCD)
            .arg("--version")
            .stdout(Stdio::null())
            .status();
        assert!(
            found.is_ok_and(|s| s.success()),
            "`{ETCD}` is missing: install Debian's etcd-server (`cargo xtask deps` as root)"
        );
        let ports = free_ports(3 * n);
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: ports[3 * i],
                peer: ports[3 * i + 1],
                health: if tls.is_some() {
                    ports[3 * i + 2]
                } else {
                    ports[3 * i]
                },
                guard: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut etcd = Etcd {
            members,
            initial,
            // On tmpfs: etcd fsyncs every write, and on a busy shared disk one fsync can
            // stall a member past the nodes' 2 s call bound.
            dir: tempfile::tempdir_in("/dev/shm").unwrap(),
            tls,
        };
        for i in 0..n {
            etcd.spawn(i);
        }
        etcd.wait_healthy().await;
        etcd
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(&self.members[i].name)
    }

    fn spawn(&mut self, i: usize) {
        let data = self.data_dir(i);
        let log = self
            .dir
            .path()
            .join(format!("{}.log", self.members[i].name));
        let m = &self.members[i];
        let client = format!("{}://127.0.0.1:{}", self.scheme(), m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let mut cmd = Command::new(ETCD);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "testkit"])
            // Loopback: fast heartbeats, so a lost leader is replaced within a second.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"]);
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.cert)
                .arg("--key-file")
                .arg(&t.key)
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth")
                .arg("--listen-metrics-urls")
                .arg(format!("http://127.0.0.1:{}", m.health));
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap(),
        );
        let guard = ChildGuard::spawn(&format!("etcd {}", m.name), &mut cmd)
            .grace(Duration::from_secs(5))
            .log(log)
            .sweep(data.to_string_lossy().into_owned());
        self.members[i].guard = Some(guard);
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// Every member's client URL, for `[cluster] etcd`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://127.0.0.1:{}", self.scheme(), m.client))
            .collect()
    }

    /// SIGKILLs member `i` (its data stays for [`Etcd::restart`]).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut g) = self.members[i].guard.take() {
            g.kill();
        }
    }

    /// Starts member `i` again on its data.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].guard.is_none(), "member {i} is running");
        self.spawn(i);
    }

    /// Whether a running member reports the cluster healthy (a leader, quorum).
    /// Panics, with its log, when a member the test did not kill has exited.
    pub async fn healthy(&mut self) -> bool {
        for m in &mut self.members {
            if let Some(g) = m.guard.as_mut() {
                if let Some(status) = g.try_exit() {
                    panic!("etcd {} exited with {status}:\n{}", m.name, g.log_text());
                }
            }
        }
        for m in self.members.iter().filter(|m| m.guard.is_some()) {
            let at = Endpoint::Tcp(([127, 0, 0, 1], m.health).into());
            if let Ok(r) = try_call(at, "GET", "/health", None, None).await {
                if r.status == 200 && r.text().contains("\"true\"") {
                    return true;
                }
            }
        }
        false
    }

    /// Waits until [`Etcd::healthy`].
    pub async fn wait_healthy(&mut self) {
        wait_until(Duration::from_secs(30), "etcd healthy", async || {
            if self.healthy().await {
                Ok(())
            } else {
                Err("no member reports health yet")
            }
        })
        .await;
    }
}
