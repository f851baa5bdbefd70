//! `cargo xtask image`: the guest image, from Debian packages only. Fetches the cloud
//! kernel and busybox-static (cached by version), takes the static silkd as `/init`,
//! and writes `vmlinuz`, `initramfs.cpio.gz`, `rootfs/` and `manifest.json` into the
//! output directory, replacing the previous image only once the new one is complete.
//! docs/image.md describes the layout and the contract with silkd's PID-1 code.

pub mod apt;
pub mod kmod;
pub mod manifest;
pub mod tree;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};

use crate::{silkd, tool, workspace_root, Error, Result};
use apt::{Cache, Fetched, Package};
use manifest::Manifest;
use tree::Tree;

/// The meta package whose dependency names the real, versioned kernel package.
pub const KERNEL_META: &str = "linux-image-cloud-amd64";
pub const BUSYBOX: &str = "busybox-static";
/// silkd reads this list at boot and loads each module, in order, with finit_module.
pub const MODULES_LIST: &str = "etc/silkd/modules";

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Where the image goes.
    #[arg(long, default_value_os_t = default_out())]
    pub out: PathBuf,
    /// Downloaded and unpacked packages, reused across runs.
    #[arg(long, default_value_os_t = default_cache())]
    pub cache: PathBuf,
    /// Use this silkd binary instead of building the static one.
    #[arg(long)]
    pub silkd: Option<PathBuf>,
}

/// What `cargo xtask image` with no flags does (the test gate and `up` use it).
impl Default for Args {
    fn default() -> Self {
        Args {
            out: default_out(),
            cache: default_cache(),
            silkd: None,
        }
    }
}

/// `target/images/base`: where sandboxd's qemu tests and `cargo xtask up` look.
pub fn default_out() -> PathBuf {
    workspace_root().join("target/images/base")
}

fn default_cache() -> PathBuf {
    workspace_root().join("target/images/cache")
}

pub fn run(args: &Args) -> Result<()> {
    let manifest = build(args)?;
    eprintln!(
        "image: {} (kernel {}, image {})",
        args.out.display(),
        manifest.kernel.release,
        manifest.image_digest
    );
    println!("{}", args.out.display());
    Ok(())
}

/// Builds the image into `args.out` and returns its manifest.
pub fn build(args: &Args) -> Result<Manifest> {
    let started = Instant::now();
    let step = |what: &str| eprintln!("image: [{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    tool::require(&["apt-cache", "apt-get", "dpkg-deb"])?;

    step("resolving packages");
    let meta = apt::candidate(KERNEL_META)?;
    let kernel_name = apt::depends_names(&meta)
        .into_iter()
        .find(|dep| dep.starts_with("linux-image-") && dep != KERNEL_META)
        .ok_or_else(|| Error::Package {
            package: KERNEL_META.into(),
            reason: format!("no linux-image-* dependency in `Depends: {}`", meta.depends),
        })?;
    let kernel = apt::candidate(&kernel_name)?;
    let busybox = apt::candidate(BUSYBOX)?;

    let cache = Cache::new(&args.cache);
    let mut unpacked = Vec::new();
    for package in [&kernel, &busybox] {
        step(&format!("fetching {} {}", package.name, package.version));
        let (dir, fetched) = cache.unpack(package)?;
        if let Fetched::Cached = fetched {
            step(&format!("  cached: {}", dir.display()));
        }
        unpacked.push(dir);
    }
    let (kernel_dir, busybox_dir) = (&unpacked[0], &unpacked[1]);

    let silkd_path = match &args.silkd {
        Some(path) => path.clone(),
        None => {
            step("building static silkd");
            silkd::build_static()?
        }
    };

    let release = kernel_release(&kernel)?;
    let modules_dir = kernel_dir.join("lib/modules").join(&release);
    step(&format!("resolving kernel modules of {release}"));
    let modules = kmod::load_order(&modules_dir, kmod::WANTED)?;
    step(&format!(
        "  load order: {}",
        modules
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    ));

    step("assembling the file tree");
    let busybox_bin = busybox_dir.join("bin/busybox");
    let mut tree = Tree::default();
    base_layout(&mut tree);
    tree.file("init", read(&silkd_path, "reading silkd")?, 0o755);
    tree.file("bin/busybox", read(&busybox_bin, "reading busybox")?, 0o755);
    let applets = tool::output(Command::new(&busybox_bin).arg("--list-full"))?;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        // `--list-full` gives each applet's usual place: bin/sh, usr/bin/awk, sbin/ip.
        // `linuxrc` is busybox's init under another name, at the root; the kernel
        // runs /init (silkd) and nothing should suggest otherwise.
        if applet != "linuxrc" && !tree.contains(applet) {
            tree.symlink(applet, "/bin/busybox");
        }
    }
    let mut module_paths = Vec::new();
    for module in &modules {
        let inside = format!("lib/modules/{release}/{}", module.rel_path.display());
        let data = read(&modules_dir.join(&module.rel_path), "reading kernel module")?;
        tree.file(&inside, data, 0o644);
        module_paths.push(format!("/{inside}"));
    }
    let list: String = module_paths.iter().map(|p| format!("{p}\n")).collect();
    tree.file(MODULES_LIST, list.into_bytes(), 0o644);

    let staging = sibling(&args.out, "new")?;
    apt::recreate_dir(&staging)?;

    step("writing vmlinuz");
    let vmlinuz_src = kernel_dir.join(format!("boot/vmlinuz-{release}"));
    let vmlinuz = read(&vmlinuz_src, "reading the kernel image")?;
    write(&staging.join("vmlinuz"), &vmlinuz)?;

    step("writing initramfs.cpio.gz");
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    tree.write_cpio(&mut gz)
        .and_then(|()| gz.flush())
        .map_err(Error::io("compressing the initramfs", &staging))?;
    let initramfs = gz
        .finish()
        .map_err(Error::io("compressing the initramfs", &staging))?;
    write(&staging.join("initramfs.cpio.gz"), &initramfs)?;

    step("writing rootfs/");
    tree.write_dir(&staging.join("rootfs"))?;

    let artifacts = BTreeMap::from([
        (
            "initramfs.cpio.gz".to_string(),
            hex::encode(Sha256::digest(&initramfs)),
        ),
        ("rootfs".to_string(), tree.rootfs_digest()),
        ("vmlinuz".to_string(), hex::encode(Sha256::digest(&vmlinuz))),
    ]);
    let manifest = Manifest {
        format: manifest::FORMAT,
        kernel: manifest::Kernel {
            package: kernel.name.clone(),
            version: kernel.version.clone(),
            release,
        },
        busybox: manifest::PackageVersion {
            package: busybox.name.clone(),
            version: busybox.version.clone(),
        },
        modules: module_paths,
        image_digest: format!("sha256:{}", manifest::image_digest(&artifacts)),
        artifacts,
    };
    let json = serde_json::to_string_pretty(&manifest).expect("a manifest always serializes");
    write(
        &staging.join("manifest.json"),
        format!("{json}\n").as_bytes(),
    )?;

    replace_dir(&staging, &args.out)?;
    step(&format!(
        "done: vmlinuz {} KiB, initramfs {} KiB",
        vmlinuz.len() / 1024,
        initramfs.len() / 1024
    ));
    Ok(manifest)
}

/// Directories and small files every image has. silkd mounts proc, sys, devtmpfs,
/// devpts, tmpfs on the empty directories; `/dev/console` must exist in the
/// initramfs itself, or the kernel starts `/init` with no stdin/stdout/stderr.
fn base_layout(tree: &mut Tree) {
    for dir in [
        "bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "run", "root", "var",
    ] {
        tree.dir(dir, 0o755);
    }
    tree.dir("tmp", 0o1777);
    tree.dir("root", 0o700);
    tree.char_dev("dev/console", 5, 1, 0o600);
    tree.file(
        "etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\n".to_vec(),
        0o644,
    );
    tree.file("etc/group", b"root:x:0:\n".to_vec(), 0o644);
    tree.file(
        "etc/hosts",
        b"127.0.0.1 localhost\n::1 localhost\n".to_vec(),
        0o644,
    );
}

/// `linux-image-6.1.0-56-cloud-amd64` → `6.1.0-56-cloud-amd64`.
fn kernel_release(kernel: &Package) -> Result<String> {
    kernel
        .name
        .strip_prefix("linux-image-")
        .map(str::to_string)
        .ok_or_else(|| Error::Package {
            package: kernel.name.clone(),
            reason: "not named linux-image-<release>".into(),
        })
}

fn read(path: &Path, context: &'static str) -> Result<Vec<u8>> {
    fs::read(path).map_err(Error::io(context, path))
}

fn write(path: &Path, data: &[u8]) -> Result<()> {
    fs::write(path, data).map_err(Error::io("writing", path))
}

/// `<parent>/.<name>.<tag>-<pid>`, next to `dir` so renames stay on one filesystem.
fn sibling(dir: &Path, tag: &str) -> Result<PathBuf> {
    let name = dir
        .file_name()
        .ok_or_else(|| Error::Invalid(format!("output directory {} has no name", dir.display())))?;
    let parent = dir.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(Error::io("creating output parent", parent))?;
    Ok(parent.join(format!(
        ".{}.{tag}-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Moves the finished `staging` directory to `out`, removing the old image.
fn replace_dir(staging: &Path, out: &Path) -> Result<()> {
    if out.exists() {
        let old = sibling(out, "old")?;
        fs::rename(out, &old).map_err(Error::io("moving the previous image aside", out))?;
        fs::rename(staging, out).map_err(Error::io("moving the new image into place", out))?;
        fs::remove_dir_all(&old).map_err(Error::io("removing the previous image", &old))
    } else {
        fs::rename(staging, out).map_err(Error::io("moving the new image into place", out))
    }
}
