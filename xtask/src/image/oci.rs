//! OCI import (`--from-oci PATH`): an OCI image layout directory or a `docker save`
//! archive. Its layers are applied in order with whiteouts, its config's `Env`,
//! `WorkingDir` and `User` go into the manifest, then [`rootfs::complete`] adds silkd
//! and writes the image. Layer entries are hostile input: an entry that would land
//! outside the tree (`..`, an absolute path, or through a link that leads out) fails
//! the import.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::manifest::{self, Manifest};
use super::rootfs;
use super::spec::Source;
use super::{apt, boot_stage, cached, sibling, Args, Progress};
use crate::{deps, tool, Error, Result};

/// Bumped whenever the import changes what it writes, so old caches stop matching.
const BUILDER: &str = "oci-import-2";
/// Symlinks followed while resolving one path, as Linux's own limit.
const MAX_LINKS: u32 = 40;
const OPAQUE: &str = ".wh..wh..opq";
const WHITEOUT: &str = ".wh.";

/// One image, read from a layout directory or a `docker save` directory.
#[derive(Debug)]
pub struct Image {
    /// Layer files in application order (gzip or plain tar).
    pub layers: Vec<PathBuf>,
    pub config: Config,
}

/// The part of the image config (`config` in the OCI image config) the engines use.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
pub struct Config {
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
    #[serde(rename = "User", default)]
    pub user: Option<String>,
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    config: Option<Config>,
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct OciManifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// One entry of a `docker save` archive's `manifest.json`.
#[derive(Deserialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

fn invalid(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("OCI image {}: {what}", path.display()))
}

/// Reads an OCI image layout (`index.json`, `blobs/`) or an unpacked `docker save`
/// (`manifest.json`) in `dir`, checking every blob against its digest. Returns the
/// image and a digest naming it (the manifest's, or sha256 of docker's files).
pub fn read_image(dir: &Path) -> Result<(Image, String)> {
    if dir.join("index.json").is_file() {
        read_layout(dir)
    } else if dir.join("manifest.json").is_file() {
        read_docker(dir)
    } else {
        Err(invalid(
            dir,
            "neither an OCI image layout (index.json) nor a `docker save` (manifest.json)",
        ))
    }
}

/// `blobs/sha256/<hex>` for a digest, which must be exactly `sha256:` + 64 hex digits
/// (anything else could name a path outside `blobs/`).
fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
        .ok_or_else(|| invalid(dir, format!("digest {digest:?} is not sha256:<64 hex>")))?;
    Ok(dir.join("blobs/sha256").join(hex))
}

/// A small blob (index, manifest, config), checked against its digest.
fn read_blob(dir: &Path, digest: &str) -> Result<Vec<u8>> {
    let path = blob_path(dir, digest)?;
    let data = fs::read(&path).map_err(Error::io("reading OCI blob", &path))?;
    if format!("sha256:{}", hex::encode(Sha256::digest(&data))) != digest {
        return Err(invalid(
            dir,
            format!("blob {digest} does not match its digest"),
        ));
    }
    Ok(data)
}

fn parse_json<T: for<'de> Deserialize<'de>>(dir: &Path, what: &str, data: &[u8]) -> Result<T> {
    serde_json::from_slice(data).map_err(|e| invalid(dir, format!("{what}: {e}")))
}

fn read_layout(dir: &Path) -> Result<(Image, String)> {
    let index_path = dir.join("index.json");
    let index = fs::read(&index_path).map_err(Error::io("reading", &index_path))?;
    let mut index: Index = parse_json(dir, "index.json", &index)?;
    // Nested indexes (multi-platform images) are followed a few levels at most.
    for _ in 0..4 {
        let chosen = index
            .manifests
            .into_iter()
            .find(|d| {
                d.platform
                    .as_ref()
                    .is_none_or(|p| p.os == "linux" && p.architecture == "amd64")
            })
            .ok_or_else(|| invalid(dir, "no manifest for linux/amd64"))?;
        let data = read_blob(dir, &chosen.digest)?;
        if chosen.media_type.contains("index") || chosen.media_type.contains("manifest.list") {
            index = parse_json(dir, "nested index", &data)?;
            continue;
        }
        let manifest: OciManifest = parse_json(dir, "image manifest", &data)?;
        let config: ConfigFile = parse_json(
            dir,
            "image config",
            &read_blob(dir, &manifest.config.digest)?,
        )?;
        let mut layers = Vec::new();
        for layer in &manifest.layers {
            let path = blob_path(dir, &layer.digest)?;
            if rootfs::file_digest(&path)? != layer.digest["sha256:".len()..] {
                return Err(invalid(
                    dir,
                    format!("layer {} does not match its digest", layer.digest),
                ));
            }
            layers.push(path);
        }
        let image = Image {
            layers,
            config: config.config.unwrap_or_default(),
        };
        return Ok((image, chosen.digest));
    }
    Err(invalid(dir, "indexes nested too deep"))
}

/// A path named inside a `docker save` archive: relative, with no `..`.
fn archive_member(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = Path::new(name);
    if name.is_empty() || !path.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(invalid(
            dir,
            format!("member {name:?} is not a plain relative path"),
        ));
    }
    Ok(dir.join(path))
}

fn read_docker(dir: &Path) -> Result<(Image, String)> {
    let path = dir.join("manifest.json");
    let text = fs::read(&path).map_err(Error::io("reading", &path))?;
    let entries: Vec<DockerEntry> = parse_json(dir, "manifest.json", &text)?;
    let [entry] = entries.as_slice() else {
        return Err(invalid(
            dir,
            format!("holds {} images; save exactly one", entries.len()),
        ));
    };
    let config_path = archive_member(dir, &entry.config)?;
    let config_data = fs::read(&config_path).map_err(Error::io("reading", &config_path))?;
    let config: ConfigFile = parse_json(dir, "image config", &config_data)?;
    let mut digest = Sha256::new();
    digest.update(&text);
    digest.update(&config_data);
    let mut layers = Vec::new();
    for layer in &entry.layers {
        let layer_path = archive_member(dir, layer)?;
        digest.update(rootfs::file_digest(&layer_path)?.as_bytes());
        layers.push(layer_path);
    }
    let image = Image {
        layers,
        config: config.config.unwrap_or_default(),
    };
    Ok((image, format!("sha256:{}", hex::encode(digest.finalize()))))
}

/// A layer file as a tar stream, gunzipped when it starts with gzip's magic.
fn open_layer(path: &Path) -> Result<Box<dyn Read>> {
    let mut file = BufReader::new(File::open(path).map_err(Error::io("opening layer", path))?);
    let magic = io::BufRead::fill_buf(&mut file).map_err(Error::io("reading layer", path))?;
    if magic.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::read::GzDecoder::new(file)))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Err(Error::Invalid(format!(
            "layer {} is zstd-compressed; re-save the image with gzip layers",
            path.display()
        )))
    } else {
        Ok(Box::new(file))
    }
}

/// What applying one layer did, for progress lines and tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub entries: u64,
    pub removed: u64,
    /// Device nodes and fifos: left out, the engines provide `/dev`.
    pub skipped: u64,
}

/// A layer entry's path as plain components. `./` prefixes are dropped; an absolute
/// path or a `..` is refused, never cleaned up.
fn entry_components(path: &Path) -> Result<Vec<OsString>> {
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::Normal(part) => parts.push(part.to_os_string()),
            Component::RootDir | Component::Prefix(_) => {
                return Err(Error::Invalid(format!(
                    "layer entry {} is absolute",
                    path.display()
                )))
            }
            Component::ParentDir => {
                return Err(Error::Invalid(format!(
                    "layer entry {} climbs with `..`",
                    path.display()
                )))
            }
        }
    }
    Ok(parts)
}

/// The real directory that `parts` names inside `root`, following symlinks the way
/// the tree itself would (an absolute target starts again at `root`). A `..` that
/// would climb above `root` is an escape and fails, as do loops and non-directories.
/// Missing directories are created (mode 0755) when `create`, else give `None`.
fn resolve_dir(root: &Path, parts: &[OsString], create: bool) -> Result<Option<PathBuf>> {
    let escape = |why: &str| {
        Error::Invalid(format!(
            "layer entry under {}: {why}",
            PathBuf::from_iter(parts).display()
        ))
    };
    let mut real: Vec<OsString> = Vec::new();
    let mut pending: VecDeque<OsString> = parts.iter().cloned().collect();
    let mut links = 0;
    while let Some(part) = pending.pop_front() {
        if part == "." || part.is_empty() {
            continue;
        }
        if part == ".." {
            if real.pop().is_none() {
                return Err(escape("a link leads out of the image"));
            }
            continue;
        }
        let here = root.join(PathBuf::from_iter(&real)).join(&part);
        match fs::symlink_metadata(&here) {
            Ok(meta) if meta.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(escape("too many levels of links"));
                }
                let target = fs::read_link(&here).map_err(Error::io("reading link", &here))?;
                if target.is_absolute() {
                    real.clear();
                }
                for (i, c) in target
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(p) => Some(p.to_os_string()),
                        Component::ParentDir => Some(OsString::from("..")),
                        _ => None,
                    })
                    .enumerate()
                {
                    pending.insert(i, c);
                }
            }
            Ok(meta) if meta.is_dir() => real.push(part),
            Ok(_) => {
                return Err(escape(&format!(
                    "{} is not a directory",
                    part.to_string_lossy()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create {
                    return Ok(None);
                }
                fs::create_dir(&here).map_err(Error::io("creating directory", &here))?;
                fs::set_permissions(&here, fs::Permissions::from_mode(0o755))
                    .map_err(Error::io("setting directory mode", &here))?;
                real.push(part);
            }
            Err(e) => return Err(Error::io("reading layer target", &here)(e)),
        }
    }
    Ok(Some(root.join(PathBuf::from_iter(real))))
}

/// Removes whatever is at `path` (a link itself, not its target).
fn remove_any(path: &Path) -> Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path)
            .map(|()| true)
            .map_err(Error::io("removing", path)),
        Ok(_) => fs::remove_file(path)
            .map(|()| true)
            .map_err(Error::io("removing", path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("reading", path)(e)),
    }
}

/// Applies one layer to `root`. Whiteouts first (they hide what lower layers left, so
/// applying them before the layer's own entries is exactly their meaning whatever the
/// entry order), then every other entry. `open` gives the layer's tar stream afresh
/// for each pass. `own`: set owners from the entries (needs root).
pub fn apply_layer(
    root: &Path,
    open: &dyn Fn() -> Result<Box<dyn Read>>,
    own: bool,
) -> Result<Applied> {
    let mut applied = Applied::default();
    let read_err = |e: io::Error| Error::Invalid(format!("reading layer: {e}"));
    let mut archive = tar::Archive::new(open()?);
    for entry in archive.entries().map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let parts = entry_components(&entry.path().map_err(read_err)?)?;
        let Some((name, parent)) = parts.split_last() else {
            continue;
        };
        let name = name.to_string_lossy();
        if name == OPAQUE {
            if let Some(dir) = resolve_dir(root, parent, false)? {
                for child in fs::read_dir(&dir).map_err(Error::io("listing", &dir))? {
                    let child = child.map_err(Error::io("listing", &dir))?;
                    applied.removed += u64::from(remove_any(&child.path())?);
                }
            }
        } else if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            if hidden.is_empty() || hidden == "." || hidden == ".." || hidden.contains('/') {
                return Err(Error::Invalid(format!("whiteout {name:?} names nothing")));
            }
            if let Some(dir) = resolve_dir(root, parent, false)? {
                applied.removed += u64::from(remove_any(&dir.join(hidden))?);
            }
        }
    }

    let mut archive = tar::Archive::new(open()?);
    for entry in archive.entries().map_err(read_err)? {
        let mut entry = entry.map_err(read_err)?;
        let parts = entry_components(&entry.path().map_err(read_err)?)?;
        let Some((name, parent)) = parts.split_last() else {
            continue; // the layer's root directory itself
        };
        if name.to_string_lossy().starts_with(WHITEOUT) {
            continue;
        }
        let header = entry.header().clone();
        let kind = header.entry_type();
        if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            applied.skipped += 1;
            continue;
        }
        let dir = resolve_dir(root, parent, true)?.expect("created when missing");
        let path = dir.join(name);
        let mode = header.mode().map_err(read_err)? & 0o7777;
        if kind.is_dir() {
            if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                remove_any(&path)?;
                fs::create_dir(&path).map_err(Error::io("creating directory", &path))?;
            }
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            remove_any(&path)?;
            let mut file = File::options()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(Error::io("creating file", &path))?;
            io::copy(&mut entry, &mut file).map_err(Error::io("writing file", &path))?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(read_err)?
                .ok_or_else(|| Error::Invalid(format!("link {} has no target", path.display())))?;
            remove_any(&path)?;
            std::os::unix::fs::symlink(&target, &path)
                .map_err(Error::io("creating symlink", &path))?;
        } else if kind.is_hard_link() {
            let target = entry
                .link_name()
                .map_err(read_err)?
                .ok_or_else(|| Error::Invalid(format!("link {} has no target", path.display())))?;
            let target_parts = entry_components(&target)?;
            let (target_name, target_parent) = target_parts.split_last().ok_or_else(|| {
                Error::Invalid(format!("hard link {} to the root", path.display()))
            })?;
            let source = resolve_dir(root, target_parent, false)?
                .map(|d| d.join(target_name))
                .filter(|s| fs::symlink_metadata(s).is_ok_and(|m| !m.is_dir()))
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "hard link {} to {}, which is not a file in the image",
                        path.display(),
                        target.display()
                    ))
                })?;
            remove_any(&path)?;
            fs::hard_link(&source, &path).map_err(Error::io("creating hard link", &path))?;
            applied.entries += 1;
            continue; // a hard link shares its target's owner and mode
        } else {
            applied.skipped += 1;
            continue;
        }
        if own {
            let uid = header.uid().map_err(read_err)?;
            let gid = header.gid().map_err(read_err)?;
            let id = |v: u64| {
                u32::try_from(v).map_err(|_| read_err(io::Error::other("uid over 32 bits")))
            };
            std::os::unix::fs::lchown(&path, Some(id(uid)?), Some(id(gid)?))
                .map_err(Error::io("setting owner", &path))?;
        }
        // After chown, which clears setuid bits.
        if !kind.is_symlink() {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(Error::io("setting mode", &path))?;
        }
        applied.entries += 1;
    }
    Ok(applied)
}

/// The template metadata of an imported image: its config's Env, WorkingDir and User,
/// the user looked up in the tree's `/etc/passwd`.
pub fn template_of(
    root: &Path,
    name: &str,
    digest: &str,
    config: &Config,
) -> Result<manifest::Template> {
    let mut env = BTreeMap::new();
    for pair in config.env.iter().flatten() {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| Error::Invalid(format!("image config Env {pair:?} has no `=`")))?;
        if key.is_empty() || pair.contains('\0') {
            return Err(Error::Invalid(format!(
                "image config Env {pair:?} is not KEY=VALUE"
            )));
        }
        env.insert(key.to_string(), value.to_string());
    }
    let workdir = match config.working_dir.as_deref() {
        None | Some("") => "/".to_string(),
        Some(dir) if dir.starts_with('/') && !dir.contains('\0') => dir.to_string(),
        Some(dir) => {
            return Err(Error::Invalid(format!(
                "image config WorkingDir {dir:?} is not absolute"
            )))
        }
    };
    let spec = config.user.as_deref().unwrap_or("");
    let (who, group) = spec.split_once(':').unwrap_or((spec, ""));
    let who = if who.is_empty() { "root" } else { who };
    let user = match rootfs::passwd_entry(root, who) {
        Some(entry) => manifest::User {
            name: entry.name,
            uid: entry.uid,
            gid: entry.gid,
            home: entry.home,
            shell: entry.shell,
            sudo: false,
        },
        None => match who.parse::<u32>() {
            // A bare uid without a passwd entry is valid for OCI; it has no home.
            Ok(uid) => manifest::User {
                name: who.to_string(),
                uid,
                gid: uid,
                home: "/".into(),
                shell: "/bin/sh".into(),
                sudo: false,
            },
            Err(_) if who == "root" => manifest::User {
                name: "root".into(),
                uid: 0,
                gid: 0,
                home: "/root".into(),
                shell: "/bin/sh".into(),
                sudo: false,
            },
            Err(_) => {
                return Err(Error::Invalid(format!(
                    "image config User {spec:?}: `{who}` is not in the image's /etc/passwd"
                )))
            }
        },
    };
    let gid = match group {
        "" => user.gid,
        g => g
            .parse()
            .ok()
            .or_else(|| group_id(root, g))
            .ok_or_else(|| Error::Invalid(format!("image config User {spec:?}: no group `{g}`")))?,
    };
    Ok(manifest::Template {
        name: name.to_string(),
        from: Source::Oci,
        source_digest: digest.to_string(),
        cache_key: None,
        silkd: String::new(),
        rootfs_image: None,
        user: manifest::User { gid, ..user },
        workdir,
        env,
    })
}

fn group_id(root: &Path, name: &str) -> Option<u32> {
    let text = fs::read_to_string(root.join("etc/group")).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 3 && f[0] == name).then(|| f[2].parse().ok())?
    })
}

/// Imports the image at `path` as the template `args.template`.
pub fn build(args: &Args, path: &Path, progress: &Progress) -> Result<Manifest> {
    if !deps::is_root()? {
        return Err(Error::Invalid(
            "importing an OCI image needs root: its files keep their owners".into(),
        ));
    }
    tool::require(&["mkfs.erofs", "sha256sum"])?;
    let out = args.out();
    let staging = sibling(&out, "new")?;
    apt::recreate_dir(&staging)?;
    let result = (|| {
        let source = if path.is_dir() {
            path.to_path_buf()
        } else {
            progress.step(&format!("unpacking {}", path.display()));
            let dir = staging.join("source");
            fs::create_dir(&dir).map_err(Error::io("creating", &dir))?;
            let mut archive = tar::Archive::new(open_layer(path)?);
            archive
                .unpack(&dir)
                .map_err(|e| invalid(path, format!("unpacking the archive: {e}")))?;
            dir
        };
        progress.step(&format!("reading the image at {}", path.display()));
        let (image, digest) = read_image(&source)?;
        let boot = boot_stage(args, progress, true)?;
        let mut key = Sha256::new();
        key.update(format!("{BUILDER}\n{}\n{digest}", args.template).as_bytes());
        for part in [&boot.silkd, &boot.vmlinuz, &boot.initramfs] {
            key.update(format!("\n{}", hex::encode(Sha256::digest(part))).as_bytes());
        }
        let cache_key = hex::encode(key.finalize());
        if let Some(manifest) = cached(&out, &cache_key) {
            progress.step(&format!("cached: {} is up to date", out.display()));
            return Ok(manifest);
        }
        let root = staging.join("rootfs");
        fs::create_dir(&root).map_err(Error::io("creating", &root))?;
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755))
            .map_err(Error::io("setting mode", &root))?;
        let count = image.layers.len();
        for (i, layer) in image.layers.iter().enumerate() {
            let applied = apply_layer(&root, &|| open_layer(layer), true)?;
            progress.step(&format!(
                "layer {}/{count}: {} entries, {} removed, {} device nodes skipped",
                i + 1,
                applied.entries,
                applied.removed,
                applied.skipped
            ));
        }
        if source != path {
            fs::remove_dir_all(&source).map_err(Error::io("removing", &source))?;
        }
        let mut template = template_of(&root, &args.template, &digest, &image.config)?;
        template.cache_key = Some(cache_key);
        rootfs::complete(args, progress, &boot, &staging, template)
    })();
    // Left behind after a cache hit or a failure; nothing is ever mounted below it.
    if staging.exists() {
        let _ = fs::remove_dir_all(&staging);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One layer entry; names and link targets are written raw, so tests can hold the
    /// hostile ones `tar::Builder` itself refuses to write.
    enum E<'a> {
        Dir(&'a str),
        File(&'a str, &'a [u8], u32),
        Symlink(&'a str, &'a str),
        Hard(&'a str, &'a str),
        Fifo(&'a str),
    }

    fn layer(entries: &[E]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for entry in entries {
            let mut header = tar::Header::new_old();
            let (name, data, kind, mode, link): (&str, &[u8], _, u32, &str) = match entry {
                E::Dir(n) => (n, b"", tar::EntryType::Directory, 0o755, ""),
                E::File(n, d, m) => (n, d, tar::EntryType::Regular, *m, ""),
                E::Symlink(n, t) => (n, b"", tar::EntryType::Symlink, 0o777, t),
                E::Hard(n, t) => (n, b"", tar::EntryType::Link, 0o644, t),
                E::Fifo(n) => (n, b"", tar::EntryType::Fifo, 0o644, ""),
            };
            header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
            header.set_entry_type(kind);
            header.set_mode(mode);
            header.set_size(data.len() as u64);
            header.set_cksum();
            builder.append(&header, data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn apply(root: &Path, entries: &[E]) -> Result<Applied> {
        let bytes = layer(entries);
        apply_layer(
            root,
            &|| Ok(Box::new(io::Cursor::new(bytes.clone()))),
            false,
        )
    }

    fn exists(path: PathBuf) -> bool {
        fs::symlink_metadata(path).is_ok()
    }

    #[test]
    fn whiteouts_and_opaque_dirs_hide_lower_layers_whatever_the_entry_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let first = apply(
            root,
            &[
                E::Dir("etc/"),
                E::File("etc/keep", b"k", 0o644),
                E::File("etc/gone", b"g", 0o644),
                E::Dir("./opt/"),
                E::File("./opt/a", b"a", 0o644),
                E::File("opt/sub/b", b"b", 0o644),
                E::Symlink("link", "etc/keep"),
                E::File("bin/tool", b"#!", 0o4755),
                E::Fifo("run/fifo"),
                E::File("etc/conf.d/x", b"x", 0o644),
            ],
        )
        .unwrap();
        assert_eq!((first.entries, first.removed, first.skipped), (9, 0, 1));
        let second = apply(
            root,
            &[
                // The layer's own entry comes before the opaque marker and survives it.
                E::File("opt/new", b"n", 0o600),
                E::File("opt/.wh..wh..opq", b"", 0o644),
                E::File("etc/.wh.gone", b"", 0o644),
                E::File(".wh.link", b"", 0o644),
                E::File("etc/added", b"+", 0o644),
                // A file replaces a lower layer's directory.
                E::File("etc/conf.d", b"now a file", 0o644),
            ],
        )
        .unwrap();
        assert_eq!((second.entries, second.removed), (3, 4));
        assert_eq!(fs::read(root.join("etc/keep")).unwrap(), b"k");
        assert_eq!(fs::read(root.join("etc/added")).unwrap(), b"+");
        assert_eq!(fs::read(root.join("etc/conf.d")).unwrap(), b"now a file");
        assert_eq!(fs::read(root.join("opt/new")).unwrap(), b"n");
        for gone in ["etc/gone", "opt/a", "opt/sub", "link", "run/fifo"] {
            assert!(!exists(root.join(gone)), "{gone}");
        }
        let mode = fs::metadata(root.join("bin/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o4755);
        assert_eq!(
            fs::metadata(root.join("opt/new"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
    }

    #[test]
    fn links_inside_the_image_are_followed_within_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        apply(
            root,
            &[
                E::Dir("usr/bin/"),
                E::Symlink("bin", "usr/bin"),
                // An absolute target means the image's own root, not the host's.
                E::Symlink("abs", "/usr"),
                E::File("bin/sh", b"sh", 0o755),
                E::File("abs/marker", b"m", 0o644),
                E::Hard("usr/bin/sh2", "bin/sh"),
            ],
        )
        .unwrap();
        assert_eq!(fs::read(root.join("usr/bin/sh")).unwrap(), b"sh");
        assert_eq!(fs::read(root.join("usr/marker")).unwrap(), b"m");
        assert!(!Path::new("/usr/marker").exists());
        assert_eq!(fs::read(root.join("usr/bin/sh2")).unwrap(), b"sh");
        // Replacing a link replaces the link, not its target.
        apply(root, &[E::File("bin", b"file now", 0o644)]).unwrap();
        assert!(root.join("usr/bin/sh").exists());
        assert_eq!(fs::read(root.join("bin")).unwrap(), b"file now");
    }

    #[test]
    fn hostile_entries_are_refused_and_nothing_lands_outside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("victim"), "safe").unwrap();
        // Links that lead out, from a lower layer.
        apply(
            &root,
            &[
                E::Symlink("esc", "../outside"),
                E::Symlink("deep", "etc/../../outside"),
                E::Symlink("loop", "loop"),
            ],
        )
        .unwrap();
        let listing = |p: &Path| {
            let mut names: Vec<_> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            names
        };
        let (top_before, outside_before) = (listing(dir.path()), listing(&outside));
        for (entries, says) in [
            (vec![E::File("../evil", b"x", 0o644)], "climbs"),
            (vec![E::File("etc/../../evil", b"x", 0o644)], "climbs"),
            (vec![E::File("/evil", b"x", 0o644)], "absolute"),
            (vec![E::File("esc/evil", b"x", 0o644)], "leads out"),
            (vec![E::File("deep/evil", b"x", 0o644)], "leads out"),
            (vec![E::Dir("esc/newdir/")], "leads out"),
            (vec![E::File("loop/x", b"x", 0o644)], "too many levels"),
            (vec![E::Hard("h", "../outside/victim")], "climbs"),
            (vec![E::Hard("h", "esc/victim")], "leads out"),
            (vec![E::Hard("h", "/etc/passwd")], "absolute"),
            (vec![E::File("esc/.wh.victim", b"", 0o644)], "leads out"),
            (vec![E::File("esc/.wh..wh..opq", b"", 0o644)], "leads out"),
            (vec![E::File(".wh...", b"", 0o644)], "names nothing"),
        ] {
            let e = apply(&root, &entries).unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        }
        // Count leftovers: nothing new next to the tree, the victim untouched.
        assert_eq!(listing(dir.path()), top_before);
        assert_eq!(listing(&outside), outside_before);
        assert_eq!(fs::read_to_string(outside.join("victim")).unwrap(), "safe");
    }

    #[test]
    fn blob_digests_cannot_name_paths() {
        let dir = Path::new("/layout");
        for bad in [
            "sha256:../../../etc/passwd",
            "sha512:00",
            &format!("sha256:{}", "A".repeat(64)),
            &format!("sha256:{}/x", "a".repeat(63)),
        ] {
            assert!(blob_path(dir, bad).is_err(), "{bad}");
        }
        let good = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            blob_path(dir, &good).unwrap(),
            Path::new("/layout/blobs/sha256").join("a".repeat(64))
        );
        assert!(archive_member(dir, "../x/layer.tar").is_err());
        assert!(archive_member(dir, "/x/layer.tar").is_err());
    }

    #[test]
    fn the_config_user_env_and_workdir_become_template_metadata() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("etc")).unwrap();
        fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/bash\n",
        )
        .unwrap();
        fs::write(dir.path().join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        let config = |user: &str, workdir: Option<&str>| Config {
            env: Some(vec!["PATH=/usr/bin:/bin".into(), "A=b=c".into()]),
            working_dir: workdir.map(str::to_string),
            user: Some(user.to_string()),
        };
        let t = template_of(
            dir.path(),
            "t",
            "sha256:x",
            &config("app:staff", Some("/srv")),
        )
        .unwrap();
        assert_eq!(
            (t.user.name.as_str(), t.user.uid, t.user.gid),
            ("app", 1000, 50)
        );
        assert_eq!(
            (t.user.home.as_str(), t.workdir.as_str()),
            ("/home/app", "/srv")
        );
        assert_eq!(t.env["A"], "b=c");
        let t = template_of(dir.path(), "t", "d", &config("", None)).unwrap();
        assert_eq!((t.user.uid, t.workdir.as_str()), (0, "/"));
        let t = template_of(dir.path(), "t", "d", &config("4242:7", None)).unwrap();
        assert_eq!(
            (t.user.uid, t.user.gid, t.user.home.as_str()),
            (4242, 7, "/")
        );
        for (user, workdir, says) in [
            ("ghost", None, "not in the image's /etc/passwd"),
            ("app:nogroup", None, "no group"),
            ("app", Some("relative"), "not absolute"),
        ] {
            let e = template_of(dir.path(), "t", "d", &config(user, workdir)).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
        let bad_env = Config {
            env: Some(vec!["NOEQUALS".into()]),
            ..Config::default()
        };
        assert!(template_of(dir.path(), "t", "d", &bad_env).is_err());
    }
}
