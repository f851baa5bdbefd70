//! QEMU command lines: one builder for golden, clone and cold boots, so the device set
//! of a clone always matches its golden's (migration requires it).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

pub use crate::config::QemuMachine as Machine;

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
#[derive(Debug, Clone)]
pub enum Memory {
    /// Anonymous RAM (a cold boot that will not be snapshotted).
    Anonymous,
    /// The golden: a shared file other guests will map.
    GoldenShared(PathBuf),
    /// A clone: the golden's file mapped private and read-only (writes are copy-on-write
    /// pages of this process; QEMU refuses to discard, so the file is never touched).
    ClonePrivate(PathBuf),
}

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
    /// Image directory holding `vmlinuz` and `initramfs.cpio.gz`.
    pub image: &'a Path,
    /// Directory for this guest's sockets and console log.
    pub run_dir: &'a Path,
    /// Host TSC in kHz (TCG early-boot hang guard).
    pub tsc_khz: u64,
    /// Give the guest a virtio balloon (deflate-on-OOM, stats, no free-page reporting).
    pub balloon: bool,
    /// Wait for `migrate-incoming` instead of booting.
    pub incoming: bool,
}

/// The silkd socket inside a run dir.
pub fn silkd_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("silkd.sock")
}

/// The QMP socket inside a run dir.
pub fn qmp_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("qmp.sock")
}

/// The guest console log inside a run dir.
pub fn console_log(run_dir: &Path) -> PathBuf {
    run_dir.join("console.log")
}

/// Kernel command line: quiet, fast under TCG, silkd serving the `silkd` port as init.
pub fn kernel_cmdline(tsc_khz: u64) -> String {
    format!(
        "console=ttyS0 panic=-1 quiet loglevel=1 no_timer_check i8042.noaux i8042.nomux \
         i8042.nopnp i8042.dumbkbd mitigations=off tsc=reliable random.trust_cpu=on \
         tsc_early_khz={tsc_khz} -- --listen serial:silkd"
    )
}

/// The full argument list (without the binary).
pub fn args(l: &Launch<'_>) -> Vec<OsString> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    push(&["-accel", l.accel.name()]);
    if l.accel == Accel::Kvm {
        push(&["-cpu", "host"]);
    }
    let (serial_dev, balloon_dev) = match l.machine {
        Machine::Microvm => ("virtio-serial-device", "virtio-balloon-device"),
        Machine::Q35 => ("virtio-serial-pci", "virtio-balloon-pci"),
    };
    let machine = match l.machine {
        Machine::Microvm => "microvm",
        Machine::Q35 => "q35",
    };
    let mem = format!("{}M", l.memory_mib);
    push(&["-m", &mem, "-smp", &l.cpus.to_string()]);
    push(&[
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ]);
    let console = format!("file,id=con,path={}", console_log(l.run_dir).display());
    push(&["-chardev", &console, "-serial", "chardev:con"]);
    let backend = match &l.memory {
        Memory::Anonymous => None,
        Memory::GoldenShared(p) => Some(format!(
            "memory-backend-file,id=mem,size={mem},mem-path={},share=on",
            p.display()
        )),
        Memory::ClonePrivate(p) => Some(format!(
            "memory-backend-file,id=mem,size={mem},mem-path={},share=off,readonly=on,rom=off",
            p.display()
        )),
    };
    match backend {
        Some(b) => push(&[
            "-object",
            &b,
            "-M",
            &format!("{machine},memory-backend=mem"),
        ]),
        None => push(&["-M", machine]),
    }
    let kernel = l.image.join("vmlinuz");
    let initrd = l.image.join("initramfs.cpio.gz");
    push(&["-kernel", &kernel.to_string_lossy()]);
    push(&["-initrd", &initrd.to_string_lossy()]);
    push(&["-append", &kernel_cmdline(l.tsc_khz)]);
    push(&["-device", &format!("{serial_dev},id=vs0")]);
    let chan = format!(
        "socket,id=ch0,path={},server=on,wait=off",
        silkd_socket(l.run_dir).display()
    );
    push(&["-chardev", &chan]);
    push(&["-device", "virtserialport,bus=vs0.0,chardev=ch0,name=silkd"]);
    if l.balloon {
        push(&[
            "-device",
            &format!("{balloon_dev},id=balloon0,deflate-on-oom=on"),
        ]);
    }
    let qmp = format!(
        "unix:{},server=on,wait=off",
        qmp_socket(l.run_dir).display()
    );
    push(&["-qmp", &qmp]);
    if l.incoming {
        push(&["-incoming", "defer"]);
    }
    a.into_iter().map(OsString::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(memory: Memory, incoming: bool) -> Vec<String> {
        args(&Launch {
            accel: Accel::Tcg,
            machine: Machine::Microvm,
            cpus: 1,
            memory_mib: 256,
            memory,
            image: Path::new("/img"),
            run_dir: Path::new("/run/x"),
            tsc_khz: 2_596_122,
            balloon: true,
            incoming,
        })
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect()
    }

    #[test]
    fn clone_maps_the_golden_private_and_read_only() {
        let golden = launch(Memory::GoldenShared("/dev/shm/g.mem".into()), false);
        let clone = launch(Memory::ClonePrivate("/dev/shm/g.mem".into()), true);
        assert!(golden
            .iter()
            .any(|a| a.ends_with("mem-path=/dev/shm/g.mem,share=on")));
        assert!(clone
            .iter()
            .any(|a| a.ends_with("mem-path=/dev/shm/g.mem,share=off,readonly=on,rom=off")));
        assert_eq!(clone.last().unwrap(), "defer");
        // Same devices, same order: only the backend and -incoming differ.
        let strip = |v: &[String]| -> Vec<String> {
            v.iter()
                .filter(|a| !a.contains("mem-path") && *a != "-incoming" && *a != "defer")
                .cloned()
                .collect()
        };
        assert_eq!(strip(&golden), strip(&clone));
    }

    #[test]
    fn cmdline_carries_tsc_and_silkd_args() {
        let a = launch(Memory::Anonymous, false);
        let append = &a[a.iter().position(|x| x == "-append").unwrap() + 1];
        assert!(append.contains("tsc_early_khz=2596122"));
        assert!(append.ends_with("-- --listen serial:silkd"));
        assert!(!a.iter().any(|x| x.contains("memory-backend")));
        assert!(a
            .iter()
            .any(|x| x.starts_with("virtio-balloon-device,id=balloon0,deflate-on-oom=on")));
        assert!(!a.iter().any(|x| x.contains("free-page-reporting=on")));
    }
}
