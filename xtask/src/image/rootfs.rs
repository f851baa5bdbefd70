//! The last steps every Debian or OCI template shares, once its source has written
//! the tree to `<staging>/rootfs`: silkd at [`SILKD`], every mtime set to [`EPOCH`],
//! the read-only image [`IMAGE`], the package list, the boot stage and the manifest.
//! Nothing here runs a program inside the tree.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use filetime::FileTime;

use super::manifest::{self, Manifest, PackageVersion};
use super::{finish, Args, Boot, Progress};
use crate::{tool, Error, Result};

/// silkd in every Debian or OCI template: a directory of its own, so it cannot collide
/// with anything an image ships (an OCI image may well have /usr/local/bin/silkd).
pub const SILKD: &str = "/.silkd/silkd";
/// The read-only filesystem image of `rootfs/`, in the output directory. erofs, not
/// ext4: smaller, faster to build, read-only by design, and reproducible with two flags
/// (docs/templates.md has the measurements).
pub const IMAGE: &str = "rootfs.erofs";
/// Every mtime in a template's tree, and mmdebstrap's SOURCE_DATE_EPOCH, so the same
/// inputs give the same bytes. Not 0: useradd writes it as the last password change,
/// and PAM reads a change on day 0 as "password expired", which breaks sudo.
pub const EPOCH: i64 = 1_700_000_000;

/// Copies silkd into the tree at [`SILKD`]. `/.silkd` must not exist yet: an image that
/// ships it would otherwise decide what the engines run as the agent.
pub fn add_silkd(root: &Path, silkd: &[u8]) -> Result<()> {
    let path = root.join(SILKD.trim_start_matches('/'));
    let dir = path.parent().expect("SILKD has a directory");
    fs::create_dir(dir).map_err(Error::io("creating silkd's directory", dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
        .map_err(Error::io("setting directory mode", dir))?;
    fs::write(&path, silkd).map_err(Error::io("writing silkd", &path))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
        .map_err(Error::io("setting silkd's mode", &path))
}

/// Sets the mtime and atime of every entry below `root` (links themselves, not their
/// targets) to [`EPOCH`]; returns how many entries there are.
pub fn fix_mtimes(root: &Path) -> Result<u64> {
    let time = FileTime::from_unix_time(EPOCH, 0);
    let mut count = 0;
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = fs::symlink_metadata(&path).map_err(Error::io("reading metadata", &path))?;
        if meta.is_dir() {
            for entry in fs::read_dir(&path).map_err(Error::io("listing directory", &path))? {
                pending.push(entry.map_err(Error::io("listing directory", &path))?.path());
            }
        }
        filetime::set_symlink_file_times(&path, time, time)
            .map_err(Error::io("setting mtime", &path))?;
        count += 1;
    }
    Ok(count)
}

/// What the image's size is padded to: sandboxd's `template_disk = "pmem"` maps it as a
/// virtio-pmem region, which the guest's nd_pmem refuses unless 2 MiB aligned
/// ("misaligned, unable to map", measured). erofs ignores what follows its last block.
pub const PMEM_ALIGN: u64 = 2 << 20;

/// `mkfs.erofs` of `root` into `image`, uncompressed (so a guest can map it with DAX
/// and TCG spends no time decompressing), every timestamp [`EPOCH`], and a UUID taken
/// from `seed` (the cache key) rather than random, for reproducible bytes; then zeros up
/// to a multiple of [`PMEM_ALIGN`].
pub fn write_image(root: &Path, image: &Path, seed: &str) -> Result<()> {
    tool::require(&["mkfs.erofs"])?;
    let hex: String = seed
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(32)
        .collect();
    if hex.len() != 32 {
        return Err(Error::Invalid(format!("uuid seed {seed:?} is too short")));
    }
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    );
    tool::output(
        Command::new("mkfs.erofs")
            .arg(format!("-T{EPOCH}"))
            .arg(format!("-U{uuid}"))
            .arg("--quiet")
            .arg(image)
            .arg(root),
    )?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(image)
        .map_err(Error::io("opening", image))?;
    let len = file.metadata().map_err(Error::io("stat", image))?.len();
    file.set_len(len.div_ceil(PMEM_ALIGN) * PMEM_ALIGN)
        .map_err(Error::io("padding", image))
}

/// sha256 (hex) of a file, by `sha256sum` (xtask runs unoptimised; images are large).
pub fn file_digest(path: &Path) -> Result<String> {
    let out = tool::output(Command::new("sha256sum").arg("-b").arg(path))?;
    out.split_whitespace()
        .next()
        .filter(|d| d.len() == 64)
        .map(str::to_string)
        .ok_or_else(|| Error::Invalid(format!("sha256sum printed {out:?}")))
}

/// The installed Debian packages of the tree (dpkg's database read from outside);
/// empty when the tree has no dpkg database.
pub fn packages(root: &Path) -> Result<Vec<PackageVersion>> {
    let admindir = root.join("var/lib/dpkg");
    if !admindir.join("status").is_file() {
        return Ok(Vec::new());
    }
    let out = tool::output(
        Command::new("dpkg-query")
            .arg(format!("--admindir={}", admindir.display()))
            .args([
                "-W",
                "-f",
                "${db:Status-Status}\t${binary:Package}\t${Version}\n",
            ]),
    )?;
    let mut packages: Vec<PackageVersion> = out
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            (fields.next()? == "installed").then_some(())?;
            Some(PackageVersion {
                package: fields.next()?.to_string(),
                version: fields.next()?.to_string(),
            })
        })
        .collect();
    packages.sort_by(|a, b| a.package.cmp(&b.package));
    Ok(packages)
}

/// One `/etc/passwd` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

/// The entry of the tree's `/etc/passwd` whose name (or uid, when `who` is a number)
/// is `who`. Read as text: the tree's own libc is never run.
pub fn passwd_entry(root: &Path, who: &str) -> Option<PasswdEntry> {
    let text = fs::read_to_string(root.join("etc/passwd")).ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || (f[0] != who && f[2] != who) {
            return None;
        }
        Some(PasswdEntry {
            name: f[0].to_string(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: f[5].to_string(),
            shell: f[6].to_string(),
        })
    })
}

/// The shared ending: silkd in, mtimes fixed, image written and hashed, boot stage and
/// manifest written, `staging` moved to the output directory.
pub fn complete(
    args: &Args,
    progress: &Progress,
    boot: &Boot,
    staging: &Path,
    mut template: manifest::Template,
) -> Result<Manifest> {
    let root = staging.join("rootfs");
    let cache_key = template
        .cache_key
        .clone()
        .expect("Debian and OCI templates always have a cache key");
    progress.step(&format!("adding silkd at {SILKD}"));
    add_silkd(&root, &boot.silkd)?;
    template.silkd = SILKD.to_string();
    template.rootfs_image = Some(IMAGE.to_string());
    let entries = fix_mtimes(&root)?;
    progress.step(&format!("writing {IMAGE} ({entries} entries)"));
    let image = staging.join(IMAGE);
    write_image(&root, &image, &cache_key)?;
    let image_digest = file_digest(&image)?;
    let size = fs::metadata(&image)
        .map_err(Error::io("reading image size", &image))?
        .len();
    let packages = packages(&root)?;
    let mut artifacts: BTreeMap<String, String> = boot.write(staging, progress)?;
    artifacts.insert(IMAGE.to_string(), image_digest);
    let manifest = boot.manifest(artifacts, template, packages);
    finish(staging, &args.out(), &manifest)?;
    progress.step(&format!(
        "done: {IMAGE} {} MiB, {} packages, image {}",
        size >> 20,
        manifest.packages.len(),
        manifest.image_digest
    ));
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silkd_goes_to_its_own_directory_which_an_image_may_not_ship() {
        let dir = tempfile::tempdir().unwrap();
        add_silkd(dir.path(), b"elf").unwrap();
        let path = dir.path().join(".silkd/silkd");
        assert_eq!(fs::read(&path).unwrap(), b"elf");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        let e = add_silkd(dir.path(), b"other").unwrap_err().to_string();
        assert!(e.contains("creating silkd's directory"), "{e}");
    }

    #[test]
    fn mtimes_become_the_epoch_for_links_too_without_following_them() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        let before = fs::metadata(outside.path()).unwrap().modified().unwrap();
        fs::create_dir(dir.path().join("d")).unwrap();
        fs::write(dir.path().join("d/f"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("d/l")).unwrap();
        assert_eq!(fix_mtimes(dir.path()).unwrap(), 4);
        for p in ["", "d", "d/f", "d/l"] {
            let meta = fs::symlink_metadata(dir.path().join(p)).unwrap();
            assert_eq!(
                FileTime::from_last_modification_time(&meta).unix_seconds(),
                EPOCH
            );
        }
        let after = fs::metadata(outside.path()).unwrap().modified().unwrap();
        assert_eq!(after, before);
    }

    #[test]
    fn passwd_entries_are_found_by_name_or_uid() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("etc")).unwrap();
        fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nbad line\napp:x:1000:1001::/home/app:/bin/bash\n",
        )
        .unwrap();
        let app = passwd_entry(dir.path(), "app").unwrap();
        assert_eq!(
            (app.uid, app.gid, app.home.as_str()),
            (1000, 1001, "/home/app")
        );
        assert_eq!(passwd_entry(dir.path(), "1000"), Some(app));
        assert_eq!(passwd_entry(dir.path(), "nobody"), None);
    }
}
