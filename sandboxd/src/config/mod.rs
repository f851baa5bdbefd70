//! The configuration file: TOML decoded strictly (unknown keys rejected), defaults, and the
//! one `validate()` (in `validate.rs`) that every other module may then rely on. Runtime
//! state lives elsewhere.

mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
    /// Process engine: the size of each tmpfs a sandbox can write (`/home`, `/tmp`, `/run`,
    /// `/dev/shm`); filling one gives the sandbox ENOSPC. Their pages also count against
    /// `memory_mib`.
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

/// `[exec]`: buffered exec limits.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// Per-exec output cap in raw bytes, stdout and stderr together (413 beyond).
    #[serde(default = "max_output")]
    pub max_output_bytes: u64,
    /// Node-wide heap for buffered output; beyond it output spills to unlinked temp files.
    #[serde(default = "memory_budget")]
    pub memory_budget_bytes: u64,
    /// Buffered execs at once (503 + Retry-After beyond).
    #[serde(default = "max_in_flight")]
    pub max_in_flight: u32,
    /// Buffered execs at once in one sandbox (503 + Retry-After beyond), so one sandbox
    /// cannot take the node's whole share.
    #[serde(default = "max_in_flight_per_sandbox")]
    pub max_in_flight_per_sandbox: u32,
    /// Buffered execs at once across one tenant's sandboxes (503 + Retry-After beyond).
    #[serde(default = "max_in_flight_per_tenant")]
    pub max_in_flight_per_tenant: u32,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            max_output_bytes: max_output(),
            memory_budget_bytes: memory_budget(),
            max_in_flight: max_in_flight(),
            max_in_flight_per_sandbox: max_in_flight_per_sandbox(),
            max_in_flight_per_tenant: max_in_flight_per_tenant(),
        }
    }
}

/// `[http]`: what one client may hold of the node: connections, and how long a
/// connection may sit on a request or a response without progress.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Open connections at once, relays included; beyond it a new connection is answered
    /// 503 and closed.
    #[serde(default = "max_connections")]
    pub max_connections: u32,
    /// From a request's first byte to its complete head (slow-headers clients).
    #[serde(default = "header_timeout")]
    pub header_timeout_seconds: u64,
    /// From a request's head to its complete body (408 beyond).
    #[serde(default = "body_timeout")]
    pub body_timeout_seconds: u64,
    /// A connection with no request in progress is closed after this long without a
    /// byte (new connections that never send, and idle keep-alive ones).
    #[serde(default = "idle_timeout")]
    pub idle_timeout_seconds: u64,
    /// A response write that makes no progress for this long (the client stopped
    /// reading) closes the connection, which frees the exec output it held.
    #[serde(default = "write_timeout")]
    pub write_timeout_seconds: u64,
    /// Relays open at once to one sandbox (429 beyond).
    #[serde(default = "max_relays_per_sandbox")]
    pub max_relays_per_sandbox: u32,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_connections: max_connections(),
            header_timeout_seconds: header_timeout(),
            body_timeout_seconds: body_timeout(),
            idle_timeout_seconds: idle_timeout(),
            write_timeout_seconds: write_timeout(),
            max_relays_per_sandbox: max_relays_per_sandbox(),
        }
    }
}

/// `[process]`: options of the process engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessConfig {
    /// The bubblewrap binary.
    #[serde(default = "bwrap")]
    pub bwrap: PathBuf,
    /// Where the cgroup hierarchies are mounted.
    #[serde(default = "cgroup_root")]
    pub cgroup_root: PathBuf,
    /// First host uid (and gid) of the range sandboxes run under when sandboxd is root:
    /// one per sandbox, owning nothing on the host. Far above any real user's.
    #[serde(default = "uid_base")]
    pub uid_base: u32,
    /// How many uids the range holds (so at most this many sandboxes at once).
    #[serde(default = "uid_count")]
    pub uid_count: u32,
    /// UNSAFE: accept a template rootfs that contains the node's own files (`/`, or any
    /// tree holding `data_dir` or the config file): sandboxes can then read them.
    #[serde(default, skip_serializing_if = "is_false")]
    pub unsafe_host_rootfs: bool,
    /// UNSAFE: start sandboxes even when cpu, memory or pids limits cannot all be applied
    /// (listed in `/v1/info` warnings); one sandbox can then starve the node.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_missing_cgroups: bool,
    /// UNSAFE, for measuring only: no seccomp filter, so sandboxes may call every syscall
    /// (new user namespaces, keyring, bpf, io_uring...).
    #[serde(default, skip_serializing_if = "is_false")]
    pub unsafe_no_seccomp: bool,
    /// UNSAFE, for measuring only: every sandbox runs as sandboxd's own user (root when
    /// sandboxd is root) instead of a uid of its own from `uid_base`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub unsafe_no_identity: bool,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        ProcessConfig {
            bwrap: bwrap(),
            cgroup_root: cgroup_root(),
            uid_base: uid_base(),
            uid_count: uid_count(),
            unsafe_host_rootfs: false,
            allow_missing_cgroups: false,
            unsafe_no_seccomp: false,
            unsafe_no_identity: false,
        }
    }
}

impl ProcessConfig {
    /// The opt-outs that are on, by key name, for logs and `/v1/info` warnings.
    pub fn weakened(&self) -> Vec<&'static str> {
        [
            ("unsafe_host_rootfs", self.unsafe_host_rootfs),
            ("allow_missing_cgroups", self.allow_missing_cgroups),
            ("unsafe_no_seccomp", self.unsafe_no_seccomp),
            ("unsafe_no_identity", self.unsafe_no_identity),
        ]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect()
    }
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
fn max_pids() -> u64 {
    512
}
fn disk_mib() -> u64 {
    512
}
fn uid_base() -> u32 {
    // Far above login users (1000+), systemd's dynamic users (61184-65519) and the
    // subordinate ranges useradd hands out (100000+, 65536 each), and below 2^31 - 1 so
    // no tool that treats uids as signed 32-bit numbers sees a negative one.
    2_000_000_000
}
fn uid_count() -> u32 {
    65_536
}
fn is_false(b: &bool) -> bool {
    !*b
}
fn warm_max() -> u32 {
    8
}
fn max_output() -> u64 {
    8 * 1024 * 1024
}
fn memory_budget() -> u64 {
    64 * 1024 * 1024
}
fn max_in_flight() -> u32 {
    256
}
fn max_in_flight_per_sandbox() -> u32 {
    32
}
fn max_in_flight_per_tenant() -> u32 {
    128
}
fn max_connections() -> u32 {
    4096
}
fn header_timeout() -> u64 {
    10
}
fn body_timeout() -> u64 {
    30
}
fn idle_timeout() -> u64 {
    60
}
fn write_timeout() -> u64 {
    30
}
fn max_relays_per_sandbox() -> u32 {
    32
}
fn bwrap() -> PathBuf {
    PathBuf::from("bwrap")
}
fn cgroup_root() -> PathBuf {
    PathBuf::from("/sys/fs/cgroup")
}

/// `[qemu]`: options of the qemu engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QemuConfig {
    /// The QEMU binary.
    #[serde(default = "qemu_binary")]
    pub binary: PathBuf,
    /// `auto` (KVM if it actually boots a guest, else TCG), `kvm` or `tcg`.
    #[serde(default)]
    pub accel: AccelChoice,
    /// `microvm` (fastest) or `q35`.
    #[serde(default = "qemu_machine")]
    pub machine: QemuMachine,
    /// Directory (tmpfs) under which this daemon keeps its private (0700) directory of
    /// golden guest RAM files.
    #[serde(default = "memory_dir")]
    pub memory_dir: PathBuf,
    /// When sandboxd is root: QEMUs run as uids `uid_base + 1 .. uid_base + uid_count`
    /// (one each, gid = uid), and `uid_base` is the group that may read golden files.
    /// Apart from the process engine's range, and owning nothing on the host.
    #[serde(default = "qemu_uid_base")]
    pub uid_base: u32,
    /// Size of that range (so at most `uid_count - 1` QEMUs at once).
    #[serde(default = "qemu_uid_count")]
    pub uid_count: u32,
}

impl Default for QemuConfig {
    fn default() -> Self {
        QemuConfig {
            binary: qemu_binary(),
            accel: AccelChoice::default(),
            machine: qemu_machine(),
            memory_dir: memory_dir(),
            uid_base: qemu_uid_base(),
            uid_count: qemu_uid_count(),
        }
    }
}

/// `[qemu] accel`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccelChoice {
    /// Probe KVM once with a short deadline; TCG when it does not boot a guest.
    #[default]
    Auto,
    /// Hardware virtualization.
    Kvm,
    /// Software emulation.
    Tcg,
}

/// `[qemu] machine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QemuMachine {
    /// virtio-mmio devices; fastest boot.
    Microvm,
    /// PCI devices; the safer fallback.
    Q35,
}

fn qemu_binary() -> PathBuf {
    PathBuf::from("qemu-system-x86_64")
}
fn qemu_machine() -> QemuMachine {
    QemuMachine::Microvm
}
fn memory_dir() -> PathBuf {
    PathBuf::from("/dev/shm")
}
fn qemu_uid_base() -> u32 {
    2_100_000_000
}
fn qemu_uid_count() -> u32 {
    65_536
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
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            let secrets = config.api_token.is_some() || !config.tenants.is_empty();
            if secrets && mode & 0o077 != 0 {
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
