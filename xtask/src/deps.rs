//! `cargo xtask deps`: the one home of system package installation (bubblewrap, file,
//! procps, mmdebstrap, erofs-utils, QEMU 10 from bookworm-backports). `.ci/run` runs it, `cargo xtask up` runs it
//! leniently, and `cargo xtask test` checks its result first. As root it installs what is
//! missing with apt; otherwise it prints the apt commands to run. It never removes anything.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::{error_chain, tool, Error, Result};

/// The binary the qemu engine runs.
pub const QEMU: &str = "qemu-system-x86_64";
/// The package that ships [`QEMU`].
const QEMU_PACKAGE: &str = "qemu-system-x86";
/// The QEMU the project is tested with: the tests need exactly this major version.
const QEMU_WANTED: Version = Version(10, 0);
/// The oldest QEMU `up` settles for (bookworm's own).
pub const QEMU_OLDEST: Version = Version(7, 2);
const BACKPORTS_SUITE: &str = "bookworm-backports";
const BACKPORTS_SOURCES: &str = "/etc/apt/sources.list.d/backports.sources";
pub(crate) const APT_LISTS: &str = "/var/lib/apt/lists";

/// Every plain package the tests and a node need, as (the tool that shows it is
/// installed, its Debian package): add new ones here. QEMU, the one package with a
/// version requirement, is [`QEMU_PACKAGE`].
/// `mmdebstrap` and `mkfs.erofs` build Debian templates (`cargo xtask image --template`).
/// `systemd-analyze` checks the packaged unit and `zstd` compresses the packages
/// (`cargo xtask dist`, `xtask/tests/dist.rs`). `tmux` is the terminal `sbx shell` is
/// tested in (`sbx/tests/shell.rs`). `pip3` fills the E2B tests' Python environment
/// (`e2b_venv.rs`). `etcd` is the cluster's store (`sandboxd/tests/cluster.rs`
/// runs a 3-member etcd) and `protoc` compiles etcd's protos for the `etcd-client` crate,
/// which import protobuf's well-known types (`google/protobuf/descriptor.proto`, from
/// `libprotobuf-dev`: `protobuf-compiler` alone fails that build on a fresh machine);
/// `openssl` makes throwaway certificates for TLS to etcd and between nodes
/// (`sandboxd/tests/cluster_tls.rs`, `cluster_mtls.rs`).
/// A "tool" that starts with `/` is a file the package ships, for packages without a binary.
const PACKAGES: [(&str, &str); 13] = [
    ("bwrap", "bubblewrap"),
    ("file", "file"),
    ("ps", "procps"),
    ("mmdebstrap", "mmdebstrap"),
    ("mkfs.erofs", "erofs-utils"),
    ("systemd-analyze", "systemd"),
    ("zstd", "zstd"),
    ("tmux", "tmux"),
    ("pip3", "python3-pip"),
    ("etcd", "etcd-server"),
    ("protoc", "protobuf-compiler"),
    (
        "/usr/include/google/protobuf/descriptor.proto",
        "libprotobuf-dev",
    ),
    ("openssl", "openssl"),
];

/// A version's major and minor numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// Who asks, and so what is enough and what happens when it cannot be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// `cargo xtask deps` (CI): every package and QEMU 10 exactly; anything short fails.
    Tests,
    /// `cargo xtask up`: QEMU 10 if it can be had, else an older one, else none (the
    /// node runs the process engine); whatever cannot be installed is said, not fatal.
    Node,
}

impl Need {
    fn accepts(self, qemu: Version) -> bool {
        match self {
            Need::Tests => qemu.0 == QEMU_WANTED.0,
            Need::Node => qemu >= QEMU_WANTED,
        }
    }

    /// The end of the road when nothing can be installed: a failure for the tests, a
    /// note for a node, which carries on with what is there.
    fn settle(self, why: String) -> Result<()> {
        match self {
            Need::Tests => Err(Error::Invalid(why)),
            Need::Node => {
                say(&format!("{why}\n  carrying on with what is here"));
                Ok(())
            }
        }
    }
}

/// One progress line on stderr.
fn say(line: &str) {
    eprintln!("deps: {line}");
}

pub fn run() -> Result<()> {
    ensure(Need::Tests)?;
    crate::e2b_venv::ensure(&crate::workspace_root())
}

/// Installs (as root) or names (otherwise) what is missing for `need`.
pub fn ensure(need: Need) -> Result<()> {
    let missing: Vec<&str> = missing_tools().iter().map(|&(_, p)| p).collect();
    let qemu = qemu_version();
    match qemu {
        Some(v) => say(&format!("found {QEMU} {v}")),
        None => say(&format!("{QEMU} is not installed")),
    }
    let qemu_short = !qemu.is_some_and(|v| need.accepts(v));
    // The guest image resolves its packages from apt's lists; an image may ship without.
    let lists_missing = tool::on_path("apt-get") && !apt_lists_present(Path::new(APT_LISTS));
    if missing.is_empty() && !qemu_short && !lists_missing {
        say("system packages: all present");
        return Ok(());
    }
    if !tool::on_path("apt-get") {
        let mut packages = missing.clone();
        if qemu_short {
            packages.push(QEMU_PACKAGE);
        }
        return need.settle(format!(
            "no apt-get here: install {} (QEMU {QEMU_WANTED}) yourself",
            packages.join(" ")
        ));
    }
    if !is_root()? {
        let commands: Vec<String> = sudo_commands(&missing, qemu_short)
            .iter()
            .map(|c| format!("    {c}"))
            .collect();
        return need.settle(format!(
            "not root, so nothing was installed; run `cargo xtask deps` as root, or:\n\n{}\n",
            commands.join("\n")
        ));
    }

    let mut apt = Apt::default();
    if lists_missing {
        apt.update()?;
    }
    if !missing.is_empty() {
        apt.install(&missing, None)?;
    }
    if qemu_short {
        match need {
            Need::Tests => install_tested_qemu(&mut apt)?,
            Need::Node => install_qemu(&mut apt, qemu),
        }
    }
    if need == Need::Tests {
        check()?;
        say(&format!("system packages: ready (QEMU {QEMU_WANTED})"));
    }
    Ok(())
}

/// Fails naming the first thing the tests need that is not here (a package, or QEMU
/// [`QEMU_WANTED`]'s major version) and the command that fixes it. Installs nothing.
pub fn check() -> Result<()> {
    let fix = "cargo xtask deps";
    if let Some(&(tool, package)) = missing_tools().first() {
        return Err(Error::Missing {
            what: format!("`{tool}` is not installed (Debian package {package})"),
            fix,
        });
    }
    let wanted = QEMU_WANTED.0;
    match qemu_version() {
        Some(v) if Need::Tests.accepts(v) => Ok(()),
        Some(v) => Err(Error::Missing {
            what: format!("`{QEMU}` is {v}; the VM tests need QEMU {wanted}"),
            fix,
        }),
        None => Err(Error::Missing {
            what: format!("`{QEMU}` is not installed; the VM tests need QEMU {wanted}"),
            fix,
        }),
    }
}

/// The (tool, package) pairs of [`PACKAGES`] whose tool is not on PATH (or, for a path,
/// not a file).
fn missing_tools() -> Vec<(&'static str, &'static str)> {
    PACKAGES
        .into_iter()
        .filter(|(tool, _)| match tool.strip_prefix('/') {
            Some(_) => !Path::new(tool).is_file(),
            None => !tool::on_path(tool),
        })
        .collect()
}

/// Whether apt has package lists (`dir/*_Packages*`, `dir` being [`APT_LISTS`]).
fn apt_lists_present(dir: &Path) -> bool {
    fs::read_dir(dir)
        .map(|dir| {
            dir.flatten()
                .any(|e| e.file_name().to_string_lossy().contains("_Packages"))
        })
        .unwrap_or(false)
}

/// The commands a non-root user runs to get `missing` and, when `qemu`, QEMU
/// [`QEMU_WANTED`].
fn sudo_commands(missing: &[&str], qemu: bool) -> Vec<String> {
    let install = "sudo apt-get install -y --no-install-recommends";
    let mut commands = vec!["sudo apt-get update".to_string()];
    if !missing.is_empty() {
        commands.push(format!("{install} {}", missing.join(" ")));
    }
    if qemu {
        commands.push(format!(
            "{install} -t {BACKPORTS_SUITE} {QEMU_PACKAGE}   # with {BACKPORTS_SUITE} \
             in apt's sources"
        ));
    }
    commands
}

fn is_bookworm() -> bool {
    let os_release = fs::read_to_string("/etc/os-release").unwrap_or_default();
    os_release_value(&os_release, "VERSION_CODENAME").as_deref() == Some("bookworm")
}

/// QEMU for the tests: from bookworm-backports on bookworm (bookworm's own is 7.2), else
/// the distribution's. [`check`] then says whether it is the wanted version.
fn install_tested_qemu(apt: &mut Apt) -> Result<()> {
    let release = if is_bookworm() {
        add_backports(apt)?;
        Some(BACKPORTS_SUITE)
    } else {
        None
    };
    apt.install(&[QEMU_PACKAGE], release)
}

/// QEMU [`QEMU_WANTED`] from bookworm-backports on bookworm; else, or when that fails,
/// the distribution's QEMU if it is at least [`QEMU_OLDEST`]; else none. Never fails:
/// without QEMU the node runs the process engine.
fn install_qemu(apt: &mut Apt, present: Option<Version>) {
    if is_bookworm() {
        let backports =
            add_backports(apt).and_then(|()| apt.install(&[QEMU_PACKAGE], Some(BACKPORTS_SUITE)));
        match backports {
            Ok(()) => {
                match qemu_version() {
                    Some(v) => say(&format!("installed QEMU {v} from {BACKPORTS_SUITE}")),
                    None => say(&format!(
                        "installed {QEMU_PACKAGE} from {BACKPORTS_SUITE}, but {QEMU} does not run"
                    )),
                }
                return;
            }
            Err(e) => say(&format!(
                "QEMU from {BACKPORTS_SUITE} failed ({}); trying the distribution's",
                error_chain(&e)
            )),
        }
    }
    if let Some(v) = present.filter(|&v| v >= QEMU_OLDEST) {
        say(&format!("keeping the installed QEMU {v}"));
        return;
    }
    let candidate = apt.candidate(QEMU_PACKAGE);
    match candidate.as_deref().and_then(debian_upstream_version) {
        Some(v) if v >= QEMU_OLDEST => match apt.install(&[QEMU_PACKAGE], None) {
            Ok(()) => say(&format!("installed the distribution's QEMU {v}")),
            Err(e) => say(&format!(
                "installing QEMU failed ({}); going without it",
                error_chain(&e)
            )),
        },
        Some(v) => say(&format!(
            "the distribution's QEMU is {v}, older than {QEMU_OLDEST}: going without QEMU"
        )),
        None => say(&format!(
            "apt has no {QEMU_PACKAGE} candidate: going without QEMU"
        )),
    }
}

/// Adds bookworm-backports from the mirror this machine already uses for bookworm (it
/// may have no route to any other), unless a sources file already names it.
fn add_backports(apt: &mut Apt) -> Result<()> {
    let present = fs::read_to_string(BACKPORTS_SOURCES).unwrap_or_default();
    if present
        .lines()
        .any(|l| l.starts_with("Suites:") && l.contains(BACKPORTS_SUITE))
    {
        return Ok(());
    }
    let mirror = mirror("bookworm")?;
    say(&format!(
        "adding {BACKPORTS_SUITE} from {mirror} to {BACKPORTS_SOURCES}"
    ));
    let path = Path::new(BACKPORTS_SOURCES);
    fs::write(path, backports_sources(&mirror)).map_err(Error::io("writing", path))?;
    apt.updated = false;
    Ok(())
}

fn backports_sources(mirror: &str) -> String {
    format!(
        "Types: deb\nURIs: {mirror}\nSuites: {BACKPORTS_SUITE}\nComponents: main\n\
         Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
}

/// The first mirror for `suite` (`bookworm`, `bookworm-security`) in
/// `/etc/apt/sources.list.d/*.sources`, else in `/etc/apt/sources.list`.
pub(crate) fn mirror(suite: &str) -> Result<String> {
    let dir = Path::new("/etc/apt/sources.list.d");
    let mut files: Vec<_> = fs::read_dir(dir)
        .map_err(Error::io("listing apt sources", dir))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sources"))
        .collect();
    files.sort();
    for file in files {
        let text = fs::read_to_string(&file).unwrap_or_default();
        if let Some(uri) = deb822_mirror(&text, suite) {
            return Ok(uri);
        }
    }
    let list = fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    one_line_mirror(&list, suite).ok_or_else(|| {
        Error::Invalid(format!(
            "no {suite} mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list"
        ))
    })
}

/// The first URI of the first deb822 stanza whose `Suites:` include `suite`.
fn deb822_mirror(text: &str, suite: &str) -> Option<String> {
    text.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .map(str::trim)
            })
        };
        field("Suites")?
            .split_whitespace()
            .any(|s| s == suite)
            .then(|| field("URIs")?.split_whitespace().next().map(str::to_string))?
    })
}

/// The URI of the first `deb [options] URI SUITE ...` line of a one-line sources.list.
fn one_line_mirror(text: &str, suite: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next()? != "deb" {
            return None;
        }
        let mut uri = words.next()?;
        if uri.starts_with('[') {
            // Options such as `[arch=amd64 signed-by=...]` may span several words.
            while !uri.ends_with(']') {
                uri = words.next()?;
            }
            uri = words.next()?;
        }
        (words.next()? == suite).then(|| uri.to_string())
    })
}

fn os_release_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let value = l.strip_prefix(key)?.strip_prefix('=')?;
        Some(value.trim().trim_matches('"').to_string())
    })
}

/// The version `qemu-system-x86_64 --version` reports, when it runs.
pub fn qemu_version() -> Option<Version> {
    let out = Command::new(QEMU).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = text.lines().next()?.split("version ").nth(1)?;
    leading_version(rest)
}

/// `1:10.0.2+ds-2+deb13u1~bpo12+1` → 10.0: the upstream part after any epoch.
fn debian_upstream_version(v: &str) -> Option<Version> {
    leading_version(v.split_once(':').map_or(v, |(_, rest)| rest))
}

/// `10.0.2 (Debian …)` → 10.0.
fn leading_version(text: &str) -> Option<Version> {
    let mut parts = text.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some(Version(major, minor))
}

pub(crate) fn is_root() -> Result<bool> {
    Ok(tool::output(Command::new("id").arg("-u"))?.trim() == "0")
}

/// apt-get, with `apt-get update` run at most once per change of sources.
#[derive(Default)]
struct Apt {
    updated: bool,
}

impl Apt {
    fn update(&mut self) -> Result<()> {
        if !self.updated {
            tool::stream("apt-get update", apt_get().args(["update", "-qq"]))?;
            self.updated = true;
        }
        Ok(())
    }

    /// `apt-get install` of `packages`, from `release` when given (`-t`).
    fn install(&mut self, packages: &[&str], release: Option<&str>) -> Result<()> {
        self.update()?;
        say(&format!(
            "installing {}{}",
            packages.join(" "),
            release.map_or(String::new(), |r| format!(" from {r}"))
        ));
        let mut cmd = apt_get();
        cmd.args(["install", "-y", "-qq", "--no-install-recommends"]);
        if let Some(release) = release {
            cmd.args(["-t", release]);
        }
        tool::stream("apt-get install", cmd.args(packages))
    }

    /// The candidate version apt would install, if any.
    fn candidate(&mut self, package: &str) -> Option<String> {
        self.update().ok()?;
        let policy = tool::output(Command::new("apt-cache").args(["policy", package])).ok()?;
        policy
            .lines()
            .find_map(|l| l.trim().strip_prefix("Candidate:"))
            .map(str::trim)
            .filter(|v| *v != "(none)")
            .map(str::to_string)
    }
}

fn apt_get() -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bookworm_mirror_is_found_in_deb822_and_one_line_sources() {
        let deb822 = "Types: deb\nURIs: http://security.example/debian-security\n\
                      Suites: bookworm-security\nComponents: main\n\n\
                      Types: deb deb-src\nURIs: http://mirror.example/debian http://other/\n\
                      Suites: bookworm bookworm-updates\nComponents: main\n";
        assert_eq!(
            deb822_mirror(deb822, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(deb822_mirror(deb822, "trixie"), None);

        let list = "# comment\ndeb-src http://src.example/debian bookworm main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n";
        assert_eq!(
            one_line_mirror(list, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            one_line_mirror("deb http://m/debian bookworm-updates main\n", "bookworm"),
            None
        );
    }

    #[test]
    fn backports_sources_are_one_deb822_stanza_from_the_mirror() {
        assert_eq!(
            backports_sources("http://m/debian"),
            "Types: deb\nURIs: http://m/debian\nSuites: bookworm-backports\nComponents: main\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        );
    }

    #[test]
    fn apt_lists_count_only_when_a_packages_file_is_there() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!apt_lists_present(&dir.path().join("absent")));
        fs::write(dir.path().join("lock"), "").unwrap();
        fs::write(dir.path().join("m_dists_bookworm_InRelease"), "").unwrap();
        assert!(!apt_lists_present(dir.path()));
        let packages = "m_dists_bookworm_main_binary-amd64_Packages.lz4";
        fs::write(dir.path().join(packages), "").unwrap();
        assert!(apt_lists_present(dir.path()));
    }

    #[test]
    fn the_tests_take_qemu_10_only_and_a_node_takes_10_or_newer() {
        assert!(Need::Tests.accepts(Version(10, 0)) && Need::Tests.accepts(Version(10, 2)));
        assert!(!Need::Tests.accepts(Version(9, 2)) && !Need::Tests.accepts(Version(11, 0)));
        assert!(Need::Node.accepts(Version(11, 0)) && !Need::Node.accepts(Version(7, 2)));
    }

    #[test]
    fn a_non_root_user_is_told_every_command() {
        assert_eq!(
            sudo_commands(&["bubblewrap"], true),
            [
                "sudo apt-get update",
                "sudo apt-get install -y --no-install-recommends bubblewrap",
                "sudo apt-get install -y --no-install-recommends -t bookworm-backports \
                 qemu-system-x86   # with bookworm-backports in apt's sources",
            ]
        );
        assert_eq!(sudo_commands(&[], false), ["sudo apt-get update"]);
    }

    #[test]
    fn versions_parse_from_qemu_and_from_debian() {
        assert_eq!(
            leading_version("10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)"),
            Some(Version(10, 0))
        );
        assert_eq!(
            debian_upstream_version("1:7.2+dfsg-7+deb12u16"),
            Some(Version(7, 2))
        );
        assert_eq!(
            debian_upstream_version("8.2.2+ds-0ubuntu1"),
            Some(Version(8, 2))
        );
        assert_eq!(debian_upstream_version("(none)"), None);
        assert!(Version(7, 2) >= QEMU_OLDEST && Version(6, 2) < QEMU_OLDEST);
        assert!(Version(9, 9) < QEMU_WANTED);
    }

    #[test]
    fn os_release_values_lose_their_quotes() {
        let text = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\n";
        assert_eq!(
            os_release_value(text, "VERSION_CODENAME").as_deref(),
            Some("bookworm")
        );
        assert_eq!(
            os_release_value(text, "PRETTY_NAME").as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(os_release_value(text, "ID"), None);
    }
}
