//! The test node's config: the few knobs tests turn, everything else small and fixed,
//! rendered as sandboxd's TOML (process engine over the guest image's busybox rootfs,
//! real silkd); and the tokens it accepts.

use std::path::{Path, PathBuf};

use crate::bins;

/// The root token.
pub const ROOT: &str = "root-token-for-tests-0001";
/// Tenant `a` (max claims: [`Setup::tenant_a_max_claims`]).
pub const TENANT_A: &str = "tenant-a-token-for-tests";
/// Tenant `b` (max claims: 1).
pub const TENANT_B: &str = "tenant-b-token-for-tests";

/// Knobs of the test config.
#[derive(Clone)]
pub struct Setup {
    /// The pool's warm target.
    pub warm: u32,
    /// The pool's `warm_max`.
    pub warm_max: u32,
    /// TOML array literal, e.g. `["false"]`.
    pub warmup: Option<String>,
    /// Node-wide claim limit.
    pub max_claims: u32,
    /// Claim limit of tenant `a`.
    pub tenant_a_max_claims: u32,
    /// `[exec] max_output_bytes`.
    pub max_output_bytes: u64,
    /// `[exec] memory_budget_bytes`.
    pub memory_budget_bytes: u64,
    /// `[exec] max_in_flight`.
    pub max_in_flight: u32,
    /// TTL of a claim that asks for none.
    pub default_ttl_seconds: u64,
    /// Longest TTL granted.
    pub max_ttl_seconds: u64,
    /// `[process] cgroup_root`; the host's when absent.
    pub cgroup_root: Option<PathBuf>,
    /// More `[exec]` lines (`key = value`), e.g. the per-sandbox in-flight bound.
    pub exec_extra: String,
    /// More TOML after everything else, e.g. an `[http]` table.
    pub tail: String,
    /// `[process] allow_missing_cgroups`: with a `cgroup_root` that lacks controllers.
    pub allow_missing_cgroups: bool,
    /// `[sizes.small] disk_mib`: the size of the sandbox's writable tmpfs.
    pub disk_mib: u64,
    /// More `[process]` lines, verbatim (the isolation tests' opt-outs).
    pub process_extra: String,
    /// `on_stop`: `"destroy"` for most tests (a stopped daemon leaves nothing), `"keep"`
    /// for the restart tests.
    pub on_stop: &'static str,
    /// The template's rootfs; the guest image's `rootfs/` when absent.
    pub rootfs: Option<PathBuf>,
    /// A built template image (`target/images/NAME`): the template is then `NAME`, given
    /// as `image = ...` (rootfs and metadata from the image), instead of `base`'s rootfs.
    pub image: Option<PathBuf>,
    /// More `[templates.NAME]` lines, verbatim (e.g. `detach_ring_bytes = 4096`).
    pub template_extra: String,
}

impl Default for Setup {
    /// sandboxd's own tests: small limits, short TTLs.
    fn default() -> Self {
        Setup {
            warm: 1,
            warm_max: 4,
            warmup: None,
            max_claims: 8,
            tenant_a_max_claims: 2,
            max_output_bytes: 64 * 1024,
            memory_budget_bytes: 1024 * 1024,
            max_in_flight: 8,
            default_ttl_seconds: 60,
            max_ttl_seconds: 120,
            cgroup_root: None,
            exec_extra: String::new(),
            tail: String::new(),
            allow_missing_cgroups: false,
            disk_mib: 64,
            process_extra: String::new(),
            on_stop: "destroy",
            rootfs: None,
            image: None,
            template_extra: String::new(),
        }
    }
}

impl Setup {
    /// The SDK and `sbx` tests: room for large outputs, long TTLs, one claim for tenant `a`.
    pub fn sdk() -> Setup {
        Setup {
            max_claims: 16,
            tenant_a_max_claims: 1,
            max_output_bytes: 4 * 1024 * 1024,
            memory_budget_bytes: 16 * 1024 * 1024,
            max_in_flight: 16,
            default_ttl_seconds: 120,
            max_ttl_seconds: 600,
            ..Setup::default()
        }
    }

    /// The template's name: the image directory's, else `base`.
    pub fn template(&self) -> String {
        self.image
            .as_ref()
            .and_then(|i| i.file_name())
            .map_or("base".into(), |n| n.to_string_lossy().into_owned())
    }

    /// The config file, with `data_dir` and `listen` (`host:port` or `unix:/path`).
    pub fn toml(&self, data_dir: &Path, listen: &str) -> String {
        let mut t = format!(
            r#"listen = "{listen}"
data_dir = "{data}"
api_token = "{ROOT}"
silkd_path = "{silkd}"
max_claims = {max_claims}
default_ttl_seconds = {dttl}
max_ttl_seconds = {mttl}
boot_timeout_seconds = 10
warmup_timeout_seconds = 10
on_stop = "{on_stop}"

[templates.{template}]
{source}
{template_extra}

[sizes.small]
cpus = 1
memory_mib = 256
max_pids = 256
disk_mib = {disk_mib}

[[pools]]
template = "{template}"
size = "small"
warm = {warm}
warm_max = {warm_max}
"#,
            data = data_dir.display(),
            silkd = bins::silkd().display(),
            template = self.template(),
            source = match &self.image {
                Some(image) => format!("image = \"{}\"", image.display()),
                None => format!(
                    "rootfs = \"{}\"",
                    self.rootfs
                        .clone()
                        .unwrap_or_else(|| crate::vm::guest_image().join("rootfs"))
                        .display()
                ),
            },
            template_extra = self.template_extra,
            disk_mib = self.disk_mib,
            on_stop = self.on_stop,
            max_claims = self.max_claims,
            dttl = self.default_ttl_seconds,
            mttl = self.max_ttl_seconds,
            warm = self.warm,
            warm_max = self.warm_max,
        );
        if let Some(w) = &self.warmup {
            t.push_str(&format!("warmup = {w}\n"));
        }
        t.push_str(&format!(
            "\n[exec]\nmax_output_bytes = {}\nmemory_budget_bytes = {}\nmax_in_flight = {}\n{}\n",
            self.max_output_bytes, self.memory_budget_bytes, self.max_in_flight, self.exec_extra
        ));
        let uids = uid_range(data_dir);
        t.push_str(&format!(
            "\n[process]\nuid_base = {}\nuid_count = {}\nuid_block = {UID_BLOCK}\n",
            uids.start,
            uids.end - uids.start
        ));
        if let Some(root) = &self.cgroup_root {
            t.push_str(&format!("cgroup_root = \"{}\"\n", root.display()));
        }
        if self.allow_missing_cgroups {
            t.push_str("allow_missing_cgroups = true\n");
        }
        t.push_str(&self.process_extra);
        t.push_str(&format!(
            "\n[[tenants]]\nname = \"a\"\ntoken = \"{TENANT_A}\"\nmax_claims = {}\n\
             \n[[tenants]]\nname = \"b\"\ntoken = \"{TENANT_B}\"\nmax_claims = 1\n",
            self.tenant_a_max_claims
        ));
        t.push_str(&format!("\n{}\n", self.tail));
        t
    }
}

/// Uids per process-engine sandbox in test daemons (`[process] uid_block`): enough for
/// root and the `default` template's user (1000), small enough that every test daemon
/// gets a range of its own.
pub const UID_BLOCK: u32 = 1024;

/// The sandbox uids of the test daemon whose data dir is `data_dir`: a range of its own
/// (picked from the path) of 32 blocks, so that tests running side by side never share a
/// uid and a test can tell its own sandboxes' processes by uid. Below the qemu engine's
/// default range (2,100,000,000).
pub fn uid_range(data_dir: &Path) -> std::ops::Range<u32> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    data_dir.hash(&mut h);
    let width = 32 * UID_BLOCK;
    let start = 2_000_000_000 + (h.finish() % 3_000) as u32 * width;
    start..start + width
}

/// How a test daemon listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// `127.0.0.1:0`: the kernel picks the port, the daemon says which.
    Tcp,
    /// `unix:<dir>/sandboxd.sock`.
    Unix,
}

impl Listen {
    /// The `listen` value for a daemon whose files live in `dir`.
    pub fn address(self, dir: &Path) -> String {
        match self {
            Listen::Tcp => "127.0.0.1:0".into(),
            Listen::Unix => format!("unix:{}", dir.join("sandboxd.sock").display()),
        }
    }
}
