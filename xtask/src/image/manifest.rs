//! `manifest.json`: what the image is made of and the sha256 of each artifact, plus
//! one image digest that changes whenever any artifact does (sandboxd stamps goldens
//! with it), and how commands run in the template (user, working directory, env).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::spec::Source;

/// Bumped when a field changes meaning.
pub const FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    pub kernel: Kernel,
    pub busybox: PackageVersion,
    /// Absolute paths inside the image, in load order; the same lines as
    /// `/etc/silkd/modules`.
    pub modules: Vec<String>,
    /// Artifact name → lowercase hex sha256. `vmlinuz` and `initramfs.cpio.gz` are
    /// file digests; `rootfs` is the tree digest of the `rootfs/` directory
    /// (see docs/image.md).
    pub artifacts: BTreeMap<String, String>,
    /// `sha256:` + [`image_digest`] of `artifacts`.
    pub image_digest: String,
    /// How commands run in this template, and where it came from.
    pub template: Template,
    /// Every Debian package in the root filesystem (`dpkg-query` in the tree), by name;
    /// empty for `base` (see `busybox`) and for OCI images without dpkg.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<PackageVersion>,
}

/// What the engines read to run commands in the template. docs/templates.md.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    pub name: String,
    pub from: Source,
    /// sha256 of the spec and its files (`debian`, `busybox`), or the OCI image
    /// manifest's digest (`oci`).
    pub source_digest: String,
    /// The build's cache key: equal keys, equal images. None for `busybox`, which
    /// rebuilds from its package cache in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_key: Option<String>,
    /// silkd's absolute path inside the root filesystem.
    pub silkd: String,
    /// The read-only filesystem image of `rootfs/`, relative to the output directory;
    /// None for `busybox`, whose root filesystem is the initramfs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_image: Option<String>,
    pub user: User,
    /// Where commands start unless a request says otherwise.
    pub workdir: String,
    /// Set for every command, on top of the engine's own (`HOME`, `USER`, `PATH`, …).
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
    /// Passwordless sudo is configured for this user.
    pub sudo: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kernel {
    /// The versioned Debian package, e.g. `linux-image-6.1.0-56-cloud-amd64`.
    pub package: String,
    pub version: String,
    /// What `uname -r` prints inside the guest, e.g. `6.1.0-56-cloud-amd64`.
    pub release: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageVersion {
    pub package: String,
    pub version: String,
}

/// sha256 (hex) over the lines `<name> <sha256>\n` of every artifact, in name order.
pub fn image_digest(artifacts: &BTreeMap<String, String>) -> String {
    let mut hasher = Sha256::new();
    for (name, digest) in artifacts {
        hasher.update(format!("{name} {digest}\n").as_bytes());
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_digest_covers_every_artifact_name_and_digest() {
        let artifacts = |a: &str, b: &str| {
            BTreeMap::from([
                ("vmlinuz".to_string(), a.to_string()),
                ("rootfs".to_string(), b.to_string()),
            ])
        };
        let base = image_digest(&artifacts("aa", "bb"));
        // sha256("rootfs bb\nvmlinuz aa\n"), computed with sha256sum.
        assert_eq!(
            base,
            "1e30b11ff60cfabc853f40acc33a5dc6d998bed93d444076e426c5365ee0beb8"
        );
        assert_ne!(image_digest(&artifacts("ab", "bb")), base);
        assert_ne!(image_digest(&artifacts("aa", "ba")), base);
    }
}
