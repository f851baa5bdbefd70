//! A template's runtime metadata: the default user, working directory and environment
//! its commands get, read from the image's `manifest.json` (`template` block, written by
//! `cargo xtask image`) when the config loads, and rendered as silkd's flags for both
//! engines (the process engine's command line, the qemu engine's kernel command line),
//! together with the template's own config keys for silkd (`detach_ring_bytes`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::config::TemplateConfig;
use crate::error::{Error, Result};

/// Smallest `detach_ring_bytes`: less could not hold one line of a terminal's output.
pub const MIN_DETACH_RING: u64 = 1024;
/// Largest `detach_ring_bytes`: silkd's own bound on `--detach-ring` (64 MiB; it keeps at
/// most 64 detached commands, so rings stay within what a guest can hold).
pub const MAX_DETACH_RING: u64 = 64 << 20;

/// Larger manifests are refused unread: the real ones are a few KiB plus a package list.
const MAX_MANIFEST: u64 = 16 << 20;
/// Longest name, path or env string accepted from a manifest (silkd and the kernel
/// command line take them as arguments).
const MAX_STRING: usize = 4096;

/// The template's default user.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TemplateUser {
    /// Login name, present in the tree's `/etc/passwd`.
    pub name: String,
    /// Its uid inside the sandbox.
    pub uid: u32,
    /// Its primary gid inside the sandbox.
    pub gid: u32,
    /// Its home directory (absolute), writable in every sandbox.
    pub home: String,
    /// Its login shell.
    #[serde(default)]
    pub shell: Option<String>,
}

/// What a template says about the commands run in it. `Default` is a template with no
/// metadata (`base`, a plain `rootfs`): silkd's own user, cwd and environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateMeta {
    /// The user commands run as unless a request names one.
    pub user: Option<TemplateUser>,
    /// The working directory of commands that give no cwd.
    pub workdir: Option<String>,
    /// Environment set for every command, before a request's own.
    pub env: BTreeMap<String, String>,
}

/// The manifest's `template` block; every field optional so that `base`'s minimal
/// manifest (and older ones) load. Unknown fields are the builder's (name, digests).
#[derive(Deserialize)]
struct Block {
    #[serde(default)]
    user: Option<TemplateUser>,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(default)]
    template: Option<Block>,
}

impl TemplateMeta {
    /// Reads `IMAGE/manifest.json`. An image without one (a hand-made tree) has no
    /// metadata; a manifest that exists but does not parse or holds unusable values is a
    /// config error naming the file.
    pub fn load(image: &Path) -> Result<TemplateMeta> {
        use std::io::Read;
        let path = image.join("manifest.json");
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(TemplateMeta::default())
            }
            Err(e) => return Err(Error::Config(format!("reading {}: {e}", path.display()))),
        };
        let mut text = Vec::new();
        file.take(MAX_MANIFEST + 1)
            .read_to_end(&mut text)
            .map_err(|e| Error::Config(format!("reading {}: {e}", path.display())))?;
        if text.len() as u64 > MAX_MANIFEST {
            return Err(Error::Config(format!(
                "{} is over {MAX_MANIFEST} bytes",
                path.display()
            )));
        }
        TemplateMeta::parse(&text)
            .map_err(|e| Error::Config(format!("template metadata in {}: {e}", path.display())))
    }

    /// Parses and checks a manifest's bytes.
    pub fn parse(json: &[u8]) -> std::result::Result<TemplateMeta, String> {
        let m: Manifest = serde_json::from_slice(json).map_err(|e| e.to_string())?;
        let Some(b) = m.template else {
            return Ok(TemplateMeta::default());
        };
        let meta = TemplateMeta {
            user: b.user,
            workdir: b.workdir,
            env: b.env,
        };
        meta.check()?;
        Ok(meta)
    }

    fn check(&self) -> std::result::Result<(), String> {
        let plain = |what: &str, s: &str| {
            // No `"` either: the qemu engine passes these on the kernel command line.
            if s.is_empty() || s.len() > MAX_STRING || s.contains(['\0', '\n', '"']) {
                Err(format!(
                    "{what} must be 1 to {MAX_STRING} bytes without NUL, newline or '\"'"
                ))
            } else {
                Ok(())
            }
        };
        let absolute = |what: &str, s: &str| {
            plain(what, s)?;
            if s.starts_with('/') {
                Ok(())
            } else {
                Err(format!("{what} {s:?} must be an absolute path"))
            }
        };
        if let Some(u) = &self.user {
            plain("user.name", &u.name)?;
            if u.name.contains([':', ' ', '=']) {
                return Err(format!("user.name {:?} is not a login name", u.name));
            }
            absolute("user.home", &u.home)?;
            if let Some(shell) = &u.shell {
                absolute("user.shell", shell)?;
            }
        }
        if let Some(w) = &self.workdir {
            absolute("workdir", w)?;
        }
        for (k, v) in &self.env {
            let name_ok = k
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !name_ok || k.len() > MAX_STRING {
                return Err(format!("env name {k:?} must match [A-Za-z_][A-Za-z0-9_]*"));
            }
            if v.contains(['\0', '\n', '"']) || v.len() > MAX_STRING {
                return Err(format!(
                    "env value of {k} holds NUL, newline or '\"', or is too long"
                ));
            }
        }
        Ok(())
    }

    /// silkd's flags for this template: `--user NAME`, `--workdir DIR`, `--env K=V`...
    /// Each flag and its value are separate items (a command line's argv; the qemu engine
    /// joins them for the kernel command line, whose own quoting is its business).
    pub fn silkd_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(u) = &self.user {
            a.extend(["--user".to_string(), u.name.clone()]);
        }
        if let Some(w) = &self.workdir {
            a.extend(["--workdir".to_string(), w.clone()]);
        }
        for (k, v) in &self.env {
            a.extend(["--env".to_string(), format!("{k}={v}")]);
        }
        a
    }

    /// The home directory commands get by default: the user's, else root's.
    pub fn home(&self) -> &str {
        self.user.as_ref().map_or("/root", |u| u.home.as_str())
    }
}

impl TemplateConfig {
    /// All of silkd's flags for this template, for both engines: the image metadata's
    /// ([`TemplateMeta::silkd_args`]) and the config's detach ring.
    pub fn silkd_args(&self) -> Vec<String> {
        let mut a = self.meta.silkd_args();
        a.extend(detach_ring_args(self.detach_ring_bytes));
        a
    }

    /// Checks the template's own silkd keys; the message names the template and the key.
    pub fn check_silkd_keys(&self, name: &str) -> Result<()> {
        match self.detach_ring_bytes {
            Some(n) if !(MIN_DETACH_RING..=MAX_DETACH_RING).contains(&n) => {
                Err(Error::Config(format!(
                    "template {name:?}: detach_ring_bytes {n} must be {MIN_DETACH_RING} to \
                     {MAX_DETACH_RING} (64 MiB)"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// `--detach-ring N` when a ring size is configured; nothing (silkd's default) otherwise,
/// so goldens of configs without the key keep their stamps.
pub fn detach_ring_args(bytes: Option<u64>) -> Vec<String> {
    bytes.map_or_else(Vec::new, |n| vec!["--detach-ring".into(), n.to_string()])
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: &str = r#"{"format": 1, "template": {"name": "default", "from": "debian",
        "user": {"name": "user", "uid": 1000, "gid": 1000, "home": "/home/user",
                 "shell": "/bin/bash", "sudo": true},
        "workdir": "/home/user", "env": {"LANG": "C.UTF-8", "EDITOR": "vi"}}}"#;

    #[test]
    fn a_debian_template_renders_silkd_flags() {
        let m = TemplateMeta::parse(DEFAULT.as_bytes()).unwrap();
        assert_eq!(m.user.as_ref().unwrap().uid, 1000);
        assert_eq!(m.home(), "/home/user");
        assert_eq!(
            m.silkd_args(),
            [
                "--user",
                "user",
                "--workdir",
                "/home/user",
                "--env",
                "EDITOR=vi",
                "--env",
                "LANG=C.UTF-8"
            ]
        );
    }

    #[test]
    fn minimal_and_absent_blocks_mean_no_metadata() {
        for json in [
            r#"{"format": 1}"#,
            r#"{"template": {"name": "base"}}"#,
            "{}",
        ] {
            let m = TemplateMeta::parse(json.as_bytes()).unwrap();
            assert_eq!(m, TemplateMeta::default(), "{json}");
            assert!(m.silkd_args().is_empty());
            assert_eq!(m.home(), "/root");
        }
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            TemplateMeta::load(dir.path()).unwrap(),
            TemplateMeta::default()
        );
    }

    #[test]
    fn the_detach_ring_is_a_silkd_flag_within_bounds() {
        let mut t = TemplateConfig {
            rootfs: "/r".into(),
            image: None,
            meta: TemplateMeta::parse(DEFAULT.as_bytes()).unwrap(),
            detach_ring_bytes: None,
        };
        assert_eq!(t.silkd_args(), t.meta.silkd_args());
        t.check_silkd_keys("t").unwrap();
        t.detach_ring_bytes = Some(4096);
        assert_eq!(t.silkd_args()[8..], ["--detach-ring", "4096"]);
        t.check_silkd_keys("t").unwrap();
        for bad in [0, MIN_DETACH_RING - 1, MAX_DETACH_RING + 1, u64::MAX] {
            t.detach_ring_bytes = Some(bad);
            let e = t.check_silkd_keys("t").unwrap_err().to_string();
            assert!(e.contains("template \"t\": detach_ring_bytes"), "{e}");
        }
    }

    /// Bad JSON, missing or mistyped fields, NUL and newlines, relative paths and bad env
    /// names are errors naming what is wrong, never a panic or a silent default.
    #[test]
    fn hostile_manifests_are_refused() {
        let user = |fields: &str| format!(r#"{{"template": {{"user": {{{fields}}}}}}}"#);
        let cases = [
            "not json".to_string(),
            "[1, 2]".into(),
            r#"{"template": 5}"#.into(),
            user(r#""name": "user""#),
            user(r#""name": "user", "uid": -1, "gid": 0, "home": "/h""#),
            user(r#""name": "user", "uid": 1e3, "gid": 0, "home": "/h""#),
            user(r#""name": "u\u0000x", "uid": 1, "gid": 1, "home": "/h""#),
            user(r#""name": "", "uid": 1, "gid": 1, "home": "/h""#),
            user(r#""name": "a:b", "uid": 1, "gid": 1, "home": "/h""#),
            user(r#""name": "u", "uid": 1, "gid": 1, "home": "home/u""#),
            r#"{"template": {"workdir": "relative"}}"#.into(),
            r#"{"template": {"workdir": "/a\nb"}}"#.into(),
            r#"{"template": {"env": {"A": "x\u0000y"}}}"#.into(),
            r#"{"template": {"env": {"A=B": "x"}}}"#.into(),
            r#"{"template": {"env": {"": "x"}}}"#.into(),
            r#"{"template": {"env": {"1A": "x"}}}"#.into(),
            r#"{"template": {"env": {"A": 1}}}"#.into(),
        ];
        for json in cases {
            assert!(TemplateMeta::parse(json.as_bytes()).is_err(), "{json}");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("manifest.json"), "{").unwrap();
        let e = TemplateMeta::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("manifest.json"), "{e}");
    }
}
