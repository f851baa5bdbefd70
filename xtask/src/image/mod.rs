//! `cargo xtask image`: a template's image. `base` (the default) is busybox and silkd
//! from Debian packages, assembled in memory; its kernel and initramfs are also the
//! boot stage of every other template. Other templates come from `templates/NAME.toml`
//! (mmdebstrap, [`debian`]) or from an OCI image ([`oci`]); both end in [`rootfs`]. The
//! output directory is replaced only once the new image is complete. docs/image.md
//! describes `base` and the contract with silkd's PID-1 code, docs/templates.md the rest.

pub mod apt;
pub mod debian;
pub mod kmod;
pub mod manifest;
pub mod oci;
pub mod rootfs;
pub mod spec;
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
use spec::Source;
use tree::Tree;

/// The meta package whose dependency names the real, versioned kernel package.
pub const KERNEL_META: &str = "linux-image-cloud-amd64";
pub const BUSYBOX: &str = "busybox-static";
/// silkd reads this list at boot and loads each module, in order, with finit_module.
pub const MODULES_LIST: &str = "etc/silkd/modules";

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The template: templates/NAME.toml, or the name an OCI import gets.
    #[arg(long, default_value = "base")]
    pub template: String,
    /// Import this OCI image layout directory or `docker save` archive instead of
    /// reading a spec.
    #[arg(long, value_name = "PATH")]
    pub from_oci: Option<PathBuf>,
    /// Where the image goes [default: target/images/<template>].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Downloaded and unpacked packages, reused across runs.
    #[arg(long, default_value_os_t = default_cache())]
    pub cache: PathBuf,
    /// Use this silkd binary instead of building the static one.
    #[arg(long)]
    pub silkd: Option<PathBuf>,
    /// Where the template specs are.
    #[arg(long, default_value_os_t = workspace_root().join("templates"))]
    pub templates: PathBuf,
}

/// What `cargo xtask image` with no flags does (the test gate and `up` use it).
impl Default for Args {
    fn default() -> Self {
        Args {
            template: "base".into(),
            from_oci: None,
            out: None,
            cache: default_cache(),
            silkd: None,
            templates: workspace_root().join("templates"),
        }
    }
}

impl Args {
    /// `--out`, else `target/images/<template>` (`target/images/base` is where
    /// sandboxd's qemu tests and `cargo xtask up` look).
    pub fn out(&self) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| workspace_root().join("target/images").join(&self.template))
    }
}

fn default_cache() -> PathBuf {
    workspace_root().join("target/images/cache")
}

pub fn run(args: &Args) -> Result<()> {
    let manifest = build(args)?;
    let out = args.out();
    eprintln!(
        "image: {} (template {}, kernel {}, image {})",
        out.display(),
        manifest.template.name,
        manifest.kernel.release,
        manifest.image_digest
    );
    println!("{}", out.display());
    Ok(())
}

/// Progress lines on stderr, each with the time since the build started.
pub struct Progress {
    started: Instant,
}

impl Progress {
    pub fn start() -> Progress {
        Progress {
            started: Instant::now(),
        }
    }

    pub fn step(&self, what: &str) {
        eprintln!(
            "image: [{:>6.1}s] {what}",
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Builds the template `args` names into `args.out()` and returns its manifest.
pub fn build(args: &Args) -> Result<Manifest> {
    let progress = Progress::start();
    if let Some(path) = &args.from_oci {
        spec::check_name(&args.template)?;
        // base is the boot stage and what the tests boot; an import must not replace it.
        if args.template == "base" {
            return Err(Error::Invalid(
                "`base` is built from templates/base.toml; import under another name".into(),
            ));
        }
        return oci::build(args, path, &progress);
    }
    let loaded = spec::load(&args.templates, &args.template)?;
    match loaded.spec.from {
        Source::Busybox => build_busybox(args, &loaded, &progress),
        Source::Debian => debian::build(args, &loaded, &progress),
        Source::Oci => unreachable!("spec::validate refuses `from = \"oci\"`"),
    }
}

/// The kernel, the initramfs and what went into them: all of `base`, and the boot
/// stage of every other template.
pub struct Boot {
    pub kernel: manifest::Kernel,
    pub busybox: manifest::PackageVersion,
    pub modules: Vec<String>,
    /// The initramfs's file tree (`base`'s root filesystem).
    pub tree: Tree,
    pub vmlinuz: Vec<u8>,
    pub initramfs: Vec<u8>,
    /// The static silkd: `/init` in the initramfs.
    pub silkd: Vec<u8>,
}

impl Boot {
    /// Writes `vmlinuz` and `initramfs.cpio.gz` into `dir`; returns their digests as
    /// manifest artifacts.
    pub fn write(&self, dir: &Path, progress: &Progress) -> Result<BTreeMap<String, String>> {
        progress.step("writing vmlinuz and initramfs.cpio.gz");
        write(&dir.join("vmlinuz"), &self.vmlinuz)?;
        write(&dir.join("initramfs.cpio.gz"), &self.initramfs)?;
        Ok(BTreeMap::from([
            (
                "initramfs.cpio.gz".to_string(),
                hex::encode(Sha256::digest(&self.initramfs)),
            ),
            (
                "vmlinuz".to_string(),
                hex::encode(Sha256::digest(&self.vmlinuz)),
            ),
        ]))
    }
}

/// `base`: the boot stage's tree is the whole root filesystem.
fn build_busybox(args: &Args, loaded: &spec::Loaded, progress: &Progress) -> Result<Manifest> {
    let boot = boot_stage(args, progress, false)?;
    let out = args.out();
    let staging = sibling(&out, "new")?;
    apt::recreate_dir(&staging)?;
    let mut artifacts = boot.write(&staging, progress)?;
    progress.step("writing rootfs/");
    boot.tree.write_dir(&staging.join("rootfs"))?;
    artifacts.insert("rootfs".to_string(), boot.tree.rootfs_digest());
    let spec = &loaded.spec;
    let template = manifest::Template {
        name: loaded.name.clone(),
        from: Source::Busybox,
        source_digest: loaded.hash.clone(),
        cache_key: None,
        silkd: "/init".into(),
        rootfs_image: None,
        user: manifest::User {
            name: spec.user.name.clone(),
            uid: spec.user.uid,
            gid: spec.user.uid,
            home: spec.user.home.clone(),
            shell: spec.shell().to_string(),
            sudo: false,
        },
        workdir: spec.workdir().to_string(),
        env: spec.env.clone(),
    };
    let manifest = boot.manifest(artifacts, template, Vec::new());
    finish(&staging, &out, &manifest)?;
    progress.step(&format!(
        "done: vmlinuz {} KiB, initramfs {} KiB",
        boot.vmlinuz.len() / 1024,
        boot.initramfs.len() / 1024
    ));
    Ok(manifest)
}

impl Boot {
    /// The manifest of an image made of this boot stage plus `artifacts`.
    pub fn manifest(
        &self,
        artifacts: BTreeMap<String, String>,
        template: manifest::Template,
        packages: Vec<manifest::PackageVersion>,
    ) -> Manifest {
        Manifest {
            format: manifest::FORMAT,
            kernel: self.kernel.clone(),
            busybox: self.busybox.clone(),
            modules: self.modules.clone(),
            image_digest: format!("sha256:{}", manifest::image_digest(&artifacts)),
            artifacts,
            template,
            packages,
        }
    }
}

/// Writes `manifest.json` into `staging` and moves `staging` to `out`.
pub fn finish(staging: &Path, out: &Path, manifest: &Manifest) -> Result<()> {
    let json = serde_json::to_string_pretty(manifest).expect("a manifest always serializes");
    write(
        &staging.join("manifest.json"),
        format!("{json}\n").as_bytes(),
    )?;
    replace_dir(staging, out)
}

/// The manifest already in `out` when it was built with `cache_key` and every artifact
/// it names is still there: the build can stop.
pub fn cached(out: &Path, cache_key: &str) -> Option<Manifest> {
    let text = fs::read(out.join("manifest.json")).ok()?;
    let manifest: Manifest = serde_json::from_slice(&text).ok()?;
    let complete = manifest.template.cache_key.as_deref() == Some(cache_key)
        && out.join("rootfs").is_dir()
        && manifest
            .artifacts
            .keys()
            .all(|name| out.join(name).exists());
    complete.then_some(manifest)
}

/// Resolves, fetches and assembles the boot stage (kernel, busybox, silkd, modules).
/// `disk`: the image has a root disk, so the boot stage also loads [`kmod::DISK`].
pub fn boot_stage(args: &Args, progress: &Progress, disk: bool) -> Result<Boot> {
    let step = |what: &str| progress.step(what);
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
    let mut wanted = kmod::WANTED.to_vec();
    if disk {
        wanted.extend_from_slice(kmod::DISK);
    }
    let modules = kmod::load_order(&modules_dir, &wanted)?;
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
    let silkd = read(&silkd_path, "reading silkd")?;
    tree.file("init", silkd.clone(), 0o755);
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

    let vmlinuz_src = kernel_dir.join(format!("boot/vmlinuz-{release}"));
    let vmlinuz = read(&vmlinuz_src, "reading the kernel image")?;
    step("compressing the initramfs");
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    tree.write_cpio(&mut gz)
        .and_then(|()| gz.flush())
        .map_err(Error::io(
            "compressing the initramfs",
            Path::new("initramfs.cpio.gz"),
        ))?;
    let initramfs = gz.finish().map_err(Error::io(
        "compressing the initramfs",
        Path::new("initramfs.cpio.gz"),
    ))?;
    Ok(Boot {
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
        tree,
        vmlinuz,
        initramfs,
        silkd,
    })
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

pub(crate) fn read(path: &Path, context: &'static str) -> Result<Vec<u8>> {
    fs::read(path).map_err(Error::io(context, path))
}

fn write(path: &Path, data: &[u8]) -> Result<()> {
    fs::write(path, data).map_err(Error::io("writing", path))
}

/// `<parent>/.<name>.<tag>-<pid>`, next to `dir` so renames stay on one filesystem.
pub(crate) fn sibling(dir: &Path, tag: &str) -> Result<PathBuf> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_can_neither_replace_base_nor_use_a_hostile_name() {
        for (name, says) in [
            ("base", "import under another name"),
            ("../x", "template name"),
        ] {
            let args = Args {
                template: name.into(),
                from_oci: Some(PathBuf::from("/nonexistent")),
                ..Args::default()
            };
            let e = build(&args).unwrap_err().to_string();
            assert!(e.contains(says), "{name}: {e}");
        }
    }
}
