//! A template with a root disk on the qemu engine, real QEMU under TCG, the prebuilt
//! `default` image (Debian with Python, Node, git): every guest of the template shares
//! its `rootfs.erofs` as one read-only virtio-blk disk under a private, bounded overlay.
//! Clones of the golden run the template's programs; `/usr` is read-only, `/tmp` and the
//! home writable; what one sandbox writes no other sandbox or later claim sees; writing
//! past `disk_mib` is ENOSPC inside and harmless outside; no guest (golden, clones, a
//! guest writing its disk device) changes the image. The same with `[qemu]
//! template_disk = "pmem"`: the image as a DAX-mapped virtio-pmem region, left out of
//! the golden's state. Leftovers are counted.
//!
//! Needs `qemu-system-x86_64` and `target/images/default` (`cargo xtask image --template
//! default`, which `cargo xtask test` runs); it FAILS, naming what is missing, without
//! them. One daemon serves every check, to keep TCG boots few.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::procs::procs_with;
use testkit::vm_disk::{qemu_leftovers, sha256_file, template_image, QemuLeftovers};
use testkit::{Daemon, ROOT};

/// The writable layer, small enough to fill quickly under TCG.
const DISK_MIB: u64 = 48;

fn config(data: &Path, mem_dir: &Path, image: &Path) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
data_dir = "{data}"
api_token = "{ROOT}"
engine = "qemu"
# A stopped node leaves nothing (qemu_restart.rs covers "keep").
on_stop = "destroy"
boot_timeout_seconds = 90
warmup_timeout_seconds = 90

[qemu]
accel = "tcg"
memory_dir = "{mem}"

[templates.default]
image = "{image}"

[sizes.small]
cpus = 1
memory_mib = 384
disk_mib = {DISK_MIB}

[[pools]]
template = "default"
size = "small"
warm = 1
warm_max = 3
"#,
        data = data.display(),
        mem = mem_dir.display(),
        image = image.display(),
    )
}

/// Runs `sh -c script` as root (these checks are about what even root cannot do) and
/// returns the exec result (any exit code).
async fn sh(d: &Daemon, id: &str, token: &str, script: &str) -> Value {
    let r = d
        .exec(
            id,
            token,
            json!({ "argv": ["sh", "-c", script], "timeout_seconds": 240, "user": "root" }),
        )
        .await;
    assert_eq!(r.status, 200, "exec {script:?}: {}", r.text());
    r.json()
}

/// Runs `sh -c script`, which must exit 0, and returns its stdout.
async fn ok(d: &Daemon, id: &str, token: &str, script: &str) -> String {
    let v = sh(d, id, token, script).await;
    assert_eq!(v["exit_code"], 0, "{script:?}: {v}");
    v["stdout"].as_str().unwrap().to_string()
}

/// Every QEMU of this daemon is a clone: it maps the golden's memory private.
fn all_clones(data: &Path) -> usize {
    let pids = procs_with(&data.to_string_lossy());
    for pid in &pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.contains("share=off,readonly=on"),
            "a QEMU that is not a clone: {cmdline}"
        );
        assert!(
            cmdline.contains("format=raw,readonly=on,if=none,id=root"),
            "a QEMU without the read-only root disk: {cmdline}"
        );
    }
    pids.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_template_runs_from_one_shared_read_only_disk() {
    testkit::vm::require();
    let image = template_image("default");
    let disk = image.join("rootfs.erofs");
    let digest_before = sha256_file(&disk);
    let tmp = tempfile::tempdir().unwrap();
    let (data, mem_dir) = (tmp.path().join("data"), tmp.path().join("shm"));
    std::fs::create_dir(&mem_dir).unwrap();
    let none = QemuLeftovers {
        qemus: 0,
        run_dirs: 0,
    };
    assert_eq!(qemu_leftovers(&data), none);

    let d = Daemon::start_text(&data, &config(&data, &mem_dir, &image)).await;
    d.wait_pool(Duration::from_secs(300), "golden and 1 warm clone", |p| {
        p["golden"]["state"] == "ready" && p["warm"] == 1
    })
    .await;

    // 1. A clone of the golden runs the template's programs from its tree.
    let (a, ta) = d.claim().await;
    assert_eq!(ok(&d, &a, &ta, "python3 -c 'print(1)'").await, "1\n");
    ok(&d, &a, &ta, "node -e 0").await;
    let git = ok(&d, &a, &ta, "git --version").await;
    assert!(git.starts_with("git version "), "{git}");
    let mounts = ok(&d, &a, &ta, "cat /proc/mounts").await;
    assert!(
        mounts.lines().any(|l| l.starts_with("overlay / overlay ")),
        "/ is not the overlay: {mounts}"
    );
    // What PID 1 mounted before the switch came along: per-command cgroups, /proc, /dev.
    for mount in [
        " /sys/fs/cgroup cgroup2 ",
        " /proc proc ",
        " /dev/pts devpts ",
    ] {
        assert_eq!(
            mounts.matches(mount).count(),
            1,
            "{mount:?} in the new root: {mounts}"
        );
    }
    assert!(
        !mounts.contains(" /tmp tmpfs ") && !mounts.contains(" /run tmpfs "),
        "/tmp and /run must be the bounded layer's: {mounts}"
    );

    // 1b. Without `user`, commands run as the template's user, in its home, with the
    // template's programs, and its passwordless sudo works; it cannot write /usr.
    let r = d
        .exec(
            &a,
            &ta,
            json!({ "argv": ["sh", "-c", "whoami; pwd; echo $HOME; echo hi > ~/f && cat ~/f; \
                     python3 -c 'print(2)'; git --version >/dev/null && echo git; \
                     sudo -n id -u; echo x > /usr/planted || echo refused"],
                    "timeout_seconds": 240 }),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["stdout"],
        "user\n/home/user\n/home/user\nhi\n2\ngit\n0\nrefused\n",
        "{}",
        r.text()
    );

    // 2. /usr is read-only even to root; /tmp and root's home are writable.
    for target in ["/usr/bin/planted", "/usr/lib/python3/planted"] {
        let v = sh(&d, &a, &ta, &format!("echo x > {target}")).await;
        assert_ne!(v["exit_code"], 0, "wrote {target}: {v}");
        assert!(
            v["stderr"]
                .as_str()
                .unwrap()
                .contains("Read-only file system"),
            "{v}"
        );
    }
    assert_eq!(
        ok(
            &d,
            &a,
            &ta,
            "echo one > /tmp/a && echo two > /root/secret && cat /tmp/a /root/secret"
        )
        .await,
        "one\ntwo\n"
    );

    // 3. Attack: the guest writes its disk device and remounts its lower layer read-write.
    // The device is read-only at QEMU (and QEMU only holds a read-only fd).
    let v = sh(
        &d,
        &a,
        &ta,
        "dd if=/dev/zero of=/dev/vda bs=4096 count=16 conv=notrunc 2>&1; \
         mount -o remount,rw /.layers/lower 2>&1; blockdev --setrw /dev/vda 2>&1; \
         dd if=/dev/zero of=/dev/vda bs=4096 count=16 conv=notrunc,fsync 2>&1; echo done",
    )
    .await;
    assert!(v["stdout"].as_str().unwrap().ends_with("done\n"), "{v}");

    // 4. What one sandbox wrote, another does not see.
    let (b, tb) = d.claim().await;
    assert_eq!(
        ok(
            &d,
            &b,
            &tb,
            "test -e /root/secret && echo seen; test -e /tmp/a && echo seen; echo checked"
        )
        .await,
        "checked\n"
    );

    // 5. Writing past disk_mib: ENOSPC inside; the sandbox, and the node, carry on.
    let v = sh(
        &d,
        &b,
        &tb,
        &format!(
            "dd if=/dev/zero of=/tmp/fill bs=1M count={} 2>&1",
            DISK_MIB * 2
        ),
    )
    .await;
    assert_ne!(v["exit_code"], 0, "{v}");
    assert!(
        v["stdout"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{v}"
    );
    let v = sh(&d, &b, &tb, "echo more > /root/more").await;
    assert_ne!(v["exit_code"], 0, "the full layer took another write: {v}");
    assert_eq!(
        ok(
            &d,
            &b,
            &tb,
            "rm /tmp/fill && echo more > /root/more && cat /root/more"
        )
        .await,
        "more\n"
    );
    assert_eq!(ok(&d, &a, &ta, "cat /root/secret").await, "two\n");

    // 6. A new claim after both are released sees none of their files.
    for (id, tok) in [(&a, &ta), (&b, &tb)] {
        let r = d
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/release"),
                Some(tok),
                None,
            )
            .await;
        assert_eq!(r.status, 204);
    }
    let (c, tc) = d.claim().await;
    assert_eq!(
        ok(
            &d,
            &c,
            &tc,
            "for f in /root/secret /root/more /tmp/a /tmp/fill; do test -e $f && echo $f; done; \
             echo checked"
        )
        .await,
        "checked\n"
    );
    assert!(all_clones(&data) >= 1);

    d.stop().await;
    assert_eq!(qemu_leftovers(&data), none, "after shutdown");
    // 7. Golden, clones, their writes and the attack left the template's image as built.
    assert_eq!(sha256_file(&disk), digest_before, "rootfs.erofs changed");
}

/// `template_disk = "pmem"` (q35): the golden's state leaves the image out (it is a
/// shared RAM block, which x-ignore-shared skips), a clone restores from it and runs the
/// template's programs from the erofs mounted with DAX, and a guest writing the pmem
/// device changes neither what it reads nor the image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pmem_goldens_and_clones_restore_and_leave_the_image_unwritten() {
    testkit::vm::require();
    let image = template_image("default");
    let disk = image.join("rootfs.erofs");
    let digest_before = sha256_file(&disk);
    let tmp = tempfile::tempdir().unwrap();
    let (data, mem_dir) = (tmp.path().join("data"), tmp.path().join("shm"));
    std::fs::create_dir(&mem_dir).unwrap();
    let text = config(&data, &mem_dir, &image).replace(
        "[qemu]\n",
        "[qemu]\nmachine = \"q35\"\ntemplate_disk = \"pmem\"\n",
    );
    let d = Daemon::start_text(&data, &text).await;
    d.wait_pool(Duration::from_secs(300), "golden and 1 warm clone", |p| {
        p["golden"]["state"] == "ready" && p["warm"] == 1
    })
    .await;
    let image_bytes = std::fs::metadata(&disk).unwrap().len();
    let states = testkit::vm_disk::files_named(&data, "state.mig");
    assert_eq!(states.len(), 1, "{states:?}");
    let state_bytes = std::fs::metadata(&states[0]).unwrap().len();
    assert!(
        state_bytes < image_bytes / 16,
        "the golden's state ({state_bytes} bytes) carries the image ({image_bytes})"
    );

    let (a, ta) = d.claim().await;
    assert_eq!(ok(&d, &a, &ta, "python3 -c 'print(1)'").await, "1\n");
    // The lower layer's mount is outside the new root; the block devices and the kernel's
    // log (in the golden's RAM, so the clone's too) say what it is.
    let seen = ok(
        &d,
        &a,
        &ta,
        "ls /sys/block; dmesg | grep -o 'erofs: DAX enabled' | head -1",
    )
    .await;
    assert_eq!(
        seen, "pmem0\nerofs: DAX enabled\n",
        "not erofs with DAX on pmem0"
    );
    let v = sh(
        &d,
        &a,
        &ta,
        "timeout -s KILL 10 dd if=/dev/zero of=/dev/pmem0 bs=4096 count=16 conv=notrunc \
         2>/dev/null; echo write=$?; timeout -s KILL 10 dd if=/dev/zero of=/dev/pmem0 \
         bs=4096 seek=4096 count=16 conv=notrunc,fsync 2>/dev/null; echo flush=$?",
    )
    .await;
    eprintln!("pmem write attempts: {}", v["stdout"]);
    assert!(v["stdout"].as_str().unwrap().contains("flush="), "{v}");
    assert_eq!(
        ok(
            &d,
            &a,
            &ta,
            "python3 -c 'import json; print(2)' && git --version >/dev/null && echo ok"
        )
        .await,
        "2\nok\n"
    );
    for pid in procs_with(&data.to_string_lossy()) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.contains("share=on,readonly=on") && cmdline.contains("virtio-pmem-pci"),
            "a QEMU without the read-only pmem image: {cmdline}"
        );
    }
    d.stop().await;
    let none = QemuLeftovers {
        qemus: 0,
        run_dirs: 0,
    };
    assert_eq!(qemu_leftovers(&data), none, "after shutdown");
    assert_eq!(sha256_file(&disk), digest_before, "rootfs.erofs changed");
}
