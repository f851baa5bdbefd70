//! QEMU command lines: one builder for golden, clone and cold boots, so the device set
//! of a clone always matches its golden's (migration requires it).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

pub use crate::config::QemuMachine as Machine;
pub use crate::config::TemplateDisk;

/// Accelerator actually used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization.
    Kvm,
    /// Software emulation.
    Tcg,
}

impl Accel {
    /// `kvm` or `tcg`.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// How guest RAM is backed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Anonymous RAM (a cold boot), in a backend named `mem` like the others: its
    /// migration stream then fits a snapshot's helper, so cold boots can be snapshotted.
    Anonymous,
    /// The golden: a shared file (inherited as [`MEMORY_FD`]) other guests will map.
    GoldenShared,
    /// A clone: the golden's file (inherited as [`MEMORY_FD`]) mapped private and
    /// read-only (writes are copy-on-write pages of this process; QEMU refuses to
    /// discard, so the file is never touched).
    ClonePrivate,
}

/// The fds a QEMU inherits: it opens nothing of sandboxd's by path. Its sockets are bound
/// by sandboxd in the VM's private run dir, its files opened by sandboxd; QEMU reopens the
/// files through `/proc/self/fd/N`, which checks only the file's own owner and mode.
pub const QMP_FD: i32 = 3;
/// The listening socket of the `silkd` virtio-serial port.
pub const CHANNEL_FD: i32 = 4;
/// One end of a socket pair whose other end sandboxd drains into the console ring.
pub const CONSOLE_FD: i32 = 5;
/// The kernel image.
pub const KERNEL_FD: i32 = 6;
/// The initramfs.
pub const INITRD_FD: i32 = 7;
/// The golden's memory file (golden and clones).
pub const MEMORY_FD: i32 = 8;
/// The golden's migration state (written by the golden, read by clones).
pub const STATE_FD: i32 = 9;

/// The template's read-only root disk (`rootfs.erofs`), for templates that have one.
pub const DISK_FD: i32 = 10;
/// Where the guest sees that disk as virtio-blk: the only one, so always the first.
pub const GUEST_DISK: &str = "/dev/vda";
/// Where the guest sees it as virtio-pmem: the only region, so always the first.
pub const GUEST_PMEM: &str = "/dev/pmem0";
/// What a virtio-pmem region's size must be a multiple of: the guest's nd_pmem refuses
/// anything else ("misaligned, unable to map", measured), so images are padded to it.
pub const PMEM_ALIGN: u64 = 2 << 20;

/// QEMU's own syscall filter: no obsolete calls, no set*uid (it never needs to gain or
/// change privileges), no fork/exec, no scheduler or affinity changes.
pub const SANDBOX: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// TCG's translation cache in MiB. QEMU sizes it at up to 1 GiB by default, and a guest
/// running lots of code fills it; a fixed size keeps QEMU within its cgroup's margin.
/// 64, not less: only what a guest has filled is resident (an idle clone's ~7 MiB at any
/// size), and a code-heavy guest ran 2.3x slower at 8 and ~1.3x at 16 (busybox applets and
/// `ls -lR`; 32 was as fast as 64 there, but real runtimes bring more code).
pub const TCG_TB_MIB: u64 = 64;

/// The CPU model under TCG: QEMU's default `qemu64` plus ARAT (the local APIC timer keeps
/// running in deep C-states). Without ARAT the guest kernel marks its only clock event
/// device C3STOP, finds no broadcast device that can do one-shot (microvm has no HPET),
/// and keeps the periodic 250 Hz tick forever: an idle guest woke QEMU 245 times a
/// second (`/proc/interrupts` LOC; `/proc/timer_list` tick mode periodic, nohz inactive).
/// With it the guest goes tickless when idle. Part of the golden's key.
pub const TCG_CPU: &str = "qemu64,+arat";

/// Kernel flags that stop an idle guest waking itself (and QEMU) for nothing: no lockup
/// watchdog (a 4 s timer, and meaningless under TCG), no proactive compaction (kcompactd
/// woke every 500 ms), no pressure-stall accounting (its averages ran every 2 s). With
/// them an idle clone's QEMU made 27 syscalls in 10 s instead of 772 (`strace -c`, no
/// balloon stats polling; 70 with it). Part of the golden's key, with the whole fixed
/// kernel command line.
pub const GUEST_QUIET: &str = "nowatchdog sysctl.vm.compaction_proactiveness=0 psi=0";

/// Everything that varies between guests.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    /// Accelerator.
    pub accel: Accel,
    /// Machine type.
    pub machine: Machine,
    /// vCPUs.
    pub cpus: u32,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// RAM backing.
    pub memory: Memory,
    /// This guest's run dir, put in `-name` so a QEMU left by a crashed daemon can be
    /// found by its command line.
    pub run_dir: &'a Path,
    /// Host TSC in kHz (TCG early-boot hang guard).
    pub tsc_khz: u64,
    /// Give the guest a virtio balloon (deflate-on-OOM, stats, no free-page reporting).
    pub balloon: bool,
    /// Wait for `migrate-incoming` instead of booting.
    pub incoming: bool,
    /// The template's root disk (inherited as [`DISK_FD`]); `None` boots the initramfs
    /// alone (`base`).
    pub disk: Option<RootDisk>,
    /// silkd's flags from the template, appended after its own.
    pub silkd_args: &'a [String],
}

/// A template's read-only root disk as one launch attaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootDisk {
    /// The writable layer's size in MiB (`disk_mib`).
    pub disk_mib: u64,
    /// virtio-blk or virtio-pmem (`[qemu] template_disk`).
    pub kind: TemplateDisk,
    /// The image's size in bytes (a multiple of [`PMEM_ALIGN`] for pmem).
    pub bytes: u64,
}

impl RootDisk {
    /// The device silkd mounts.
    pub fn guest_device(&self) -> &'static str {
        match self.kind {
            TemplateDisk::Blk => GUEST_DISK,
            TemplateDisk::Pmem => GUEST_PMEM,
        }
    }
}

/// The silkd socket inside a run dir.
pub fn silkd_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("silkd.sock")
}

/// The QMP socket inside a run dir.
pub fn qmp_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("qmp.sock")
}

/// The migration URI of the golden's state, for `migrate` (golden) and
/// `migrate-incoming` (clones).
pub fn state_uri() -> String {
    format!("file:{}", fd_path(STATE_FD))
}

fn fd_path(fd: i32) -> String {
    format!("/proc/self/fd/{fd}")
}

/// Kernel command line: quiet, fast under TCG, silkd serving the `silkd` port as init
/// (and, with a root disk, switching root into it with a writable layer of `disk_mib`),
/// then the template's silkd flags. The kernel splits init's arguments at spaces unless
/// they are in double quotes, so an argument with whitespace is quoted (the template's
/// metadata holds no `"`: `TemplateMeta` refuses it).
pub fn kernel_cmdline(tsc_khz: u64, disk: Option<&RootDisk>, silkd_args: &[String]) -> String {
    let mut disk = disk.map_or(String::new(), |d| {
        format!(
            " --root-disk {} --disk-mib {}",
            d.guest_device(),
            d.disk_mib
        )
    });
    for a in silkd_args {
        if a.contains(char::is_whitespace) {
            disk.push_str(&format!(" \"{a}\""));
        } else {
            disk.push_str(&format!(" {a}"));
        }
    }
    format!(
        "console=ttyS0 panic=-1 quiet loglevel=1 no_timer_check i8042.noaux i8042.nomux \
         i8042.nopnp i8042.dumbkbd mitigations=off tsc=reliable random.trust_cpu=on \
         tsc_early_khz={tsc_khz} {GUEST_QUIET} -- --listen serial:silkd{disk}"
    )
}

/// The full argument list (without the binary).
pub fn args(l: &Launch<'_>) -> Vec<OsString> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    push(&["-sandbox", SANDBOX]);
    // QEMU option values escape a comma by doubling it.
    let name = l.run_dir.to_string_lossy().replace(',', ",,");
    push(&["-name", &format!("guest={name}")]);
    match l.accel {
        Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => push(&[
            "-accel",
            &format!("tcg,tb-size={TCG_TB_MIB}"),
            "-cpu",
            TCG_CPU,
        ]),
    }
    let (serial_dev, balloon_dev, blk_dev) = match l.machine {
        Machine::Microvm => (
            "virtio-serial-device",
            "virtio-balloon-device",
            "virtio-blk-device",
        ),
        Machine::Q35 => ("virtio-serial-pci", "virtio-balloon-pci", "virtio-blk-pci"),
    };
    let machine = match l.machine {
        // No i8254 PIT: the kernel needs none (tsc_early_khz spares it the calibration,
        // the local APIC is its clock event device), and QEMU's emulated PIT woke its
        // main loop every ~27 ms for nothing (an idle clone at 1.05% of a core with it,
        // 0.50% without, same run).
        Machine::Microvm => "microvm,pit=off",
        Machine::Q35 => "q35",
    };
    let mem = format!("{}M", l.memory_mib);
    let pmem = l.disk.filter(|d| d.kind == TemplateDisk::Pmem);
    let memory = match pmem {
        // Room for the region above RAM: a pmem device is a memory device.
        Some(d) => format!(
            "{mem},slots=1,maxmem={}M",
            l.memory_mib + d.bytes.div_ceil(1 << 20)
        ),
        None => mem.clone(),
    };
    push(&["-m", &memory, "-smp", &l.cpus.to_string()]);
    push(&[
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ]);
    let console = format!("socket,id=con,fd={CONSOLE_FD}");
    push(&["-chardev", &console, "-serial", "chardev:con"]);
    let mem_path = fd_path(MEMORY_FD);
    let backend = match l.memory {
        Memory::Anonymous => format!("memory-backend-ram,id=mem,size={mem}"),
        Memory::GoldenShared => {
            format!("memory-backend-file,id=mem,size={mem},mem-path={mem_path},share=on")
        }
        Memory::ClonePrivate => format!(
            "memory-backend-file,id=mem,size={mem},mem-path={mem_path},share=off,readonly=on,rom=off"
        ),
    };
    push(&[
        "-object",
        &backend,
        "-M",
        &format!("{machine},memory-backend=mem"),
    ]);
    push(&["-kernel", &fd_path(KERNEL_FD)]);
    // A restoring QEMU gets the kernel's header only (`stub.rs`) and no initramfs: its
    // guest booted long ago, and QEMU would keep both in its heap for nothing.
    if !l.incoming {
        push(&["-initrd", &fd_path(INITRD_FD)]);
    }
    push(&[
        "-append",
        &kernel_cmdline(l.tsc_khz, l.disk.as_ref(), l.silkd_args),
    ]);
    push(&["-device", &format!("{serial_dev},id=vs0")]);
    let chan = format!("socket,id=ch0,fd={CHANNEL_FD},server=on,wait=off");
    push(&["-chardev", &chan]);
    push(&["-device", "virtserialport,bus=vs0.0,chardev=ch0,name=silkd"]);
    if l.balloon {
        push(&[
            "-device",
            &format!("{balloon_dev},id=balloon0,deflate-on-oom=on"),
        ]);
    }
    match l.disk.map(|d| (d.kind, d.bytes)) {
        // Read-only, so no guest can write the image every guest of the template shares,
        // and cached by the host (cache=writeback): one page cache of the image serves
        // all QEMUs; each guest keeps its own page cache of what it read.
        Some((TemplateDisk::Blk, _)) => {
            let drive = format!(
                "file={},format=raw,readonly=on,if=none,id=root,cache=writeback",
                fd_path(DISK_FD)
            );
            push(&["-drive", &drive]);
            push(&["-device", &format!("{blk_dev},drive=root")]);
        }
        // The image mapped as guest memory (DAX: the guest reads the host's page cache
        // directly, no copy in each guest). share=on makes it a shared RAM block, which
        // x-ignore-shared leaves out of a golden's state like the golden's RAM;
        // readonly=on maps it read-only (guest writes are dropped, the file is opened
        // O_RDONLY). q35 only: microvm has no device-memory region (validate.rs).
        Some((TemplateDisk::Pmem, bytes)) => {
            let backend = format!(
                "memory-backend-file,id=rootimg,mem-path={},size={bytes},share=on,readonly=on",
                fd_path(DISK_FD)
            );
            push(&["-object", &backend]);
            push(&["-device", "virtio-pmem-pci,memdev=rootimg,id=pmem0"]);
        }
        None => {}
    }
    let qmp = format!("socket,id=qmp,fd={QMP_FD},server=on,wait=off");
    push(&["-chardev", &qmp, "-mon", "chardev=qmp,mode=control"]);
    if l.incoming {
        push(&["-incoming", "defer"]);
    }
    a.into_iter().map(OsString::from).collect()
}

#[cfg(test)]
#[path = "cmdline_tests.rs"]
mod tests;
