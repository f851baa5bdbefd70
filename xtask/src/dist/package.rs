//! The package from built parts: stages the installed tree (plus `DEBIAN/`) under
//! `OUT/stage/`, then `dpkg-deb --build` makes the `.deb` and `tar` the tarball of the
//! same tree. Builds nothing itself, so a test can package the debug binaries.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::Progress;
use crate::{tool, workspace_root, Error, Result};

/// The unit, the config template and the maintainer scripts, as shipped.
pub const UNIT: &str = include_str!("files/sandboxd.service");
pub const CONFIG_TEMPLATE: &str = include_str!("files/sandboxd.toml.in");
const SCRIPTS: [(&str, &str); 3] = [
    ("postinst", include_str!("files/postinst")),
    ("prerm", include_str!("files/prerm")),
    ("postrm", include_str!("files/postrm")),
];

/// Installed paths (docs/deploy.md lists them).
pub const BIN_SANDBOXD: &str = "usr/bin/sandboxd";
pub const BIN_SBX: &str = "usr/bin/sbx";
pub const SILKD: &str = "usr/lib/sandboxd/silkd";
pub const IMAGES_DIR: &str = "usr/lib/sandboxd/images";
/// Debian 12 ships units under /lib (its dpkg does not know /lib and /usr/lib alias).
pub const UNIT_PATH: &str = "lib/systemd/system/sandboxd.service";
pub const SHARE: &str = "usr/share/sandboxd";
pub const STATE_DIR: &str = "var/lib/sandboxd";

/// What goes into the package.
pub struct Inputs {
    pub sandboxd: PathBuf,
    pub sbx: PathBuf,
    /// The static silkd (`cargo xtask build-silkd`).
    pub silkd: PathBuf,
    /// (template name, image directory built by `cargo xtask image`).
    pub images: Vec<(String, PathBuf)>,
    pub version: String,
}

/// The files made.
pub struct Outputs {
    pub deb: PathBuf,
    pub tarball: PathBuf,
}

/// Stages the tree under `out/stage/` and builds the `.deb` and the tarball in `out`.
pub fn build(inputs: &Inputs, out: &Path, progress: &Progress) -> Result<Outputs> {
    tool::require(&["dpkg-deb", "tar", "zstd", "cp"])?;
    // The images' trees hold files owned by their users (the `default` template's
    // /home/user) and device nodes; only root stages them faithfully.
    if tool::output(Command::new("id").arg("-u"))?.trim() != "0" {
        return Err(Error::Invalid(
            "`cargo xtask dist` runs as root: the guest images hold files owned by their \
             users and device nodes"
                .into(),
        ));
    }
    let name = format!("sandboxd-{}", inputs.version);
    let stage = out.join("stage").join(&name);
    if stage.exists() {
        fs::remove_dir_all(&stage).map_err(Error::io("removing the old stage", &stage))?;
    }
    progress.step(&format!("staging {}", stage.display()));
    stage_tree(inputs, &stage)?;

    let deb = out.join(format!("sandboxd_{}_amd64.deb", inputs.version));
    progress.step(&format!("dpkg-deb --build → {}", deb.display()));
    // zstd -3: seconds for the ≈1 GiB of images, where dpkg-deb's default xz takes many
    // minutes on two cores; Debian 12's dpkg reads zstd packages.
    tool::output(
        Command::new("dpkg-deb")
            .args(["-Zzstd", "-z3", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;

    let tarball = out.join(format!("sandboxd-{}-amd64.tar.zst", inputs.version));
    progress.step(&format!("tar → {}", tarball.display()));
    tool::output(
        Command::new("tar")
            .args([
                "--use-compress-program=zstd -T0 -3",
                "--numeric-owner",
                "-cf",
            ])
            .arg(&tarball)
            .arg(format!("--exclude={name}/DEBIAN"))
            .arg("-C")
            .arg(stage.parent().expect("stage has a parent"))
            .arg(&name),
    )?;
    progress.step("done");
    Ok(Outputs { deb, tarball })
}

/// Lays out the installed tree and `DEBIAN/` under `stage`.
fn stage_tree(inputs: &Inputs, stage: &Path) -> Result<()> {
    for (from, to) in [
        (&inputs.sandboxd, BIN_SANDBOXD),
        (&inputs.sbx, BIN_SBX),
        (&inputs.silkd, SILKD),
    ] {
        copy_file(from, &stage.join(to), 0o755)?;
    }
    // 0700: the images hold setuid binaries (the `default` template's sudo) and device
    // nodes meant for guests; no host user may reach them. sandboxd, root, binds them into
    // a sandbox through its staging mount, which needs no traversal by the sandbox's uid.
    let images = stage.join(IMAGES_DIR);
    make_dir(&images, 0o700)?;
    for (name, dir) in &inputs.images {
        if !dir.join("manifest.json").is_file() {
            return Err(Error::Missing {
                what: format!("guest image `{name}` at {}", dir.display()),
                fix: "cargo xtask image --template NAME",
            });
        }
        // Hard links when the image is on the same filesystem (a second copy of 1 GiB
        // otherwise); `cp -a` keeps owners, modes, links and device nodes either way.
        let to = images.join(name);
        let linked = Command::new("cp").arg("-al").arg(dir).arg(&to).output();
        if !linked.is_ok_and(|o| o.status.success()) {
            let _ = fs::remove_dir_all(&to);
            tool::output(Command::new("cp").arg("-a").arg(dir).arg(&to))?;
        }
    }
    write_file(&stage.join(UNIT_PATH), UNIT, 0o644)?;
    let share = stage.join(SHARE);
    write_file(&share.join("sandboxd.toml.in"), CONFIG_TEMPLATE, 0o644)?;
    let docs = stage.join("usr/share/doc/sandboxd");
    copy_file(
        &workspace_root().join("docs/deploy.md"),
        &docs.join("deploy.md"),
        0o644,
    )?;
    make_dir(&stage.join(STATE_DIR), 0o700)?;

    let debian = stage.join("DEBIAN");
    for (script, text) in SCRIPTS {
        write_file(&debian.join(script), text, 0o755)?;
        // The same scripts for a tarball install: `postinst configure` sets the node up.
        write_file(&share.join(script), text, 0o755)?;
    }
    let installed_kib = tool::output(
        Command::new("du")
            .args(["-sk", "--apparent-size", "--exclude=./DEBIAN", "."])
            .current_dir(stage),
    )?;
    let installed_kib = installed_kib.split_whitespace().next().unwrap_or("0");
    write_file(
        &debian.join("control"),
        &control(&inputs.version, installed_kib),
        0o644,
    )
}

/// The `DEBIAN/control` file.
pub fn control(version: &str, installed_kib: &str) -> String {
    format!(
        "Package: sandboxd\n\
         Version: {version}\n\
         Architecture: amd64\n\
         Maintainer: sandboxd developers <sandboxd@localhost>\n\
         Installed-Size: {installed_kib}\n\
         Depends: libc6 (>= 2.36), adduser, bubblewrap\n\
         Recommends: qemu-system-x86 (>= 1:10)\n\
         Section: admin\n\
         Priority: optional\n\
         Description: sandboxes for AI agents: microVMs or bubblewrap, over HTTP\n \
         sandboxd hands out sandboxes (QEMU microVMs cloned from golden snapshots, or\n \
         bubblewrap namespaces) over an HTTP API; silkd is the agent inside each one,\n \
         sbx the command line client. Ships the base and default guest images.\n"
    )
}

fn make_dir(dir: &Path, mode: u32) -> Result<()> {
    fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(mode)).map_err(Error::io("chmod", dir))
}

fn parent_dir(path: &Path) -> Result<()> {
    let parent = path.parent().expect("staged paths have a parent");
    fs::create_dir_all(parent).map_err(Error::io("creating", parent))
}

fn copy_file(from: &Path, to: &Path, mode: u32) -> Result<()> {
    parent_dir(to)?;
    fs::copy(from, to).map_err(Error::io("copying into the package", from))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode)).map_err(Error::io("chmod", to))
}

fn write_file(to: &Path, text: &str, mode: u32) -> Result<()> {
    parent_dir(to)?;
    fs::write(to, text).map_err(Error::io("writing", to))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode)).map_err(Error::io("chmod", to))
}
