//! `cargo xtask image` end to end: builds the image from the Debian mirror (the
//! package cache under target/images/cache makes reruns take seconds) and checks the
//! output against its manifest with code independent of the builder's: file digests,
//! the rootfs tree digest, the image digest, the module list and its order, and an
//! initramfs unpacked by busybox's cpio that matches the rootfs directory.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use xtask::image::{self, manifest::Manifest};

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Every entry below `root` as `relative path → description`, where a file is
/// `f <mode> <sha256>` and a link is `l <target>` (directories: `d`).
fn describe_tree(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let meta = fs::symlink_metadata(&path).unwrap();
            let description = if meta.file_type().is_symlink() {
                format!("l {}", fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                walk(root, &path, out);
                "d".to_string()
            } else {
                let mode = meta.permissions().mode() & 0o7777;
                format!("f {mode:o} {}", sha256_hex(&fs::read(&path).unwrap()))
            };
            out.insert(rel, description);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The rootfs tree digest as docs/image.md defines it.
fn rootfs_digest(tree: &BTreeMap<String, String>) -> String {
    let mut text = String::new();
    for (path, description) in tree {
        let line = match description.split_once(' ') {
            None => format!("d {path}\n"),
            Some(("l", target)) => format!("l {path} {target}\n"),
            Some(("f", mode_and_digest)) => format!("f {mode_and_digest} {path}\n"),
            Some(other) => panic!("unexpected description {other:?}"),
        };
        text.push_str(&line);
    }
    sha256_hex(text.as_bytes())
}

fn busybox_cpio(busybox: &Path, dir: &Path, args: &[&str], archive: &Path) -> String {
    let out = Command::new(busybox)
        .arg("cpio")
        .args(args)
        .arg("-F")
        .arg(archive)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "busybox cpio {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn build(out: PathBuf) -> Manifest {
    let args = image::Args {
        out: Some(out),
        ..image::Args::default()
    };
    image::build(&args).unwrap_or_else(|e| panic!("{}", xtask::error_chain(&e)))
}

#[test]
fn image_manifest_matches_its_files() {
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("base");
    let manifest = build(out.clone());

    let on_disk: Manifest =
        serde_json::from_slice(&fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(on_disk, manifest);
    assert_eq!(manifest.format, 1);
    // How commands run in base: templates/base.toml, as root in `/`, silkd as /init.
    let template = &manifest.template;
    assert_eq!(template.name, "base");
    assert_eq!(template.from, image::spec::Source::Busybox);
    assert_eq!(
        (template.silkd.as_str(), template.workdir.as_str()),
        ("/init", "/")
    );
    assert_eq!(
        (template.user.name.as_str(), template.user.uid),
        ("root", 0)
    );
    assert_eq!(
        (template.cache_key.as_ref(), template.rootfs_image.as_ref()),
        (None, None)
    );
    assert!(manifest.packages.is_empty());
    assert_eq!(
        manifest.kernel.package,
        format!("linux-image-{}", manifest.kernel.release)
    );

    // Artifact digests.
    let names: Vec<&str> = manifest.artifacts.keys().map(String::as_str).collect();
    assert_eq!(names, ["initramfs.cpio.gz", "rootfs", "vmlinuz"]);
    for file in ["vmlinuz", "initramfs.cpio.gz"] {
        let data = fs::read(out.join(file)).unwrap();
        assert_eq!(sha256_hex(&data), manifest.artifacts[file], "{file}");
    }
    let rootfs = out.join("rootfs");
    let tree = describe_tree(&rootfs);
    assert_eq!(rootfs_digest(&tree), manifest.artifacts["rootfs"]);
    let listing: String = manifest
        .artifacts
        .iter()
        .map(|(name, digest)| format!("{name} {digest}\n"))
        .collect();
    assert_eq!(
        manifest.image_digest,
        format!("sha256:{}", sha256_hex(listing.as_bytes()))
    );

    // /init is the static silkd; busybox and its applets are there.
    let silkd =
        xtask::workspace_root().join("target/static/x86_64-unknown-linux-gnu/release/silkd");
    assert_eq!(
        fs::read(rootfs.join("init")).unwrap(),
        fs::read(silkd).unwrap()
    );
    assert_eq!(tree["bin/sh"], "l /bin/busybox");
    assert!(tree["bin/busybox"].starts_with("f 755 "));

    // The module list: same lines in the file silkd reads and in the manifest, every
    // module present, each after the modules its .modinfo says it depends on.
    let list = fs::read_to_string(rootfs.join("etc/silkd/modules")).unwrap();
    let listed: Vec<String> = list.lines().map(str::to_string).collect();
    assert_eq!(listed, manifest.modules);
    let prefix = format!("/lib/modules/{}/", manifest.kernel.release);
    let mut loaded: Vec<String> = Vec::new();
    for path in &listed {
        assert!(path.starts_with(&prefix), "{path}");
        let bytes = fs::read(rootfs.join(&path[1..])).unwrap();
        let info = xtask::image::kmod::modinfo(&bytes).unwrap();
        for (_, depends) in info.iter().filter(|(key, _)| key == "depends") {
            for dep in depends.split(',').filter(|d| !d.is_empty()) {
                assert!(
                    loaded.iter().any(|l| l == &dep.replace('-', "_")),
                    "{path} needs {dep}, which is not loaded before it"
                );
            }
        }
        let name = Path::new(path).file_stem().unwrap().to_string_lossy();
        loaded.push(name.replace('-', "_"));
    }
    for needed in [
        "virtio_mmio",
        "virtio_pci",
        "virtio_console",
        "virtio_balloon",
    ] {
        assert!(
            loaded.iter().any(|l| l == needed),
            "{needed} missing from {loaded:?}"
        );
    }

    // The initramfs, unpacked by busybox's cpio, holds exactly the rootfs plus
    // /dev/console.
    let mut cpio = Vec::new();
    flate2::read::GzDecoder::new(fs::File::open(out.join("initramfs.cpio.gz")).unwrap())
        .read_to_end(&mut cpio)
        .unwrap();
    let archive = scratch.path().join("initramfs.cpio");
    fs::write(&archive, &cpio).unwrap();
    let busybox = rootfs.join("bin/busybox");
    let unpacked = scratch.path().join("unpacked");
    fs::create_dir(&unpacked).unwrap();
    let names = busybox_cpio(&busybox, &unpacked, &["-t"], &archive);
    let mut names: Vec<&str> = names.lines().collect();
    let mut expected: Vec<&str> = tree.keys().map(String::as_str).collect();
    expected.push("dev/console");
    expected.sort_unstable();
    names.sort_unstable();
    assert_eq!(names, expected);
    // Everything but the device node, which needs root to create.
    let mut extract = vec!["-i", "-d"];
    extract.extend(names.iter().filter(|n| **n != "dev/console"));
    busybox_cpio(&busybox, &unpacked, &extract, &archive);
    assert_eq!(describe_tree(&unpacked), tree);
    let verbose = busybox_cpio(&busybox, &unpacked, &["-t", "-v", "dev/console"], &archive);
    assert!(verbose.starts_with("crw-------"), "{verbose}");

    // A second build, from the cache, gives the same bytes.
    let again = build(scratch.path().join("again"));
    assert_eq!(again, manifest);
}
