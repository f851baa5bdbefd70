//! Tests of the config rules in `validate.rs`: qemu `disk_mib` against `memory_mib`,
//! `template_disk` against the machine, `uid_block` against the range and the template's
//! user.

use super::*;

/// An image directory as `cargo xtask image` leaves it; `disk` adds a root disk
/// (`template.rootfs_image`), as `default` has.
fn image(disk: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["vmlinuz", "initramfs.cpio.gz", "rootfs.erofs"] {
        std::fs::write(dir.path().join(f), "x").unwrap();
    }
    std::fs::create_dir(dir.path().join("rootfs")).unwrap();
    let disk = if disk {
        r#""rootfs_image": "rootfs.erofs","#
    } else {
        ""
    };
    let manifest = format!(
        r#"{{"template": {{{disk} "user": {{"name": "user", "uid": 1000, "gid": 1000,
            "home": "/home/user"}}}}}}"#
    );
    std::fs::write(dir.path().join("manifest.json"), manifest).unwrap();
    dir
}

fn config(engine: &str, image: &Path, size: &str, process: &str) -> Result<Config> {
    Config::parse(&config_text(engine, image, size, process))
}

fn config_text(engine: &str, image: &Path, size: &str, process: &str) -> String {
    format!(
        r#"
        listen = "127.0.0.1:0"
        data_dir = "/tmp/sbx-validate"
        engine = "{engine}"
        [templates.t]
        image = "{}"
        [sizes.small]
        cpus = 1
        {size}
        [[pools]]
        template = "t"
        size = "small"
        [process]
        {process}
        "#,
        image.display()
    )
}

/// On qemu, a template with a root disk keeps its writable layer in guest RAM: a
/// size's disk_mib over half its memory_mib is refused (the default disk_mib of 512
/// with 256 MiB guests, the old `xtask up` config, included), with the reason.
#[test]
fn qemu_disk_mib_must_be_well_under_memory_mib() {
    let disk = image(true);
    for size in ["memory_mib = 256", "memory_mib = 256\ndisk_mib = 129"] {
        let err = config("qemu", disk.path(), size, "")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("disk_mib") && err.contains("half of memory_mib 256"),
            "{size}: {err}"
        );
    }
    config("qemu", disk.path(), "memory_mib = 256\ndisk_mib = 128", "").unwrap();
    // Without a root disk (base), disk_mib is unused on qemu; the process engine puts
    // the writable tmpfs in the host's memory under the cgroup's limit.
    config("qemu", image(false).path(), "memory_mib = 256", "").unwrap();
    config("process", disk.path(), "memory_mib = 256", "").unwrap();
}

/// virtio-pmem works on q35 only; blk on either machine.
#[test]
fn pmem_needs_q35() {
    let disk = image(true);
    let size = "memory_mib = 256\ndisk_mib = 64";
    let with = |qemu: &str| {
        let text = format!("[qemu]\n{qemu}\n");
        Config::parse(&config_text("qemu", disk.path(), size, "").replace("[process]", &text))
    };
    let err = with("template_disk = \"pmem\"").unwrap_err().to_string();
    assert!(err.contains("q35"), "{err}");
    with("template_disk = \"pmem\"\nmachine = \"q35\"").unwrap();
    with("template_disk = \"blk\"").unwrap();
    assert!(with("template_disk = \"nvme\"").is_err());
}

/// uid_block must fit the range, and hold the template's user.
#[test]
fn uid_block_must_fit_the_range_and_the_template_user() {
    let img = image(false);
    let size = "memory_mib = 256";
    for block in ["uid_block = 0", "uid_count = 1000\nuid_block = 1001"] {
        let err = config("process", img.path(), size, block)
            .unwrap_err()
            .to_string();
        assert!(err.contains("uid_block"), "{block}: {err}");
    }
    let err = config("process", img.path(), size, "uid_block = 1000")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"user\" (uid 1000") && err.contains("uid_block"),
        "{err}"
    );
    let c = config("process", img.path(), size, "uid_block = 1001").unwrap();
    assert_eq!(c.process.uid_block, 1001);
    assert_eq!(
        config("process", img.path(), size, "")
            .unwrap()
            .process
            .uid_block,
        65_536
    );
}

/// `[templates.NAME] detach_ring_bytes` is bounded on either engine, the error naming the
/// template, the key and the range; within bounds it reaches silkd's flags.
#[test]
fn detach_ring_bytes_is_bounded() {
    let img = image(true);
    let size = "memory_mib = 256\ndisk_mib = 64";
    for engine in ["process", "qemu"] {
        let with = |ring: &str| {
            let text = config_text(engine, img.path(), size, "").replace(
                "[sizes.small]",
                &format!("detach_ring_bytes = {ring}\n[sizes.small]"),
            );
            Config::parse(&text)
        };
        for bad in ["0", "1023", "67108865", "-1", "\"1MiB\""] {
            let err = with(bad).unwrap_err().to_string();
            assert!(err.contains("detach_ring_bytes"), "{engine} {bad}: {err}");
        }
        let err = with("0").unwrap_err().to_string();
        assert!(
            err.contains("template \"t\"") && err.contains("1024 to 67108864"),
            "{err}"
        );
        let c = with("65536").unwrap();
        let args = c.templates["t"].silkd_args();
        assert!(
            args.ends_with(&["--detach-ring".into(), "65536".into()]),
            "{args:?}"
        );
    }
}
