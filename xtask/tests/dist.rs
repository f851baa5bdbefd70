//! `cargo xtask dist`'s package, end to end: built from the prebuilt debug binaries, the
//! static silkd and both guest images; inspected with `dpkg-deb`; installed with `dpkg -i`
//! into a throwaway overlay of this host's root (testkit::overlay_root: the host's real
//! /etc, /usr and dpkg database are never written); its unit checked by
//! `systemd-analyze verify`; the installed sandboxd started with the config the postinst
//! generated; then removed and purged. Needs root, dpkg-deb, zstd and systemd-analyze
//! (`cargo xtask deps`).

use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::overlay_root;
use xtask::dist::{self, package, Progress};

/// Paths the package must install (relative to `/`).
const INSTALLED: [&str; 8] = [
    package::BIN_SANDBOXD,
    package::BIN_SBX,
    package::SILKD,
    package::UNIT_PATH,
    "usr/lib/sandboxd/images/base/vmlinuz",
    "usr/lib/sandboxd/images/base/rootfs/bin/busybox",
    "usr/lib/sandboxd/images/default/rootfs.erofs",
    "usr/share/sandboxd/sandboxd.toml.in",
];

fn inputs() -> package::Inputs {
    let debug = testkit::bins::debug_dir();
    let root = xtask::workspace_root();
    // The static silkd the base image was built with: its /init.
    let silkd = root.join("target/images/base/rootfs/init");
    assert!(
        silkd.is_file(),
        "{} is missing: run `cargo xtask image` (or `cargo xtask test`)",
        silkd.display()
    );
    package::Inputs {
        sandboxd: testkit::bins::sandboxd(),
        sbx: debug.join("sbx"),
        silkd,
        images: dist::IMAGES
            .iter()
            .map(|name| (name.to_string(), root.join("target/images").join(name)))
            .collect(),
        version: "0.0.1~test".into(),
    }
}

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    let out = Command::new("dpkg-deb")
        .args(args)
        .arg(deb)
        .output()
        .unwrap();
    assert!(out.status.success(), "dpkg-deb {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Digest of host files the install must not change.
fn host_state() -> Vec<(PathBuf, Option<Vec<u8>>)> {
    ["/etc/passwd", "/etc/group", "/var/lib/dpkg/status"]
        .into_iter()
        .map(|p| (PathBuf::from(p), std::fs::read(p).ok()))
        .chain(
            ["/usr/bin/sandboxd", "/etc/sandboxd", "/var/lib/sandboxd"]
                .into_iter()
                .map(|p| (PathBuf::from(p), std::fs::metadata(p).ok().map(|_| vec![]))),
        )
        .collect()
}

/// Inside the overlay: install, look, verify the unit, serve, remove, purge. Each step
/// prints a `== name` section the test reads.
const SCRIPT: &str = r#"set -u
echo "== install"
dpkg -i /tmp/input >/tmp/dpkg.log 2>&1; echo "rc=$?"; cat /tmp/dpkg.log
echo "== files"
stat -c '%a %U:%G %n' /usr/bin/sandboxd /usr/bin/sbx /usr/lib/sandboxd/silkd \
    /usr/lib/sandboxd/images /var/lib/sandboxd /etc/sandboxd /etc/sandboxd/sandboxd.toml
echo "== user"
getent passwd sandboxd | cut -d: -f1,6,7
echo "== token"
sed -n 's/^api_token = "\(.*\)"$/\1/p' /etc/sandboxd/sandboxd.toml
echo "== verify"
systemd-analyze verify /lib/systemd/system/sandboxd.service 2>&1; echo "rc=$?"
echo "== serve"
# The unit's confinement, as far as it can be had without systemd as PID 1 here:
# NoNewPrivileges (setpriv), ProtectSystem=strict with StateDirectory and
# RuntimeDirectory (a read-only root but for /var/lib/sandboxd; /run, /tmp, /dev/shm are
# this namespace's own tmpfs), ProtectHome (empty read-only /home and /root).
token=$(sed -n 's/^api_token = "\(.*\)"$/\1/p' /etc/sandboxd/sandboxd.toml)
unshare --net --mount sh -c '
    set -e
    ip link set lo up
    mount --bind /var/lib/sandboxd /var/lib/sandboxd
    mount -o remount,bind,ro /
    mount -t tmpfs -o ro protect-home /home
    mount -t tmpfs -o ro protect-home /root
    mkdir -p /run/sandboxd-stage
    set +e
    setpriv --no-new-privs /usr/bin/sandboxd --config /etc/sandboxd/sandboxd.toml \
        2>/tmp/sandboxd.log & pid=$!
    n=0
    until curl -sf http://127.0.0.1:7777/healthz >/dev/null; do
        n=$((n + 1))
        if [ $n -gt 1200 ] || ! kill -0 $pid 2>/dev/null; then
            echo "not serving"; cat /tmp/sandboxd.log; kill $pid; exit 1
        fi
        sleep 0.05
    done
    auth="Authorization: Bearer $1"
    curl -s -o /dev/null -w "info with token: %{http_code}\n" -H "$auth" \
        http://127.0.0.1:7777/v1/info
    curl -s -o /dev/null -w "info with a wrong token: %{http_code}\n" \
        -H "Authorization: Bearer not-the-token-0000" http://127.0.0.1:7777/v1/info
    kill -TERM $pid; wait $pid; echo "exit=$?"
' serve "$token"
echo "== remove"
dpkg -r sandboxd >/tmp/dpkg.log 2>&1; echo "rc=$?"
for f in /usr/bin/sandboxd /usr/bin/sbx /usr/lib/sandboxd /lib/systemd/system/sandboxd.service \
    /etc/sandboxd/sandboxd.toml; do
    if [ -e "$f" ]; then echo "present $f"; else echo "absent $f"; fi
done
echo "== purge"
dpkg --purge sandboxd >/tmp/dpkg.log 2>&1; echo "rc=$?"
for f in /etc/sandboxd /var/lib/sandboxd; do
    if [ -e "$f" ]; then echo "present $f"; else echo "absent $f"; fi
done
getent passwd sandboxd >/dev/null && echo "user present" || echo "user absent"
"#;

#[test]
fn the_package_installs_serves_and_removes_cleanly() {
    for tool in ["dpkg-deb", "zstd", "systemd-analyze"] {
        assert!(
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .status()
                .unwrap()
                .success(),
            "`{tool}` is missing: run `cargo xtask deps`"
        );
    }
    let out = tempfile::tempdir().unwrap();
    let outputs = package::build(&inputs(), out.path(), &Progress::start()).unwrap();

    let info = dpkg_deb(&["--info"], &outputs.deb);
    for line in [
        "Package: sandboxd",
        "Version: 0.0.1~test",
        "Architecture: amd64",
        "Depends: libc6 (>= 2.36), adduser, bubblewrap",
        "postinst",
        "prerm",
        "postrm",
    ] {
        assert!(
            info.contains(line),
            "`{line}` not in dpkg-deb --info:\n{info}"
        );
    }
    let contents = dpkg_deb(&["--contents"], &outputs.deb);
    for path in INSTALLED {
        assert!(
            contents.contains(&format!("./{path}")),
            "{path} not in dpkg-deb --contents"
        );
    }
    // The token is generated at install, never shipped.
    assert!(!contents.contains("./etc/sandboxd/sandboxd.toml"));
    assert!(contents.lines().any(
        |l| l.starts_with("drwx------ root/root") && l.ends_with("./usr/lib/sandboxd/images/")
    ));
    let tarball = Command::new("tar")
        .args(["--zstd", "-tvf"])
        .arg(&outputs.tarball)
        .output()
        .unwrap();
    assert!(tarball.status.success(), "{tarball:?}");
    let listed = String::from_utf8(tarball.stdout).unwrap();
    for path in INSTALLED {
        assert!(
            listed.contains(&format!("sandboxd-0.0.1~test/{path}")),
            "{path} not in the tarball"
        );
    }
    assert!(
        !listed.contains("/DEBIAN/"),
        "the tarball carries no DEBIAN/"
    );

    let host_before = host_state();
    let run = overlay_root::run(SCRIPT, Some(&outputs.deb));
    assert_eq!(host_state(), host_before, "the install touched the host");
    eprintln!("{}\n{}", run.stdout, run.stderr);

    let install = run.section("install");
    assert!(install.starts_with("rc=0"), "dpkg -i failed:\n{install}");
    assert!(
        install.contains("sandboxd: wrote /etc/sandboxd/sandboxd.toml"),
        "{install}"
    );
    let files = run.section("files");
    for line in [
        "755 root:root /usr/bin/sandboxd",
        "755 root:root /usr/bin/sbx",
        "755 root:root /usr/lib/sandboxd/silkd",
        "700 root:root /usr/lib/sandboxd/images",
        "700 root:root /var/lib/sandboxd",
        "750 root:sandboxd /etc/sandboxd",
        "640 root:sandboxd /etc/sandboxd/sandboxd.toml",
    ] {
        assert!(
            files.lines().any(|l| l == line),
            "`{line}` not in:\n{files}"
        );
    }
    assert_eq!(
        run.section("user"),
        "sandboxd:/var/lib/sandboxd:/usr/sbin/nologin"
    );
    let token = run.section("token");
    assert!(
        token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "the generated token is 64 hex digits: {token:?}"
    );
    let verify = run.section("verify");
    assert_eq!(
        verify.trim(),
        "rc=0",
        "systemd-analyze verify complained:\n{verify}"
    );
    let serve = run.section("serve");
    assert!(serve.contains("info with token: 200"), "{serve}");
    assert!(serve.contains("info with a wrong token: 401"), "{serve}");
    assert!(serve.contains("exit=0"), "{serve}");
    let remove = run.section("remove");
    for line in [
        "rc=0",
        "absent /usr/bin/sandboxd",
        "absent /usr/bin/sbx",
        "absent /usr/lib/sandboxd",
        "absent /lib/systemd/system/sandboxd.service",
        // Remove keeps the operator's config and token; purge deletes them.
        "present /etc/sandboxd/sandboxd.toml",
    ] {
        assert!(
            remove.lines().any(|l| l == line),
            "`{line}` not in:\n{remove}"
        );
    }
    let purge = run.section("purge");
    for line in [
        "rc=0",
        "absent /etc/sandboxd",
        "absent /var/lib/sandboxd",
        "user absent",
    ] {
        assert!(
            purge.lines().any(|l| l == line),
            "`{line}` not in:\n{purge}"
        );
    }
    assert!(run.status.success(), "{:?}", run.status);
}
