//! The engines' sections: `[process]` (bubblewrap, cgroups, identities and the loud
//! opt-outs) and `[qemu]`, with their defaults.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

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
    /// a block of `uid_block` per sandbox, owning nothing on the host. Far above any real
    /// user's.
    #[serde(default = "uid_base")]
    pub uid_base: u32,
    /// How many uids the range holds (so at most `uid_count / uid_block` sandboxes at
    /// once).
    #[serde(default = "uid_count")]
    pub uid_count: u32,
    /// Uids per sandbox: its user namespace maps ids `0 .. uid_block` to its block, so
    /// commands can run as root or any user of the template whose uid is below it.
    #[serde(default = "uid_block")]
    pub uid_block: u32,
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
            uid_block: uid_block(),
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
    /// How a template's read-only image reaches its guests: `blk` (virtio-blk) or `pmem`
    /// (virtio-pmem with DAX; q35 only). docs/templates.md has the measurements.
    #[serde(default)]
    pub template_disk: TemplateDisk,
}

/// `[qemu] template_disk`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TemplateDisk {
    /// One read-only virtio-blk disk: every guest keeps a page cache of what it reads.
    #[default]
    Blk,
    /// The image mapped read-only and shared as a virtio-pmem region, mounted with DAX:
    /// guests read the host's page cache of it directly.
    Pmem,
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
            template_disk: TemplateDisk::default(),
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

fn is_false(b: &bool) -> bool {
    !*b
}

fn uid_base() -> u32 {
    // Far above login users (1000+), systemd's dynamic users (61184-65519) and the
    // subordinate ranges useradd hands out (100000+, 65536 each), and below 2^31 - 1 so
    // no tool that treats uids as signed 32-bit numbers sees a negative one.
    2_000_000_000
}

fn uid_count() -> u32 {
    // 1024 sandboxes of 65,536 ids, ending at 2,067,108,864: below the qemu engine's
    // range (2,100,000,000).
    1024 * uid_block()
}

fn uid_block() -> u32 {
    // The whole 16-bit id space, as container runtimes give (nobody is 65534).
    65_536
}

fn bwrap() -> PathBuf {
    PathBuf::from("bwrap")
}

fn cgroup_root() -> PathBuf {
    PathBuf::from("/sys/fs/cgroup")
}
