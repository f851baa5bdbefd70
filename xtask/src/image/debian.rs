//! Debian templates (`from = "debian"`): the exact package versions are resolved from
//! this machine's apt lists for the Debian mirror before anything is built, the tree is
//! made by `mmdebstrap --variant=minbase` from those same lists (so what is resolved is
//! what is installed), and a generated customize hook applies the spec's user, files
//! and pip packages inside the chroot. Cached by the resolved versions.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::manifest::{self, Manifest};
use super::rootfs::{self, EPOCH};
use super::spec::{Loaded, Source, Spec};
use super::{apt, boot_stage, cached, sibling, Args, Progress};
use crate::deps::{self, APT_LISTS};
use crate::{tool, Error, Result};

/// The Debian release every template is built from.
pub const SUITE: &str = "bookworm";
/// Bumped whenever a build step changes what it writes, so old caches stop matching.
const BUILDER: &str = "debian-template-2";
/// The only component and architecture templates use.
const COMPONENT: &str = "main";
const ARCH: &str = "amd64";

/// One suite of the mirror and its list files in [`APT_LISTS`].
#[derive(Debug, Clone)]
pub struct Suite {
    pub uri: String,
    pub suite: String,
    pub lists: Vec<PathBuf>,
}

impl Suite {
    fn source_line(&self) -> String {
        format!("deb {} {} {COMPONENT}", self.uri, self.suite)
    }
}

/// bookworm and, when this machine has their lists, bookworm-updates (same mirror) and
/// bookworm-security (its own mirror), as apt's sources name them.
pub fn suites() -> Result<Vec<Suite>> {
    let main = deps::mirror(SUITE)?;
    let security = deps::mirror(&format!("{SUITE}-security")).ok();
    let mut wanted = vec![
        (main.clone(), SUITE.to_string()),
        (main, format!("{SUITE}-updates")),
    ];
    if let Some(uri) = security {
        wanted.push((uri, format!("{SUITE}-security")));
    }
    let mut suites = Vec::new();
    for (uri, suite) in wanted {
        let lists = list_files(Path::new(APT_LISTS), &uri, &suite)?;
        if lists.is_empty() {
            if suite == SUITE {
                return Err(Error::Missing {
                    what: format!(
                        "apt has no lists of {suite} {COMPONENT} {ARCH} from {uri} in {APT_LISTS}"
                    ),
                    fix: "apt-get update",
                });
            }
            continue;
        }
        suites.push(Suite { uri, suite, lists });
    }
    Ok(suites)
}

/// `http://deb.debian.org/debian/` → `deb.debian.org_debian`: how apt names list files.
fn uri_to_list_prefix(uri: &str) -> String {
    let bare = uri
        .split_once("://")
        .map_or(uri, |(_, rest)| rest)
        .trim_end_matches('/');
    bare.replace('/', "_")
}

/// The `InRelease` and `main` `binary-amd64` `Packages` files of one suite, or none
/// when either is missing.
fn list_files(dir: &Path, uri: &str, suite: &str) -> Result<Vec<PathBuf>> {
    let prefix = format!("{}_dists_{suite}_", uri_to_list_prefix(uri));
    let packages = format!("{prefix}{COMPONENT}_binary-{ARCH}_Packages");
    let mut files: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name == format!("{prefix}InRelease") || name.starts_with(&packages)
            })
            .map(|e| e.path())
            .collect(),
        Err(e) => return Err(Error::io("listing apt's lists", dir)(e)),
    };
    files.sort();
    let has_release = files
        .iter()
        .any(|f| f.to_string_lossy().ends_with("InRelease"));
    if has_release && files.len() >= 2 {
        Ok(files)
    } else {
        Ok(Vec::new())
    }
}

/// Every package minbase plus `packages` installs, as `(name, version)` sorted by name:
/// `apt-get --simulate` against the lists of `suites` only (a private apt
/// configuration, so other sources on this machine, such as nodesource, never count).
/// apt's solver takes seconds for `default`, so the answer is kept under a key of the
/// suites' `InRelease` files (which carry the Packages files' digests) and `packages`.
pub fn resolve(
    suites: &[Suite],
    packages: &[String],
    cache: &Path,
) -> Result<Vec<(String, String)>> {
    let dir = cache.join("apt-resolve");
    let mut key = Sha256::new();
    key.update(BUILDER.as_bytes());
    for suite in suites {
        key.update(format!("\n{}", suite.source_line()).as_bytes());
        for list in &suite.lists {
            key.update(format!("\n{}\n", list.display()).as_bytes());
            if list.to_string_lossy().ends_with("InRelease") {
                key.update(fs::read(list).map_err(Error::io("reading apt list", list))?);
            }
        }
    }
    key.update(format!("\n{}", packages.join(" ")).as_bytes());
    let answer = dir.join(format!("resolved-{}", hex::encode(key.finalize())));
    if let Ok(text) = fs::read_to_string(&answer) {
        let resolved: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        if !resolved.is_empty() {
            return Ok(resolved);
        }
    }
    let resolved = simulate(suites, packages, &dir)?;
    let text: String = resolved.iter().map(|(n, v)| format!("{n} {v}\n")).collect();
    fs::write(&answer, text).map_err(Error::io("writing", &answer))?;
    Ok(resolved)
}

/// The `apt-get --simulate` behind [`resolve`], with its scratch files in `dir`.
fn simulate(suites: &[Suite], packages: &[String], dir: &Path) -> Result<Vec<(String, String)>> {
    let empty = dir.join("empty");
    fs::create_dir_all(&empty).map_err(Error::io("creating apt's scratch", &empty))?;
    let sources = dir.join("sources.list");
    let lines: String = suites.iter().map(|s| s.source_line() + "\n").collect();
    write_if_changed(&sources, &lines)?;
    let status = dir.join("status");
    write_if_changed(&status, "")?;
    let opt = |key: &str, value: &Path| format!("{key}={}", value.display());
    let mut cmd = Command::new("apt-get");
    for setting in [
        opt("Dir::Etc::SourceList", &sources),
        opt("Dir::Etc::SourceParts", &empty),
        opt("Dir::Etc::Preferences", &empty.join("none")),
        opt("Dir::Etc::PreferencesParts", &empty),
        opt("Dir::State::Lists", Path::new(APT_LISTS)),
        opt("Dir::State::status", &status),
        opt("Dir::Cache", dir),
        opt("Dir::Cache::pkgcache", &dir.join("pkgcache.bin")),
        opt("Dir::Cache::srcpkgcache", &dir.join("srcpkgcache.bin")),
        // Reads only; the host's apt may be busy with its own lock.
        "Debug::NoLocking=1".to_string(),
        "APT::Install-Recommends=false".to_string(),
        format!("APT::Architecture={ARCH}"),
        format!("APT::Architectures={ARCH}"),
    ] {
        cmd.arg("-o").arg(setting);
    }
    // minbase: Essential and Priority: required packages, plus apt.
    cmd.args([
        "--simulate",
        "install",
        "?essential",
        "?priority(required)",
        "apt",
    ])
    .args(packages)
    .env("LC_ALL", "C");
    let out = tool::output(&mut cmd).map_err(|e| match e {
        Error::ToolFailed { ref stderr, .. } => match missing_package(stderr) {
            Some(package) => Error::Package {
                reason: format!(
                    "not in the lists of {} (check the name, or run `apt-get update`)",
                    suites
                        .iter()
                        .map(|s| s.suite.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                package,
            },
            None => e,
        },
        other => other,
    })?;
    let mut resolved = parse_simulation(&out);
    resolved.sort();
    if resolved.is_empty() {
        return Err(Error::Invalid(format!(
            "apt-get --simulate installed nothing:\n{out}"
        )));
    }
    Ok(resolved)
}

/// Writes `path` only when its content differs: apt rebuilds its package cache (seconds)
/// whenever the sources list or the status file is newer than the cache.
fn write_if_changed(path: &Path, content: &str) -> Result<()> {
    if fs::read(path).is_ok_and(|old| old == content.as_bytes()) {
        return Ok(());
    }
    fs::write(path, content).map_err(Error::io("writing", path))
}

/// `Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []` → (libc6, 2.36-…).
fn parse_simulation(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("Inst ")?;
            let (name, rest) = rest.split_once(" (")?;
            let version = rest.split_whitespace().next()?;
            Some((name.to_string(), version.to_string()))
        })
        .collect()
}

/// The package of apt's `E: Unable to locate package NAME`.
fn missing_package(stderr: &str) -> Option<String> {
    stderr.lines().find_map(|line| {
        line.split("Unable to locate package ")
            .nth(1)
            .map(|p| p.trim().to_string())
    })
}

/// Builds the Debian template `loaded` into `args.out()`, or returns the manifest
/// already there when the cache key matches.
pub fn build(args: &Args, loaded: &Loaded, progress: &Progress) -> Result<Manifest> {
    if !deps::is_root()? {
        return Err(Error::Invalid(
            "building a Debian template needs root: mmdebstrap's root mode writes every \
             file with its real owner (run `cargo xtask image --template NAME` as root)"
                .into(),
        ));
    }
    tool::require(&[
        "mmdebstrap",
        "mkfs.erofs",
        "apt-get",
        "dpkg-query",
        "chroot",
        "sha256sum",
    ])?;
    let spec = &loaded.spec;
    let suites = suites()?;
    progress.step(&format!(
        "resolving {} packages from apt's lists of {}",
        spec.packages.len(),
        suites
            .iter()
            .map(|s| format!("{} {}", s.uri, s.suite))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let resolved = resolve(&suites, &spec.packages, &args.cache)?;
    progress.step(&format!("  {} packages in the tree", resolved.len()));
    let boot = boot_stage(args, progress, true)?;
    let mmdebstrap = tool::output(Command::new("mmdebstrap").arg("--version"))?;

    let mut key = Sha256::new();
    key.update(format!("{BUILDER}\nspec {}\n{}", loaded.hash, mmdebstrap.trim()).as_bytes());
    for suite in &suites {
        key.update(format!("\nsource {}", suite.source_line()).as_bytes());
    }
    for (name, version) in &resolved {
        key.update(format!("\n{name} {version}").as_bytes());
    }
    for part in [&boot.silkd, &boot.vmlinuz, &boot.initramfs] {
        key.update(format!("\n{}", hex::encode(Sha256::digest(part))).as_bytes());
    }
    let cache_key = hex::encode(key.finalize());
    let out = args.out();
    if let Some(manifest) = cached(&out, &cache_key) {
        progress.step(&format!(
            "cached: {} is up to date (key {})",
            out.display(),
            &cache_key[..16]
        ));
        return Ok(manifest);
    }

    let staging = sibling(&out, "new")?;
    apt::recreate_dir(&staging)?;
    let result = (|| {
        let script = staging.join("customize.sh");
        fs::write(&script, customize_script(loaded))
            .map_err(Error::io("writing the customize hook", &script))?;
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755))
            .map_err(Error::io("setting the customize hook's mode", &script))?;
        progress.step("mmdebstrap --variant=minbase (its own progress follows)");
        tool::stream(
            "mmdebstrap",
            &mut mmdebstrap_command(spec, &suites, &script, &staging.join("rootfs")),
        )?;
        fs::remove_file(&script).map_err(Error::io("removing the customize hook", &script))?;
        let root = staging.join("rootfs");
        let entry = rootfs::passwd_entry(&root, &spec.user.name).ok_or_else(|| {
            Error::Invalid(format!(
                "user {} is not in the built /etc/passwd",
                spec.user.name
            ))
        })?;
        let template = manifest::Template {
            name: loaded.name.clone(),
            from: Source::Debian,
            source_digest: loaded.hash.clone(),
            cache_key: Some(cache_key.clone()),
            silkd: String::new(),
            rootfs_image: None,
            user: manifest::User {
                name: entry.name,
                uid: entry.uid,
                gid: entry.gid,
                home: entry.home,
                shell: entry.shell,
                sudo: spec.user.sudo,
            },
            workdir: spec.workdir().to_string(),
            env: spec.env.clone(),
        };
        rootfs::complete(args, progress, &boot, &staging, template)
    })();
    if result.is_err() {
        discard(&staging);
    }
    result
}

/// Removes a failed build's staging directory, unless something is still mounted below
/// it (mmdebstrap mounts /dev, /proc and /sys into the chroot): deleting through a
/// leftover bind mount of /dev would delete the host's device nodes.
fn discard(staging: &Path) {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = staging.to_string_lossy();
    if mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|point| point.starts_with(prefix.as_ref()))
    {
        eprintln!(
            "image: leaving {} in place: something is still mounted below it",
            staging.display()
        );
    } else {
        let _ = fs::remove_dir_all(staging);
    }
}

fn mmdebstrap_command(spec: &Spec, suites: &[Suite], script: &Path, root: &Path) -> Command {
    let mut cmd = Command::new("mmdebstrap");
    cmd.env("SOURCE_DATE_EPOCH", EPOCH.to_string())
        .env("LC_ALL", "C.UTF-8")
        .args([
            "--variant=minbase",
            "--mode=root",
            "--format=directory",
            // apt inside works from the lists that `resolve` read, not fresh ones, so
            // the versions installed are the versions the cache key names.
            "--skip=update",
        ]);
    let lists: Vec<String> = suites
        .iter()
        .flat_map(|s| &s.lists)
        .map(|p| sh_quote(&p.to_string_lossy()))
        .collect();
    cmd.arg(format!(
        "--setup-hook=mkdir -p \"$1/var/lib/apt/lists\" && cp {} \"$1/var/lib/apt/lists/\"",
        lists.join(" ")
    ));
    if !spec.packages.is_empty() {
        cmd.arg(format!("--include={}", spec.packages.join(",")));
    }
    cmd.arg(format!(
        "--customize-hook=sh {} \"$1\"",
        sh_quote(&script.to_string_lossy())
    ));
    cmd.arg(SUITE).arg(root);
    for suite in suites {
        cmd.arg(suite.source_line());
    }
    cmd
}

/// The shell hook mmdebstrap runs with the finished tree as `$1` (its chroot has /dev,
/// /proc, /sys and the host's resolv.conf, which pip needs). Every change to the tree
/// happens through `chroot`, so paths resolve inside the tree, never on the host.
pub fn customize_script(loaded: &Loaded) -> String {
    let spec = &loaded.spec;
    let user = &spec.user;
    let q = |s: &str| sh_quote(s);
    let mut s = String::from(
        "#!/bin/sh\n# Generated by xtask (image/debian.rs); run by mmdebstrap as root.\n\
         set -eu\nroot=\"$1\"\nin_root() { chroot \"$root\" \"$@\"; }\n",
    );
    if user.uid != 0 {
        s += &format!(
            "in_root useradd --uid {} --user-group --create-home --home-dir {} --shell {} {}\n",
            user.uid,
            q(&user.home),
            q(spec.shell()),
            q(&user.name)
        );
        if user.sudo {
            s += &format!(
                "in_root sh -c 'umask 0337 && printf \"%s ALL=(ALL:ALL) NOPASSWD: ALL\\n\" \
                 \"$1\" > /etc/sudoers.d/90-template-user' sh {}\n",
                q(&user.name)
            );
        }
    } else {
        s += &format!("in_root mkdir -p {}\n", q(&user.home));
    }
    for (file, src) in spec.files.iter().zip(&loaded.sources) {
        // Files under the user's home belong to the user, as if they had written them.
        let owner = if file.dest.starts_with(&format!("{}/", user.home)) {
            user.uid
        } else {
            0
        };
        s += &format!(
            "in_root sh -c 'mkdir -p \"$(dirname \"$1\")\" && cat > \"$1\" && \
             chown {owner}:{owner} \"$1\" && chmod {:o} \"$1\"' sh {} < {}\n",
            file.mode,
            q(&file.dest),
            q(&src.to_string_lossy())
        );
    }
    if !spec.pip.is_empty() {
        let requirements: Vec<String> = spec.pip.iter().map(|r| q(r)).collect();
        s += &format!(
            "in_root env PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip \
             install --break-system-packages --root-user-action=ignore --no-input {}\n",
            requirements.join(" ")
        );
    }
    s += &format!(
        "[ -e \"$root\"{wd} ] || in_root install -d -o {uid} -g {uid} {wd}\n",
        wd = q(spec.workdir()),
        uid = user.uid
    );
    // mmdebstrap copies these from the host; fixed contents keep the image the same on
    // every machine. Networking is off in sandboxes, so resolv.conf stays empty.
    s += "in_root sh -c 'printf \"sandbox\\n\" > /etc/hostname && : > /etc/resolv.conf && \
          printf \"127.0.0.1 localhost\\n127.0.1.1 sandbox\\n::1 localhost ip6-localhost\\n\" \
          > /etc/hosts'\n";
    s
}

/// `s` as one single-quoted shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::spec;

    #[test]
    fn list_files_need_a_release_and_packages_of_the_suite() {
        let dir = tempfile::tempdir().unwrap();
        let touch = |n: &str| fs::write(dir.path().join(n), "").unwrap();
        touch("deb.debian.org_debian_dists_bookworm_InRelease");
        touch("deb.debian.org_debian_dists_bookworm-updates_InRelease");
        touch("deb.debian.org_debian_dists_bookworm-backports_main_binary-amd64_Packages.lz4");
        let uri = "http://deb.debian.org/debian/";
        assert!(list_files(dir.path(), uri, "bookworm").unwrap().is_empty());
        touch("deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.lz4");
        touch("deb.debian.org_debian_dists_bookworm_main_binary-i386_Packages.lz4");
        let names: Vec<String> = list_files(dir.path(), uri, "bookworm")
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "deb.debian.org_debian_dists_bookworm_InRelease",
                "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.lz4"
            ]
        );
        assert!(list_files(dir.path(), uri, "bookworm-updates")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn simulation_output_and_missing_packages_parse() {
        let out = "NOTE: This is only a simulation!\n\
                   Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []\n\
                   Conf libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64])\n\
                   Inst busybox (1:1.35.0-4+b3 Debian:12.15/oldstable [amd64])\n";
        assert_eq!(
            parse_simulation(out),
            [
                ("libc6".to_string(), "2.36-9+deb12u14".to_string()),
                ("busybox".to_string(), "1:1.35.0-4+b3".to_string())
            ]
        );
        assert_eq!(
            missing_package("Reading package lists...\nE: Unable to locate package nosuch\n")
                .as_deref(),
            Some("nosuch")
        );
    }

    #[test]
    fn the_customize_hook_quotes_every_value_and_works_through_chroot() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("rc"), "x").unwrap();
        fs::write(
            dir.path().join("t.toml"),
            "from = \"debian\"\npackages = [\"sudo\", \"python3-pip\"]\n\
             pip = [\"requests==2.31.0\"]\n\
             [[files]]\nsrc = \"rc\"\ndest = \"/home/agent/.bashrc\"\n\
             [[files]]\nsrc = \"rc\"\ndest = \"/etc/motd\"\nmode = 0o600\n\
             [user]\nname = \"agent\"\nuid = 1001\nhome = \"/home/agent\"\nsudo = true\n",
        )
        .unwrap();
        let loaded = spec::load(dir.path(), "t").unwrap();
        let script = customize_script(&loaded);
        assert!(script.contains(
            "in_root useradd --uid 1001 --user-group --create-home --home-dir '/home/agent' \
             --shell '/bin/sh' 'agent'\n"
        ));
        assert!(script.contains("NOPASSWD: ALL"));
        assert!(
            script.contains("chown 1001:1001 \"$1\" && chmod 644 \"$1\"' sh '/home/agent/.bashrc'")
        );
        assert!(script.contains("chown 0:0 \"$1\" && chmod 600 \"$1\"' sh '/etc/motd'"));
        assert!(script.contains("--root-user-action=ignore --no-input 'requests==2.31.0'\n"));
        // Nothing writes to the tree except through the chroot.
        for line in script.lines().skip(5) {
            assert!(line.contains("in_root "), "{line}");
        }
        assert_eq!(sh_quote("a'b"), "'a'\\''b'");
    }
}
