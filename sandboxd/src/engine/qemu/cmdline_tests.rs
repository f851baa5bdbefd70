//! Tests of `cmdline.rs`: golden, clone and cold boots, root disks (virtio-blk and
//! virtio-pmem), the kernel command line.

use super::*;

fn launch(memory: Memory, incoming: bool) -> Vec<String> {
    args(&Launch {
        accel: Accel::Tcg,
        machine: Machine::Microvm,
        cpus: 1,
        memory_mib: 256,
        memory,
        run_dir: Path::new("/run/a,b"),
        tsc_khz: 2_596_122,
        balloon: true,
        incoming,
        disk: None,
        silkd_args: &[],
    })
    .into_iter()
    .map(|s| s.into_string().unwrap())
    .collect()
}

#[test]
fn clone_maps_the_golden_private_and_read_only() {
    let golden = launch(Memory::GoldenShared, false);
    let clone = launch(Memory::ClonePrivate, true);
    assert!(golden
        .iter()
        .any(|a| a.ends_with("mem-path=/proc/self/fd/8,share=on")));
    assert!(clone
        .iter()
        .any(|a| a.ends_with("mem-path=/proc/self/fd/8,share=off,readonly=on,rom=off")));
    assert_eq!(clone.last().unwrap(), "defer");
    // A restoring QEMU boots nothing, so it gets no initramfs.
    assert!(golden.iter().any(|a| a == "-initrd"));
    assert!(!clone.iter().any(|a| a == "-initrd"));
    // Same devices, same order: only the backend, -incoming and the initramfs differ.
    let strip = |v: &[String]| -> Vec<String> {
        v.iter()
            .filter(|a| {
                !a.contains("mem-path")
                    && !["-incoming", "defer", "-initrd", "/proc/self/fd/7"].contains(&a.as_str())
            })
            .cloned()
            .collect()
    };
    assert_eq!(strip(&golden), strip(&clone));
}

#[test]
fn qemu_is_sandboxed_and_opens_nothing_by_path() {
    let a = launch(Memory::Anonymous, false);
    assert_eq!(a[0..2], ["-sandbox", SANDBOX]);
    assert_eq!(a[3], "guest=/run/a,,b", "commas escaped");
    for (i, arg) in a.iter().enumerate() {
        if ["-kernel", "-initrd"].contains(&arg.as_str()) {
            assert!(a[i + 1].starts_with("/proc/self/fd/"), "{arg} {}", a[i + 1]);
        }
        assert!(!arg.contains("path=/run"), "a path QEMU would open: {arg}");
    }
    assert!(a.iter().any(|x| x == "tcg,tb-size=64"));
    let cpu = a.iter().position(|x| x == "-cpu").expect("-cpu");
    assert_eq!(
        a[cpu + 1],
        "qemu64,+arat",
        "ARAT, so the idle guest goes tickless"
    );
}

#[test]
fn template_flags_follow_silkd_s_own_and_whitespace_is_quoted() {
    let flags: Vec<String> = ["--user", "user", "--env", "GREETING=hello there"]
        .map(String::from)
        .to_vec();
    let disk = RootDisk {
        disk_mib: 64,
        kind: TemplateDisk::Blk,
        bytes: 0,
    };
    let line = kernel_cmdline(1, Some(&disk), &flags);
    assert!(
        line.ends_with(
            "-- --listen serial:silkd --root-disk /dev/vda --disk-mib 64 \
             --user user --env \"GREETING=hello there\""
        ),
        "{line}"
    );
}

#[test]
fn a_root_disk_is_one_read_only_fd_named_to_silkd() {
    let args = |memory, incoming| -> Vec<String> {
        super::args(&Launch {
            accel: Accel::Tcg,
            machine: Machine::Microvm,
            cpus: 1,
            memory_mib: 512,
            memory,
            run_dir: Path::new("/run/x"),
            tsc_khz: 1,
            balloon: true,
            incoming,
            disk: Some(RootDisk {
                disk_mib: 300,
                kind: TemplateDisk::Blk,
                bytes: 3 << 20,
            }),
            silkd_args: &[],
        })
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect()
    };
    let golden = args(Memory::GoldenShared, false);
    let clone = args(Memory::ClonePrivate, true);
    let drive = &golden[golden.iter().position(|x| x == "-drive").unwrap() + 1];
    assert!(drive.starts_with("file=/proc/self/fd/10,format=raw,readonly=on,"));
    assert!(golden.iter().any(|x| x == "virtio-blk-device,drive=root"));
    let append = &golden[golden.iter().position(|x| x == "-append").unwrap() + 1];
    assert!(append.ends_with("-- --listen serial:silkd --root-disk /dev/vda --disk-mib 300"));
    // The clone's disk is attached exactly as the golden's was.
    let disk = |v: &[String]| -> Vec<String> {
        v.iter()
            .filter(|a| a.contains("drive") || a.contains("disk"))
            .cloned()
            .collect()
    };
    assert_eq!(disk(&golden), disk(&clone));
    let base = launch(Memory::GoldenShared, false);
    assert!(!base
        .iter()
        .any(|x| x == "-drive" || x.contains("virtio-blk")));
}

/// `template_disk = "pmem"`: the image is a read-only shared memory backend behind a
/// virtio-pmem device (room for it in maxmem), silkd mounts /dev/pmem0, and a clone
/// attaches it exactly as its golden did; no virtio-blk drive.
#[test]
fn a_pmem_root_disk_is_a_shared_read_only_memory_region() {
    let args = |memory, incoming| -> Vec<String> {
        super::args(&Launch {
            accel: Accel::Tcg,
            machine: Machine::Q35,
            cpus: 1,
            memory_mib: 512,
            memory,
            run_dir: Path::new("/run/x"),
            tsc_khz: 1,
            balloon: true,
            incoming,
            disk: Some(RootDisk {
                disk_mib: 200,
                kind: TemplateDisk::Pmem,
                bytes: 4 << 20,
            }),
            silkd_args: &[],
        })
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect()
    };
    let golden = args(Memory::GoldenShared, false);
    let clone = args(Memory::ClonePrivate, true);
    let at = |v: &[String], flag: &str, with: &str| -> String {
        v.windows(2)
            .find(|w| w[0] == flag && w[1].contains(with))
            .map(|w| w[1].clone())
            .unwrap_or_default()
    };
    assert_eq!(at(&golden, "-m", "M"), "512M,slots=1,maxmem=516M");
    assert_eq!(
        at(&golden, "-object", "rootimg"),
        "memory-backend-file,id=rootimg,mem-path=/proc/self/fd/10,size=4194304,\
         share=on,readonly=on"
    );
    assert!(golden
        .iter()
        .any(|x| x == "virtio-pmem-pci,memdev=rootimg,id=pmem0"));
    assert!(!golden.iter().any(|x| x == "-drive"));
    assert!(at(&golden, "-append", "").ends_with("--root-disk /dev/pmem0 --disk-mib 200"));
    for flag in ["-m", "-object", "-device", "-append"] {
        assert_eq!(
            at(&golden, flag, "pmem"),
            at(&clone, flag, "pmem"),
            "{flag}"
        );
    }
    assert_eq!(
        at(&golden, "-object", "rootimg"),
        at(&clone, "-object", "rootimg")
    );
}

#[test]
fn cmdline_carries_tsc_and_silkd_args() {
    let a = launch(Memory::Anonymous, false);
    let append = &a[a.iter().position(|x| x == "-append").unwrap() + 1];
    assert!(append.contains("tsc_early_khz=2596122"));
    assert!(append.ends_with("-- --listen serial:silkd"));
    // Anonymous, but named `mem` like a golden's, so a cold boot's stream fits a
    // snapshot helper.
    assert!(a.iter().any(|x| x == "memory-backend-ram,id=mem,size=256M"));
    assert!(a
        .iter()
        .any(|x| x.starts_with("virtio-balloon-device,id=balloon0,deflate-on-oom=on")));
    assert!(!a.iter().any(|x| x.contains("free-page-reporting=on")));
}
