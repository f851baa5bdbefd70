//! Debian packages for the image: `apt-cache` picks the candidate version,
//! `apt-get download` fetches the `.deb`, `dpkg-deb -x` unpacks it. Downloads and
//! unpacked trees are cached by package name and version, so a rebuild reuses them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{tool, Error, Result};

/// One package at one exact version.
#[derive(Clone, Debug)]
pub struct Package {
    pub name: String,
    pub version: String,
    /// The raw `Depends:` field of the candidate, empty if none.
    pub depends: String,
}

/// The candidate (the version `apt-get install` would pick) of `name`.
pub fn candidate(name: &str) -> Result<Package> {
    let not_listed = |detail: String| Error::Package {
        package: name.to_string(),
        reason: format!(
            "not in apt's package lists ({detail}); run `apt-get update` on a Debian 12 machine"
        ),
    };
    let text = tool::output(Command::new("apt-cache").args(["show", "--no-all-versions", name]))
        .map_err(|e| match e {
            Error::ToolFailed { stderr, .. } => not_listed(stderr),
            other => other,
        })?;
    let field = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    };
    let version = field("Version").ok_or_else(|| not_listed("no Version field".into()))?;
    Ok(Package {
        name: name.to_string(),
        version,
        depends: field("Depends").unwrap_or_default(),
    })
}

/// Names of `package`'s dependencies (alternatives and version bounds dropped).
pub fn depends_names(package: &Package) -> Vec<String> {
    package
        .depends
        .split(',')
        .flat_map(|alternatives| alternatives.split('|'))
        .filter_map(|dep| dep.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// A directory of downloaded `.deb` files and their unpacked trees.
pub struct Cache {
    dir: PathBuf,
}

/// What [`Cache::unpack`] did, for progress lines.
pub enum Fetched {
    Cached,
    Downloaded,
}

impl Cache {
    pub fn new(dir: &Path) -> Cache {
        Cache {
            dir: dir.to_path_buf(),
        }
    }

    /// The unpacked tree of `package`, downloading and unpacking it unless a previous
    /// run already did. Work happens in temporary directories renamed into place, so
    /// an interrupted run never leaves a half-written entry behind.
    pub fn unpack(&self, package: &Package) -> Result<(PathBuf, Fetched)> {
        let key = format!("{}_{}", package.name, package.version.replace(':', "%3a"));
        let tree = self.dir.join("unpacked").join(&key);
        if tree.is_dir() {
            return Ok((tree, Fetched::Cached));
        }
        let deb = self.download(package, &key)?;
        let scratch = self
            .dir
            .join("unpacked")
            .join(format!(".{key}.tmp-{}", std::process::id()));
        recreate_dir(&scratch)?;
        tool::output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&scratch))?;
        fs::rename(&scratch, &tree)
            .map_err(Error::io("moving unpacked package into place", &tree))?;
        Ok((tree, Fetched::Downloaded))
    }

    fn download(&self, package: &Package, key: &str) -> Result<PathBuf> {
        let deb = self.dir.join("debs").join(format!("{key}.deb"));
        if deb.is_file() {
            return Ok(deb);
        }
        let scratch = self
            .dir
            .join("debs")
            .join(format!(".{key}.tmp-{}", std::process::id()));
        recreate_dir(&scratch)?;
        tool::output(
            Command::new("apt-get")
                .arg("download")
                .arg(format!("{}={}", package.name, package.version))
                .current_dir(&scratch),
        )
        .map_err(|e| Error::Package {
            package: package.name.clone(),
            reason: format!("download of version {} failed: {e}", package.version),
        })?;
        let fetched = fs::read_dir(&scratch)
            .map_err(Error::io("reading download directory", &scratch))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|ext| ext == "deb"))
            .ok_or_else(|| Error::Package {
                package: package.name.clone(),
                reason: "`apt-get download` succeeded but left no .deb file".into(),
            })?;
        fs::rename(&fetched, &deb).map_err(Error::io("moving download into the cache", &deb))?;
        fs::remove_dir_all(&scratch).map_err(Error::io("removing download directory", &scratch))?;
        Ok(deb)
    }
}

/// Creates `dir` empty, removing what a crashed earlier run may have left there.
pub fn recreate_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).map_err(Error::io("removing stale directory", dir))?;
    }
    fs::create_dir_all(dir).map_err(Error::io("creating directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_package_is_named_with_what_to_do() {
        let err = candidate("silk-no-such-package").unwrap_err().to_string();
        assert!(
            err.contains("`silk-no-such-package`")
                && err.contains("No packages found")
                && err.contains("apt-get update"),
            "{err}"
        );
    }

    #[test]
    fn depends_names_drop_versions_and_keep_alternatives() {
        let package = Package {
            name: "linux-image-cloud-amd64".into(),
            version: "6.1.192-2".into(),
            depends: "linux-image-6.1.0-56-cloud-amd64 (= 6.1.192-2), a | b (>= 1)".into(),
        };
        assert_eq!(
            depends_names(&package),
            ["linux-image-6.1.0-56-cloud-amd64", "a", "b"]
        );
    }
}
