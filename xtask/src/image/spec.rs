//! Template specs, `templates/NAME.toml`: parsed strictly (unknown keys are errors) and
//! validated before anything runs, because every value ends up in a shell hook run as
//! root or in a path on the host. It owns what a spec may say, not how it is built.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// How the root filesystem is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// busybox-static and silkd, assembled in memory (`base`).
    Busybox,
    /// `mmdebstrap --variant=minbase` of bookworm plus `packages`.
    Debian,
    /// Layers of an OCI image (`--from-oci`); never written in a spec.
    Oci,
}

/// `templates/NAME.toml`. docs/templates.md describes every key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    #[serde(default)]
    pub description: String,
    pub from: Source,
    /// Debian package names, installed on top of minbase.
    #[serde(default)]
    pub packages: Vec<String>,
    /// PyPI requirements (`name` or `name==version`), installed with the image's pip.
    #[serde(default)]
    pub pip: Vec<String>,
    #[serde(default)]
    pub files: Vec<FileSpec>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub user: User,
    /// Where commands start; the user's home when absent.
    pub workdir: Option<String>,
}

/// One file copied from next to the spec into the image.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// Relative to the spec's directory, and inside it.
    pub src: String,
    /// Absolute path in the image.
    pub dest: String,
    /// Permission bits, e.g. `0o644` (TOML octal integer).
    #[serde(default = "default_mode")]
    pub mode: u32,
}

fn default_mode() -> u32 {
    0o644
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub home: String,
    /// Passwordless sudo (needs the `sudo` package).
    #[serde(default)]
    pub sudo: bool,
    /// Login shell; `/bin/sh` when absent.
    pub shell: Option<String>,
}

/// A spec that passed [`Spec::validate`], with where it came from and its hash.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub name: String,
    pub spec: Spec,
    /// The directory holding the spec; `files` sources are inside it.
    pub dir: PathBuf,
    /// `files` with their sources resolved (canonical, inside `dir`).
    pub sources: Vec<PathBuf>,
    /// sha256 (hex) of the spec's bytes and of every `files` source (name and content).
    pub hash: String,
}

/// Template names become directory names under target/images and in the config.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "template name {name:?}: use 1-64 of a-z 0-9 - _, starting with a letter or digit"
        )))
    }
}

/// Reads, parses and validates `dir/NAME.toml`.
pub fn load(dir: &Path, name: &str) -> Result<Loaded> {
    check_name(name)?;
    let path = dir.join(format!("{name}.toml"));
    let text = fs::read_to_string(&path).map_err(Error::io("reading template spec", &path))?;
    let spec = parse(&text).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    let dir = fs::canonicalize(dir).map_err(Error::io("resolving templates directory", dir))?;
    let mut hasher = Sha256::new();
    hasher.update(text.as_bytes());
    let mut sources = Vec::new();
    for file in &spec.files {
        let src = resolve_source(&dir, &file.src)
            .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
        let data = fs::read(&src).map_err(Error::io("reading template file", &src))?;
        hasher.update(format!("\0file {} {}\n", file.src, data.len()).as_bytes());
        hasher.update(&data);
        sources.push(src);
    }
    Ok(Loaded {
        name: name.to_string(),
        spec,
        dir,
        sources,
        hash: hex::encode(hasher.finalize()),
    })
}

/// Parses and validates a spec's text; the error says which key is wrong and why.
pub fn parse(text: &str) -> std::result::Result<Spec, String> {
    let spec: Spec = toml::from_str(text).map_err(|e| e.message().to_string())?;
    spec.validate()?;
    Ok(spec)
}

impl Spec {
    /// Every rule a value must meet; all values reach a root shell or a host path.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.from == Source::Oci {
            return Err("`from = \"oci\"` is what `--from-oci PATH` builds, not a spec".into());
        }
        if self.from == Source::Busybox
            && !(self.packages.is_empty() && self.pip.is_empty() && self.files.is_empty())
        {
            return Err(
                "`from = \"busybox\"` takes no `packages`, `pip` or `files` (use `debian`)".into(),
            );
        }
        for package in &self.packages {
            if !is_debian_package(package) {
                return Err(format!(
                    "packages: {package:?} is not a Debian package name ([a-z0-9][a-z0-9+.-]+)"
                ));
            }
        }
        let has = |p: &str| self.packages.iter().any(|x| x == p);
        for requirement in &self.pip {
            if !is_pip_requirement(requirement) {
                return Err(format!(
                    "pip: {requirement:?} is not a plain requirement such as `name` or \
                     `name==1.2` (no options, URLs or paths)"
                ));
            }
        }
        if !self.pip.is_empty() && !has("python3-pip") {
            return Err("pip: installing PyPI packages needs `python3-pip` in packages".into());
        }
        for file in &self.files {
            check_relative_source(&file.src).map_err(|e| format!("files: src {e}"))?;
            check_image_path(&file.dest).map_err(|e| format!("files: dest {e}"))?;
            if file.dest == "/" {
                return Err("files: dest must name a file, not `/`".into());
            }
            if file.mode > 0o7777 {
                return Err(format!("files: mode {:o} is over 0o7777", file.mode));
            }
        }
        for (key, value) in &self.env {
            let key_ok = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !key_ok {
                return Err(format!("env: {key:?} is not a variable name"));
            }
            if value.contains('\0') {
                return Err(format!("env: {key} holds a NUL byte"));
            }
        }
        let user = &self.user;
        let name_ok = user.name.len() <= 32
            && user
                .name
                .starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && user
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if !name_ok {
            return Err(format!("user: name {:?} is not a user name", user.name));
        }
        if (user.name == "root") != (user.uid == 0) {
            return Err("user: uid 0 is `root` and `root` is uid 0".into());
        }
        // 65534 is nobody; above it uids stop being portable across tools.
        if user.uid >= 65534 {
            return Err(format!("user: uid {} is not below 65534", user.uid));
        }
        check_image_path(&user.home).map_err(|e| format!("user: home {e}"))?;
        if let Some(shell) = &user.shell {
            check_image_path(shell).map_err(|e| format!("user: shell {e}"))?;
        }
        if user.sudo && user.uid != 0 && !has("sudo") {
            return Err("user: sudo = true needs `sudo` in packages".into());
        }
        if self.from == Source::Busybox && (user.uid != 0 || user.sudo || user.shell.is_some()) {
            return Err("user: a busybox template runs as root only".into());
        }
        if let Some(workdir) = &self.workdir {
            check_image_path(workdir).map_err(|e| format!("workdir {e}"))?;
        }
        Ok(())
    }

    pub fn workdir(&self) -> &str {
        self.workdir.as_deref().unwrap_or(&self.user.home)
    }

    pub fn shell(&self) -> &str {
        self.user.shell.as_deref().unwrap_or("/bin/sh")
    }
}

/// Debian policy's package name rule; also keeps option-looking words (`-o…`) and list
/// separators out of mmdebstrap's `--include`.
fn is_debian_package(name: &str) -> bool {
    name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
}

/// A name with optional extras and version bounds: `a`, `a[b]==1.0`, `a>=1,<2`. No
/// options (`--index-url`), URLs or paths, which would reach beyond PyPI or the host.
fn is_pip_requirement(req: &str) -> bool {
    !req.is_empty()
        && req.len() <= 200
        && req.starts_with(|c: char| c.is_ascii_alphanumeric())
        && req
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.[],=<>!~".contains(c))
}

/// An absolute, normalised path inside the image: no `..`, `.`, `//` or odd bytes, so
/// it means the same inside the chroot as it says, and is safe in a shell word.
fn check_image_path(path: &str) -> std::result::Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("{path:?} is not absolute"));
    }
    if path.len() > 1 && path.ends_with('/') || path.contains("//") {
        return Err(format!("{path:?} is not normalised"));
    }
    if path.split('/').any(|part| part == ".." || part == ".") {
        return Err(format!("{path:?} has `.` or `..` components"));
    }
    if !path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+@".contains(c))
    {
        return Err(format!("{path:?} has characters outside [A-Za-z0-9/._-+@]"));
    }
    Ok(())
}

/// A relative path below the spec's directory, by its words alone.
fn check_relative_source(src: &str) -> std::result::Result<(), String> {
    let path = Path::new(src);
    if src.is_empty() || path.is_absolute() {
        return Err(format!(
            "{src:?} must be relative to the templates directory"
        ));
    }
    if path
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(format!("{src:?} leaves the templates directory"));
    }
    Ok(())
}

/// The canonical path of `src`, which must be a regular file inside `dir` after
/// symlinks are followed (a link in the templates directory cannot reach the host).
fn resolve_source(dir: &Path, src: &str) -> std::result::Result<PathBuf, String> {
    check_relative_source(src).map_err(|e| format!("files: src {e}"))?;
    let full = fs::canonicalize(dir.join(src)).map_err(|e| format!("files: src {src:?}: {e}"))?;
    if !full.starts_with(dir) {
        return Err(format!(
            "files: src {src:?} resolves to {}, outside the templates directory",
            full.display()
        ));
    }
    if !full.is_file() {
        return Err(format!("files: src {src:?} is not a regular file"));
    }
    Ok(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "from = \"debian\"\n[user]\nname = \"root\"\nuid = 0\nhome = \"/root\"\n";

    fn err(text: &str) -> String {
        parse(text).expect_err(text)
    }

    #[test]
    fn the_shipped_specs_parse() {
        let dir = crate::workspace_root().join("templates");
        let base = load(&dir, "base").unwrap();
        assert_eq!(base.spec.from, Source::Busybox);
        assert_eq!(base.spec.workdir(), "/");
        let default = load(&dir, "default").unwrap();
        assert_eq!(default.spec.user.name, "user");
        assert!(default.spec.user.sudo);
        assert_eq!(default.spec.workdir(), "/home/user");
        for package in ["python3", "python3-pip", "nodejs", "npm", "git", "sudo"] {
            assert!(
                default.spec.packages.iter().any(|p| p == package),
                "{package}"
            );
        }
    }

    #[test]
    fn a_full_spec_parses_every_key() {
        let spec = parse(
            "description = \"d\"\nfrom = \"debian\"\npackages = [\"python3-pip\", \"sudo\"]\n\
             pip = [\"requests==2.31.0\", \"rich[jupyter]>=13,<14\"]\nworkdir = \"/work\"\n\
             [[files]]\nsrc = \"conf/a.cfg\"\ndest = \"/etc/a.cfg\"\nmode = 0o600\n\
             [env]\nLANG = \"C.UTF-8\"\n\
             [user]\nname = \"agent\"\nuid = 1001\nhome = \"/home/agent\"\nsudo = true\n\
             shell = \"/bin/bash\"\n",
        )
        .unwrap();
        assert_eq!(spec.files[0].mode, 0o600);
        assert_eq!(spec.workdir(), "/work");
        assert_eq!(spec.shell(), "/bin/bash");
        assert_eq!(spec.env["LANG"], "C.UTF-8");
    }

    #[test]
    fn unknown_keys_and_oci_in_a_spec_are_refused() {
        assert!(err(&format!("extra = 1\n{MINIMAL}")).contains("unknown field `extra`"));
        // `sudo` belongs to [user], not to the top level.
        assert!(err(&format!("sudo = true\n{MINIMAL}")).contains("unknown field `sudo`"));
        let nested = MINIMAL.replace("uid = 0\n", "uid = 0\npassword = \"x\"\n");
        assert!(err(&nested).contains("unknown field `password`"));
        assert!(err(&MINIMAL.replace("debian", "oci")).contains("--from-oci"));
        assert!(err(&MINIMAL.replace("debian", "alpine")).contains("unknown variant"));
        assert!(err("from = \"debian\"\n").contains("missing field `user`"));
    }

    #[test]
    fn hostile_paths_in_files_are_refused() {
        let with_file = |src: &str, dest: &str| {
            format!("{MINIMAL}[[files]]\nsrc = \"{src}\"\ndest = \"{dest}\"\n")
        };
        for (src, dest, says) in [
            ("a", "../../etc/passwd", "not absolute"),
            ("a", "/etc/../../../x", "`..`"),
            ("a", "/etc/./x", "`..`"),
            ("a", "/", "not `/`"),
            ("a", "/etc/x;rm -rf ~", "characters"),
            ("a", "/etc/x/", "not normalised"),
            ("a", "/etc/$(id)", "characters"),
            ("/etc/shadow", "/x", "relative"),
            ("../secret", "/x", "leaves"),
            ("conf/../../secret", "/x", "leaves"),
        ] {
            let e = err(&with_file(src, dest));
            assert!(e.contains(says), "{src} → {dest}: {e}");
        }
    }

    #[test]
    fn a_source_symlinked_out_of_the_templates_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        fs::write(dir.path().join("inside"), "ok").unwrap();
        let spec = |src: &str| format!("{MINIMAL}[[files]]\nsrc = \"{src}\"\ndest = \"/etc/x\"\n");
        fs::write(dir.path().join("bad.toml"), spec("link")).unwrap();
        let e = load(dir.path(), "bad").unwrap_err().to_string();
        assert!(e.contains("outside the templates directory"), "{e}");
        fs::write(dir.path().join("good.toml"), spec("inside")).unwrap();
        let good = load(dir.path(), "good").unwrap();
        // The hash covers the files' content, not only the spec's text.
        fs::write(dir.path().join("inside"), "changed").unwrap();
        assert_ne!(load(dir.path(), "good").unwrap().hash, good.hash);
    }

    #[test]
    fn hostile_names_packages_and_requirements_are_refused() {
        for name in ["../etc", "", "A", "-x", "a/b", "a.b"] {
            assert!(check_name(name).is_err(), "{name}");
        }
        let e = load(Path::new("/nonexistent"), "../../etc/passwd").unwrap_err();
        assert!(e.to_string().contains("template name"), "{e}");
        let packages = |p: &str| format!("packages = [\"{p}\"]\n{MINIMAL}");
        for bad in ["-oAPT::X=1", "a,b", "Bash", "a b", "x"] {
            assert!(err(&packages(bad)).contains("Debian package"), "{bad}");
        }
        let pip = |r: &str| format!("packages = [\"python3-pip\"]\npip = [\"{r}\"]\n{MINIMAL}");
        for bad in [
            "--index-url=http://evil/",
            "-e .",
            "https://evil/x.whl",
            "/tmp/x.whl",
            "a; rm",
        ] {
            assert!(err(&pip(bad)).contains("plain requirement"), "{bad}");
        }
        let no_pip = format!("pip = [\"requests\"]\n{MINIMAL}");
        assert!(err(&no_pip).contains("python3-pip"));
    }

    #[test]
    fn hostile_users_env_and_workdirs_are_refused() {
        let user = |name: &str, uid: u32, extra: &str| {
            format!(
                "from = \"debian\"\n[user]\nname = \"{name}\"\nuid = {uid}\n\
                 home = \"/home/x\"\n{extra}"
            )
        };
        assert!(err(&user("root", 5, "")).contains("uid 0"));
        assert!(err(&user("u", 0, "")).contains("uid 0"));
        assert!(err(&user("u;id", 5, "")).contains("user name"));
        assert!(err(&user("u", 65534, "")).contains("below 65534"));
        assert!(err(&user("u", 5, "sudo = true\n")).contains("`sudo` in packages"));
        assert!(err(&user("u", 5, "shell = \"bash\"\n")).contains("not absolute"));
        let env = |k: &str| format!("{MINIMAL}[env]\n\"{k}\" = \"v\"\n");
        assert!(err(&env("A=B")).contains("variable name"));
        assert!(err(&env("1A")).contains("variable name"));
        let workdir = MINIMAL.replace("from", "workdir = \"../x\"\nfrom");
        assert!(err(&workdir).contains("not absolute"));
        let busybox = MINIMAL.replace("debian", "busybox");
        let busybox_packages = format!("packages = [\"curl\"]\n{busybox}");
        assert!(err(&busybox_packages).contains("takes no"));
    }
}
