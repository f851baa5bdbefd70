//! The configuration file: TOML decoded strictly (unknown keys rejected), defaults, and the
//! one `validate()` (in `validate.rs`) that every other module may then rely on. Runtime
//! state lives elsewhere.

mod e2b;
mod engines;
mod limits;
mod snapshots;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use self::e2b::E2bConfig;
pub use self::engines::{AccelChoice, ProcessConfig, QemuConfig, QemuMachine, TemplateDisk};
pub use self::limits::{ExecConfig, HttpConfig};
pub use self::snapshots::SnapshotsConfig;
pub use crate::cluster::config::ClusterConfig;
use crate::error::{Error, Result};

/// The whole file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `host:port` for TCP or `unix:/path` for a Unix socket.
    pub listen: String,
    /// Where sandboxd keeps sandbox directories, golden stamps, pool targets and spills.
    pub data_dir: PathBuf,
    /// Root token; without it no caller is root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_token: Option<String>,
    /// Which engine makes guests.
    #[serde(default)]
    pub engine: EngineKind,
    /// The silkd binary; the `silkd` beside the sandboxd binary when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silkd_path: Option<PathBuf>,
    /// Lifetime of a claim that names none.
    #[serde(default = "default_ttl")]
    pub default_ttl_seconds: u64,
    /// Largest lifetime a claim or renew is granted.
    #[serde(default = "max_ttl")]
    pub max_ttl_seconds: u64,
    /// Node-wide limit of claimed sandboxes.
    #[serde(default = "max_claims")]
    pub max_claims: u32,
    /// Template used by a claim that names none; the first pool's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_template: Option<String>,
    /// Size used by a claim that names none; the first pool's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_size: Option<String>,
    /// Guests started at once by pool refill, across all pools.
    #[serde(default = "refill_concurrency")]
    pub refill_concurrency: u32,
    /// Bound on one guest's start, from spawn to silkd answering `Info`.
    #[serde(default = "boot_timeout")]
    pub boot_timeout_seconds: u64,
    /// Bound on a golden's warmup command.
    #[serde(default = "warmup_timeout")]
    pub warmup_timeout_seconds: u64,
    /// What SIGTERM does to claimed sandboxes (warm pool guests are always destroyed).
    #[serde(default)]
    pub on_stop: OnStop,
    /// Bound on a graceful stop; past it (or on a second SIGTERM) the binary exits at once.
    #[serde(default = "stop_timeout")]
    pub stop_timeout_seconds: u64,
    /// Tenants and their tokens.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Templates by name.
    #[serde(default)]
    pub templates: BTreeMap<String, TemplateConfig>,
    /// Sizes by name.
    #[serde(default)]
    pub sizes: BTreeMap<String, SizeConfig>,
    /// Warm pools.
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    /// Buffered exec limits.
    #[serde(default)]
    pub exec: ExecConfig,
    /// HTTP connection limits and timeouts.
    #[serde(default)]
    pub http: HttpConfig,
    /// Options of the `process` engine.
    #[serde(default)]
    pub process: ProcessConfig,
    /// Options of the `qemu` engine.
    #[serde(default)]
    pub qemu: QemuConfig,
    /// The E2B-compatible listener; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2b: Option<E2bConfig>,
    /// Snapshot lifetimes, quotas and disk headroom.
    #[serde(default)]
    pub snapshots: SnapshotsConfig,
    /// `[cluster]`: one of several nodes coordinated through etcd; a single node without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterConfig>,
}

/// Which engine makes guests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// silkd in fresh Linux namespaces (bubblewrap).
    #[default]
    Process,
    /// Real VMs under QEMU.
    Qemu,
}

impl EngineKind {
    /// The name used in config and `/v1/info`.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Process => "process",
            EngineKind::Qemu => "qemu",
        }
    }
}

/// What a graceful stop does to claimed sandboxes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStop {
    /// They keep running, and the next start on this `data_dir` re-adopts them (an
    /// upgrade or restart loses no user's work).
    #[default]
    Keep,
    /// They are destroyed with the daemon, and their records deleted.
    Destroy,
}

/// One `[[tenants]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Tenant name, shown in sandbox lists.
    pub name: String,
    /// Its bearer token.
    pub token: String,
    /// Sandboxes this tenant may hold at once.
    pub max_claims: u32,
}

/// One `[templates.NAME]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    /// Root filesystem tree (process engine), mounted read-only. When absent it is the
    /// image's `rootfs/`.
    #[serde(default)]
    pub rootfs: PathBuf,
    /// Guest image directory built by `cargo xtask image` (`vmlinuz`,
    /// `initramfs.cpio.gz`, `manifest.json`, `rootfs/`); needed by the qemu engine.
    /// A relative path is taken from the daemon's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<PathBuf>,
    /// The image's template metadata (default user, workdir, env), read from its
    /// `manifest.json` at load; empty without an image.
    #[serde(skip)]
    pub meta: crate::template::TemplateMeta,
    /// Bytes of output silkd keeps per detached command of this template (its ring: the
    /// oldest bytes are dropped and counted past it), passed as `--detach-ring` on both
    /// engines; silkd's default (1 MiB) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detach_ring_bytes: Option<u64>,
}

/// One `[sizes.NAME]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SizeConfig {
    /// CPU share (cgroup quota of this many CPUs).
    pub cpus: u32,
    /// Memory limit.
    pub memory_mib: u64,
    /// Process (and thread) limit.
    #[serde(default = "max_pids")]
    pub max_pids: u64,
    /// Process engine: the size of the one tmpfs a sandbox writes (`/home`, `/root`,
    /// `/tmp`, `/run`, `/dev/shm` are its directories; each its own tmpfs of this size
    /// without a uid block); filling it gives the sandbox ENOSPC. Its pages also count
    /// against `memory_mib`. Qemu, template with a root disk: the writable layer in guest
    /// RAM, at most half of `memory_mib`.
    #[serde(default = "disk_mib")]
    pub disk_mib: u64,
}

/// One `[[pools]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Template name.
    pub template: String,
    /// Size name.
    pub size: String,
    /// Idle sandboxes to keep ready.
    #[serde(default)]
    pub warm: u32,
    /// Upper bound `PUT /v1/pools` may raise `warm` to.
    #[serde(default = "warm_max")]
    pub warm_max: u32,
    /// Command run once in the golden before it is sealed; config-owned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<Vec<String>>,
    /// Boot guests without a balloon device (qemu); config-owned.
    #[serde(default)]
    pub no_balloon: bool,
}

fn default_ttl() -> u64 {
    300
}
fn max_ttl() -> u64 {
    86_400
}
fn max_claims() -> u32 {
    64
}
fn refill_concurrency() -> u32 {
    2
}
fn boot_timeout() -> u64 {
    10
}
fn warmup_timeout() -> u64 {
    120
}
fn stop_timeout() -> u64 {
    30
}
fn max_pids() -> u64 {
    512
}
fn disk_mib() -> u64 {
    512
}
fn warm_max() -> u32 {
    8
}

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A TCP address.
    Tcp(std::net::SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl Config {
    /// Reads, decodes and validates a file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("reading {}: {e}", path.display())))?;
        let config = Config::parse(&text)?;
        // Tokens in a file others can read are everyone's tokens. Warned, not refused: the
        // operator may have reasons (a config-management agent's group), the log says so.
        // Group read alone is a choice someone made by naming the group (the package's
        // `root:sandboxd 0640` lets the operators in group sandboxd read the root token).
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            let secrets = config.api_token.is_some() || !config.tenants.is_empty();
            if secrets && mode & 0o027 != 0 {
                tracing::warn!(
                    "{} holds tokens but has mode {mode:03o}; make it 0600 (chmod 600)",
                    path.display()
                );
            }
        }
        for (name, t) in &config.templates {
            config.check_rootfs_hides(name, &t.rootfs, path, "config file")?;
        }
        Ok(config)
    }

    /// Decodes and validates TOML text.
    pub fn parse(text: &str) -> Result<Config> {
        let mut config: Config = toml::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
        for t in config.templates.values_mut() {
            if let Some(image) = &mut t.image {
                if image.is_relative() {
                    if let Ok(cwd) = std::env::current_dir() {
                        *image = cwd.join(&*image);
                    }
                }
                if t.rootfs.as_os_str().is_empty() {
                    t.rootfs = image.join("rootfs");
                }
                t.meta = crate::template::TemplateMeta::load(image)?;
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// The (template, size) a claim without names gets.
    pub fn default_key(&self) -> (String, String) {
        let first = self.pools.first();
        fn only<V>(map: &BTreeMap<String, V>) -> Option<String> {
            (map.len() == 1)
                .then(|| map.keys().next().cloned())
                .flatten()
        }
        let template = self
            .default_template
            .clone()
            .or_else(|| first.map(|p| p.template.clone()))
            .or_else(|| only(&self.templates))
            .unwrap_or_default();
        let size = self
            .default_size
            .clone()
            .or_else(|| first.map(|p| p.size.clone()))
            .or_else(|| only(&self.sizes))
            .unwrap_or_default();
        (template, size)
    }

    /// The parsed `listen` value.
    pub fn listen_addr(&self) -> Result<ListenAddr> {
        if let Some(path) = self.listen.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(Error::Config(format!(
                    "listen {:?}: unix socket path must be absolute",
                    self.listen
                )));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        self.listen
            .parse()
            .map(ListenAddr::Tcp)
            .map_err(|e| Error::Config(format!("listen {:?}: {e}", self.listen)))
    }

    /// The silkd binary to launch: configured, else the `silkd` beside our own executable.
    pub fn silkd_path(&self) -> PathBuf {
        if let Some(p) = &self.silkd_path {
            return p.clone();
        }
        let exe = std::env::current_exe().unwrap_or_default();
        let dir = exe.parent().unwrap_or(Path::new("."));
        // Test and example binaries live in target/debug/{deps,examples}; silkd one level up.
        let beside = dir.join("silkd");
        if !beside.exists() && matches!(dir.file_name(), Some(n) if n == "deps" || n == "examples")
        {
            return dir.parent().unwrap_or(dir).join("silkd");
        }
        beside
    }

    /// The effective config with secrets redacted, for the one startup log line.
    pub fn redacted(&self) -> String {
        let mut c = self.clone();
        if c.api_token.is_some() {
            c.api_token = Some("<redacted>".into());
        }
        for t in &mut c.tenants {
            t.token = "<redacted>".into();
        }
        if let Some(cluster) = &mut c.cluster {
            cluster.peer_token = "<redacted>".into();
            cluster.etcd_password = cluster.etcd_password.as_ref().map(|_| "<redacted>".into());
        }
        toml::to_string(&c).unwrap_or_else(|e| format!("<unprintable config: {e}>"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
        listen = "127.0.0.1:0"
        data_dir = "/tmp/sbx"
        api_token = "0123456789abcdef-root"
        [templates.host]
        rootfs = "/usr"
        [sizes.small]
        cpus = 1
        memory_mib = 256
        [[pools]]
        template = "host"
        size = "small"
        warm = 1
    "#;

    #[test]
    fn base_parses_with_defaults() {
        let c = Config::parse(BASE).unwrap();
        assert_eq!(c.default_ttl_seconds, 300);
        assert_eq!(c.exec.max_output_bytes, 8 * 1024 * 1024);
        assert_eq!(c.default_key(), ("host".into(), "small".into()));
        assert_eq!(c.sizes["small"].max_pids, 512);
        assert!(c.redacted().contains("<redacted>"));
        assert!(!c.redacted().contains("0123456789abcdef-root"));
    }

    #[test]
    fn cluster_secrets_are_redacted_and_the_table_is_checked() {
        let cluster = "\n[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nnode_name = \"a\"\n\
                       peer_token = \"peer-secret-0123456789\"\netcd_user = \"u\"\n\
                       etcd_password = \"etcd-secret-pw\"\n";
        let c = Config::parse(&format!("{BASE}{cluster}")).unwrap();
        let shown = c.redacted();
        assert!(
            !shown.contains("peer-secret") && !shown.contains("etcd-secret"),
            "{shown}"
        );
        assert_eq!(c.cluster.unwrap().lease_ttl_seconds, 10);
        let bad = cluster.replace("node_name = \"a\"", "node_name = \"a/b\"");
        assert!(Config::parse(&format!("{BASE}{bad}")).is_err());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = Config::parse(&format!("{BASE}\nbogus = 1\n")).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        let text = BASE.replace("cpus = 1", "cpus = 1\ngpus = 2");
        assert!(Config::parse(&text).is_err());
    }

    #[test]
    fn validate_rejects_inconsistent_values() {
        for (from, to) in [
            ("warm = 1", "warm = 9"),
            ("size = \"small\"", "size = \"large\""),
            ("listen = \"127.0.0.1:0\"", "listen = \"unix:rel/sock\""),
            ("cpus = 1", "cpus = 0"),
            ("rootfs = \"/usr\"", "rootfs = \"/nonexistent\""),
            ("rootfs = \"/usr\"", "rootfs = \"usr\""),
            ("memory_mib = 256", "memory_mib = 256\ndisk_mib = 0"),
            (
                "api_token = \"0123456789abcdef-root\"",
                "api_token = \"short\"",
            ),
        ] {
            let text = BASE.replace(from, to);
            assert!(Config::parse(&text).is_err(), "accepted {to}");
        }
        let text = format!("{BASE}\nmax_ttl_seconds = 10\n");
        assert!(Config::parse(&text).is_err());
        for range in [
            "uid_base = 0",
            "uid_count = 0",
            "uid_base = 4294967000\nuid_count = 65536",
        ] {
            let text = format!("{BASE}\n[process]\n{range}\n");
            let err = Config::parse(&text).unwrap_err().to_string();
            assert!(err.contains("uid_base"), "{range}: {err}");
        }
    }

    /// A rootfs holding the node's own files is refused, naming the opt-in; with the
    /// opt-in it is accepted.
    #[test]
    fn a_rootfs_holding_the_node_is_refused_unless_opted_in() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let base = BASE.replace("/tmp/sbx", &data.display().to_string());
        let tree = dir.path().display().to_string();
        for rootfs in ["/", tree.as_str()] {
            let text = base.replace("rootfs = \"/usr\"", &format!("rootfs = \"{rootfs}\""));
            let err = Config::parse(&text).unwrap_err().to_string();
            assert!(
                err.contains("data_dir") && err.contains("unsafe_host_rootfs"),
                "{err}"
            );
            let opted = format!("{text}\n[process]\nunsafe_host_rootfs = true\n");
            let c = Config::parse(&opted).unwrap();
            assert_eq!(c.process.weakened(), ["unsafe_host_rootfs"]);
        }
        // The config file inside the rootfs, data_dir elsewhere: refused at load.
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(&rootfs).unwrap();
        let file = rootfs.join("sandboxd.toml");
        let text = BASE.replace(
            "rootfs = \"/usr\"",
            &format!("rootfs = \"{}\"", rootfs.display()),
        );
        std::fs::write(&file, &text).unwrap();
        let err = Config::load(&file).unwrap_err().to_string();
        assert!(err.contains("config file"), "{err}");
        std::fs::write(dir.path().join("outside.toml"), &text).unwrap();
        Config::load(&dir.path().join("outside.toml")).unwrap();
    }

    #[test]
    fn warm_targets_stay_within_the_config() {
        let c = Config::parse(BASE).unwrap();
        let target = |template: &str, warm, warm_max| api::PoolTarget {
            template: template.into(),
            size: "small".into(),
            warm,
            warm_max,
        };
        assert!(c.check_targets(&[target("host", 8, 8)]).is_ok());
        // The config's pool has the default warm_max 8; PUT cannot raise it.
        let e = c.check_targets(&[target("host", 1, 9)]).unwrap_err();
        assert!(e.to_string().contains("config's warm_max 8"), "{e}");
        // Warm targets together stay within max_claims (64 by default).
        let mut big = c.clone();
        big.pools[0].warm_max = 100;
        assert!(big.check_targets(&[target("host", 64, 100)]).is_ok());
        let e = big.check_targets(&[target("host", 65, 100)]).unwrap_err();
        assert!(e.to_string().contains("max_claims"), "{e}");
        // And so does the config file itself.
        let text = BASE.replace("warm = 1", "warm = 3\nwarm_max = 3");
        assert!(Config::parse(&format!("max_claims = 2\n{text}")).is_err());
    }

    #[test]
    fn http_limits_are_checked() {
        let c = Config::parse(BASE).unwrap();
        assert_eq!(c.http.max_connections, 4096);
        assert_eq!(c.exec.max_in_flight_per_sandbox, 32);
        for extra in [
            "[http]\nmax_connections = 0",
            "[http]\nidle_timeout_seconds = 0",
            "[http]\nwrite_timeout_seconds = 0",
            // 100 relays + 2 x 32 execs: over half the channel's 256 streams.
            "[http]\nmax_relays_per_sandbox = 100",
            "[http]\nbogus = 1",
        ] {
            assert!(
                Config::parse(&format!("{BASE}\n{extra}\n")).is_err(),
                "{extra}"
            );
        }
        let ok = Config::parse(&format!("{BASE}\n[http]\nmax_relays_per_sandbox = 64\n"));
        assert!(ok.is_ok());
    }

    #[test]
    fn listen_forms() {
        let mut c = Config::parse(BASE).unwrap();
        c.listen = "unix:/run/sbx.sock".into();
        assert_eq!(
            c.listen_addr().unwrap(),
            ListenAddr::Unix("/run/sbx.sock".into())
        );
    }
}
