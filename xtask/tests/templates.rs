//! Templates end to end, as root (mmdebstrap's root mode, chroot, owners): a small
//! Debian template built twice from the mirror gives the same image digest and a
//! manifest that matches its tree, and a rebuild is a cache hit; an OCI image layout
//! and a `docker save` archive, made here from busybox-static (no registry is
//! reachable), import with their whiteouts and config, and run a command of the image
//! in a real process-engine sandbox of it.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};
use xtask::image::{self, manifest::Manifest, spec::Source};

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn args(template: &str, out: &Path) -> image::Args {
    image::Args {
        template: template.into(),
        out: Some(out.to_path_buf()),
        ..image::Args::default()
    }
}

fn build(args: &image::Args) -> Manifest {
    image::build(args).unwrap_or_else(|e| panic!("{}", xtask::error_chain(&e)))
}

fn static_silkd() -> Vec<u8> {
    fs::read(xtask::workspace_root().join("target/static/x86_64-unknown-linux-gnu/release/silkd"))
        .unwrap()
}

/// Every entry below `root` as `path → (kind, mode, uid, gid, content digest or link)`.
fn listing(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let what = if meta.file_type().is_symlink() {
                format!("l {}", fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                pending.push(path.clone());
                "d".to_string()
            } else if meta.is_file() {
                format!("f {}", sha256_hex(&fs::read(&path).unwrap()))
            } else {
                // Device nodes (mmdebstrap's /dev): never read, /dev/zero has no end.
                format!("special {:o} {}", meta.mode() & 0o170000, meta.rdev())
            };
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let mode = meta.mode() & 0o7777;
            out.insert(
                rel,
                format!("{what} {mode:o} {}:{}", meta.uid(), meta.gid()),
            );
        }
    }
    out
}

/// The artifacts of a Debian or OCI template, checked against the manifest.
fn check_artifacts(out: &Path, manifest: &Manifest) {
    let names: Vec<&str> = manifest.artifacts.keys().map(String::as_str).collect();
    assert_eq!(names, ["initramfs.cpio.gz", "rootfs.erofs", "vmlinuz"]);
    for name in names {
        let data = fs::read(out.join(name)).unwrap();
        assert_eq!(sha256_hex(&data), manifest.artifacts[name], "{name}");
    }
    let on_disk: Manifest =
        serde_json::from_slice(&fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(&on_disk, manifest);
    assert_eq!(manifest.template.silkd, "/.silkd/silkd");
    assert_eq!(
        manifest.template.rootfs_image.as_deref(),
        Some("rootfs.erofs")
    );
    let silkd = out.join("rootfs/.silkd/silkd");
    assert_eq!(fs::read(&silkd).unwrap(), static_silkd());
    assert_eq!(fs::metadata(&silkd).unwrap().mode() & 0o7777, 0o755);
    // The erofs image really is one (its superblock magic at offset 1024).
    let image = fs::read(out.join("rootfs.erofs")).unwrap();
    assert_eq!(image[1024..1028], 0xE0F5_E1E2u32.to_le_bytes());
}

/// The staging and leftover directories `image` may create next to `out`.
fn siblings(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

const TINY: &str = r#"
description = "test template: minbase plus busybox"
from = "debian"
packages = ["busybox"]
workdir = "/work"

[[files]]
src = "files/motd"
dest = "/etc/motd"
mode = 0o600

[[files]]
src = "files/profile"
dest = "/home/agent/.profile"
mode = 0o644

[env]
FOO = "bar"

[user]
name = "agent"
uid = 1001
home = "/home/agent"
"#;

#[test]
fn a_small_debian_template_is_reproducible_cached_and_matches_its_manifest() {
    let scratch = tempfile::tempdir().unwrap();
    let templates = scratch.path().join("templates");
    fs::create_dir_all(templates.join("files")).unwrap();
    fs::write(templates.join("tiny.toml"), TINY).unwrap();
    fs::write(templates.join("files/motd"), "hello from the template\n").unwrap();
    fs::write(templates.join("files/profile"), "export PS1='$ '\n").unwrap();
    let images = scratch.path().join("images");
    fs::create_dir(&images).unwrap();
    let with = |out: &str| image::Args {
        templates: templates.clone(),
        ..args("tiny", &images.join(out))
    };

    let first = build(&with("a"));
    let second = build(&with("b"));
    assert_eq!(first.image_digest, second.image_digest);
    assert_eq!(first, second);
    let out = images.join("a");
    check_artifacts(&out, &first);
    assert_eq!(
        listing(&out.join("rootfs")),
        listing(&images.join("b/rootfs"))
    );

    // The manifest: the template's metadata and the tree's exact package versions.
    let t = &first.template;
    assert_eq!((t.name.as_str(), t.from), ("tiny", Source::Debian));
    assert_eq!(
        (t.user.name.as_str(), t.user.uid, t.user.gid),
        ("agent", 1001, 1001)
    );
    assert_eq!(
        (t.user.home.as_str(), t.user.shell.as_str()),
        ("/home/agent", "/bin/sh")
    );
    assert_eq!(
        (t.workdir.as_str(), t.env["FOO"].as_str()),
        ("/work", "bar")
    );
    assert!(!t.user.sudo);
    let dpkg = Command::new("dpkg-query")
        .arg(format!(
            "--admindir={}",
            out.join("rootfs/var/lib/dpkg").display()
        ))
        .args([
            "-W",
            "-f",
            "${Package} ${Version}\n",
            "busybox",
            "apt",
            "dpkg",
        ])
        .output()
        .unwrap();
    assert!(dpkg.status.success());
    for line in String::from_utf8(dpkg.stdout).unwrap().lines() {
        let (name, version) = line.split_once(' ').unwrap();
        assert!(
            first
                .packages
                .iter()
                .any(|p| p.package == name && p.version == version),
            "{line} not in the manifest"
        );
    }
    assert!(
        first.packages.len() > 50,
        "{} packages",
        first.packages.len()
    );

    // The tree: files with their modes and owners, the user, the working directory,
    // fixed host files.
    let rootfs = out.join("rootfs");
    let tree = listing(&rootfs);
    let motd = sha256_hex(b"hello from the template\n");
    assert_eq!(tree["etc/motd"], format!("f {motd} 600 0:0"));
    assert!(tree["home/agent/.profile"].ends_with(" 644 1001:1001"));
    assert_eq!(tree["home/agent"].split(' ').nth(2), Some("1001:1001"));
    assert_eq!(tree["work"], "d 755 1001:1001");
    let passwd = fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd.contains("agent:x:1001:1001::/home/agent:/bin/sh\n"),
        "{passwd}"
    );
    assert_eq!(
        fs::read_to_string(rootfs.join("etc/hostname")).unwrap(),
        "sandbox\n"
    );
    assert_eq!(
        fs::read_to_string(rootfs.join("etc/resolv.conf")).unwrap(),
        ""
    );
    // The package is really there and runs.
    let run = Command::new("chroot")
        .arg(&rootfs)
        .args(["busybox", "cat", "/etc/motd"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "hello from the template\n"
    );

    // Unchanged inputs: nothing is rebuilt (the image file is the same inode).
    let inode = fs::metadata(out.join("rootfs.erofs")).unwrap().ino();
    assert_eq!(build(&with("a")), first);
    assert_eq!(fs::metadata(out.join("rootfs.erofs")).unwrap().ino(), inode);
    // A package that does not exist is named, and nothing is left behind.
    let before = siblings(&images);
    fs::write(
        templates.join("bad.toml"),
        TINY.replace("\"busybox\"", "\"silk-no-such-package\""),
    )
    .unwrap();
    let e = image::build(&image::Args {
        templates: templates.clone(),
        ..args("bad", &images.join("bad"))
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`silk-no-such-package`") && e.contains("apt-get update"),
        "{e}"
    );
    assert_eq!(siblings(&images), before);
}

/// A tar archive (uncompressed) of `entries`: `(path, content)` files and, for content
/// `None`, directories; paths ending in a whiteout name are empty files.
fn tar_of(entries: &[(&str, Option<&[u8]>, u32)], links: &[(&str, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, content, mode) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mode(*mode);
        header.set_uid(0);
        header.set_gid(0);
        match content {
            Some(data) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, path, *data).unwrap();
            }
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, path, &[][..]).unwrap();
            }
        }
    }
    for (path, target) in links {
        let mut header = tar::Header::new_gnu();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mode(0o777);
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        builder.append_link(&mut header, path, target).unwrap();
    }
    builder.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// busybox-static from the image's package cache (fetched if a base build has not).
fn busybox() -> Vec<u8> {
    let package = image::apt::candidate(image::BUSYBOX).unwrap();
    let cache = image::apt::Cache::new(&image::Args::default().cache);
    let (dir, _) = cache.unpack(&package).unwrap();
    fs::read(dir.join("bin/busybox")).unwrap()
}

/// The two layers: busybox, a user and some files; then whiteouts and a new file.
fn layers() -> (Vec<u8>, Vec<u8>) {
    let busybox = busybox();
    let passwd = b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n";
    let first = tar_of(
        &[
            ("bin/busybox", Some(&busybox), 0o755),
            ("etc/passwd", Some(passwd), 0o644),
            ("etc/group", Some(b"root:x:0:\napp:x:1000:\n"), 0o644),
            ("etc/old", Some(b"old"), 0o644),
            ("home/app", None, 0o755),
            ("opt/lower/x", Some(b"x"), 0o644),
        ],
        &[("bin/sh", "busybox"), ("bin/cat", "/bin/busybox")],
    );
    let second = tar_of(
        &[
            ("etc/.wh.old", Some(b""), 0o644),
            ("opt/lower/.wh..wh..opq", Some(b""), 0o644),
            ("opt/lower/new", Some(b"new"), 0o644),
            ("etc/greeting", Some(b"hello from layer 2\n"), 0o644),
        ],
        &[],
    );
    (first, gzip(&second))
}

const CONFIG: &str = r#"{"architecture":"amd64","os":"linux",
  "config":{"Env":["PATH=/bin","GREETING=hi"],"WorkingDir":"/home/app","User":"app"},
  "rootfs":{"type":"layers","diff_ids":[]}}"#;

/// An OCI image layout directory holding `layers()` and [`CONFIG`].
fn oci_layout(dir: &Path) {
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    let put = |data: &[u8]| {
        let digest = sha256_hex(data);
        fs::write(blobs.join(&digest), data).unwrap();
        (format!("sha256:{digest}"), data.len())
    };
    let (first, second) = layers();
    let (l1, s1) = put(&first);
    let (l2, s2) = put(&second);
    let (config, config_size) = put(CONFIG.as_bytes());
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
        "config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config}","size":{config_size}}},
        "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{l1}","size":{s1}}},
                  {{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{l2}","size":{s2}}}]}}"#
    );
    let (manifest, manifest_size) = put(manifest.as_bytes());
    fs::write(
        dir.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json",
            "digest":"{manifest}","size":{manifest_size},"platform":{{"architecture":"amd64","os":"linux"}}}}]}}"#
        ),
    )
    .unwrap();
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

/// A `docker save` archive (the classic layout) of the same image.
fn docker_archive(path: &Path) {
    let (first, second) = layers();
    let manifest = r#"[{"Config":"config.json","RepoTags":["test:1"],
        "Layers":["one/layer.tar","two/layer.tar"]}]"#;
    let archive = tar_of(
        &[
            ("manifest.json", Some(manifest.as_bytes()), 0o644),
            ("config.json", Some(CONFIG.as_bytes()), 0o644),
            ("one/layer.tar", Some(&first), 0o644),
            ("two/layer.tar", Some(&second), 0o644),
        ],
        &[],
    );
    fs::write(path, archive).unwrap();
}

fn check_imported(out: &Path, manifest: &Manifest) {
    check_artifacts(out, manifest);
    let t = &manifest.template;
    assert_eq!((t.name.as_str(), t.from), ("imported", Source::Oci));
    assert_eq!(
        (t.user.name.as_str(), t.user.uid, t.user.gid),
        ("app", 1000, 1000)
    );
    assert_eq!(
        (t.workdir.as_str(), t.user.home.as_str()),
        ("/home/app", "/home/app")
    );
    assert_eq!(t.env.get("GREETING").map(String::as_str), Some("hi"));
    assert_eq!(t.env.get("PATH").map(String::as_str), Some("/bin"));
    let rootfs = out.join("rootfs");
    assert!(!rootfs.join("etc/old").exists(), "whiteout not applied");
    assert!(
        !rootfs.join("opt/lower/x").exists(),
        "opaque directory not applied"
    );
    assert_eq!(fs::read(rootfs.join("opt/lower/new")).unwrap(), b"new");
}

/// A command from the imported image runs in a sandbox of it: a real sandboxd (process
/// engine) with `[templates.X] image =` the import, as the image config's user, in its
/// workdir, with its env.
fn runs_in_a_sandbox(image: &Path) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let d = testkit::Daemon::start(testkit::Setup {
            image: Some(image.to_path_buf()),
            ..testkit::Setup::default()
        })
        .await;
        let (id, token) = d.claim().await;
        let script = "cat /etc/greeting; id -u; pwd; echo $GREETING; echo hi > ~/f && cat ~/f";
        let r = d
            .exec(
                &id,
                &token,
                serde_json::json!({"argv": ["sh", "-c", script]}),
            )
            .await;
        let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
        assert_eq!(
            (v["exit_code"].as_i64(), v["stdout"].as_str()),
            (
                Some(0),
                Some("hello from layer 2\n1000\n/home/app\nhi\nhi\n")
            ),
            "{v}"
        );
        d.stop().await;
    });
}

#[test]
fn oci_layouts_and_docker_save_archives_import_with_whiteouts_and_config() {
    let scratch = tempfile::tempdir().unwrap();
    let layout = scratch.path().join("layout");
    oci_layout(&layout);
    let images = scratch.path().join("images");
    fs::create_dir(&images).unwrap();
    let import = |source: &Path, out: &str| image::Args {
        from_oci: Some(source.to_path_buf()),
        ..args("imported", &images.join(out))
    };

    let from_layout = build(&import(&layout, "oci"));
    check_imported(&images.join("oci"), &from_layout);
    runs_in_a_sandbox(&images.join("oci"));
    let archive = scratch.path().join("saved.tar");
    docker_archive(&archive);
    let from_docker = build(&import(&archive, "docker"));
    check_imported(&images.join("docker"), &from_docker);
    assert_eq!(
        listing(&images.join("oci/rootfs")),
        listing(&images.join("docker/rootfs"))
    );

    // The same image again: cached, nothing rewritten.
    let image_file = images.join("oci/rootfs.erofs");
    let inode = fs::metadata(&image_file).unwrap().ino();
    assert_eq!(build(&import(&layout, "oci")), from_layout);
    assert_eq!(fs::metadata(&image_file).unwrap().ino(), inode);

    // Hostile images fail with a reason and leave nothing next to the output.
    let before = siblings(&images);
    let evil_index = scratch.path().join("evil-index");
    oci_layout(&evil_index);
    let index = fs::read_to_string(evil_index.join("index.json")).unwrap();
    let start = index.find("sha256:").unwrap();
    let index = format!(
        "{}sha256:../../../../etc/passwd{}",
        &index[..start],
        &index[start + 71..]
    );
    fs::write(evil_index.join("index.json"), index).unwrap();
    let e = image::build(&import(&evil_index, "evil"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not sha256:<64 hex>"), "{e}");

    let evil_layer = scratch.path().join("evil-layer.tar");
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..9].copy_from_slice(b"../escape");
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(1);
    header.set_mode(0o644);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, &b"x"[..]).unwrap();
    let layer = builder.into_inner().unwrap();
    let manifest = r#"[{"Config":"config.json","Layers":["l/layer.tar"]}]"#;
    fs::write(
        &evil_layer,
        tar_of(
            &[
                ("manifest.json", Some(manifest.as_bytes()), 0o644),
                ("config.json", Some(CONFIG.as_bytes()), 0o644),
                ("l/layer.tar", Some(&layer), 0o644),
            ],
            &[],
        ),
    )
    .unwrap();
    let e = image::build(&import(&evil_layer, "evil"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("climbs with `..`"), "{e}");
    assert_eq!(siblings(&images), before);
    assert!(!images.join("escape").exists() && !scratch.path().join("escape").exists());
}
