//! `cargo xtask up`: a working node from a fresh clone in one command. System packages
//! (`deps`, as root), release sandboxd/silkd/sbx, the `default` template's image (Debian
//! with python3, pip, node and git; VMs boot it, the process engine uses its tree), the
//! engine chosen and said aloud, the node's config
//! and token under `target/up/`, `sbx` configured and on PATH; then this process becomes sandboxd, in the foreground, so
//! Ctrl-C or SIGTERM reaches it directly and it shuts down cleanly.

pub mod config;

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::deps::{self, Need};
use crate::{image, tool, workspace_root, Error, Result};
use config::{Engine, Node};

/// One progress line on stderr.
fn say(line: &str) {
    eprintln!("up: {line}");
}

pub fn run() -> Result<()> {
    let started = Instant::now();
    let root = workspace_root();
    let step = |n: u32, what: &str| {
        say(&format!(
            "[{n}/6 {:>5.1}s] {what}",
            started.elapsed().as_secs_f64()
        ))
    };

    step(1, "system packages");
    deps::ensure(Need::Node)?;

    step(2, "building sandboxd, silkd and sbx (release)");
    tool::stream(
        "build",
        tool::cargo()
            .args(["build", "--release", "--bin", "sandboxd", "--bin", "silkd"])
            .args(["--bin", "sbx"])
            .current_dir(&root),
    )?;
    let release = root.join("target/release");

    step(3, "the default template's image");
    let engine = choose_engine()?;

    step(4, "node config");
    let up_dir = root.join("target/up");
    let (token, created) = config::load_or_create_token(&up_dir.join("token"))?;
    say(&format!(
        "root token {} {}",
        if created { "created in" } else { "kept from" },
        up_dir.join("token").display()
    ));
    let config_path = up_dir.join("sandboxd.toml");
    config::write_node_config(
        &config_path,
        &Node {
            engine: &engine,
            data_dir: &up_dir.join("data"),
            silkd: &release.join("silkd"),
            token: &token,
        },
    )?;
    say(&format!("wrote {}", config_path.display()));

    step(5, "sbx");
    let sbx_config = config::sbx_config_path()?;
    config::write_private(&sbx_config, &config::render_sbx_config(config::URL, &token))?;
    say(&format!(
        "wrote {} (url {}, the root token; mode 0600)",
        sbx_config.display(),
        config::URL
    ));
    for var in ["SANDBOXD_URL", "SANDBOXD_TOKEN"] {
        if std::env::var_os(var).is_some_and(|v| !v.is_empty()) {
            say(&format!(
                "note: {var} is set in this shell; sbx prefers it to the file"
            ));
        }
    }
    install_sbx(&release.join("sbx"))?;

    step(6, "starting sandboxd");
    print_usage(&engine, &up_dir.join("token"));
    let sandboxd = release.join("sandboxd");
    let mut cmd = Command::new(&sandboxd);
    cmd.arg("--config").arg(&config_path).current_dir(&root);
    say(&format!(
        "exec {} --config {} (ready in {:.0}s)",
        sandboxd.display(),
        config_path.display(),
        started.elapsed().as_secs_f64()
    ));
    // Only returns on failure; on success sandboxd has replaced this process.
    let source = cmd.exec();
    Err(Error::Spawn {
        command: sandboxd.display().to_string(),
        source,
    })
}

/// Builds the `default` template's image (both engines need it: VMs boot it, the process
/// engine uses its `rootfs/`, never this machine's own `/`), then picks `qemu` when QEMU
/// runs, else `process`, which needs bwrap. Either way the choice and its reason are
/// printed.
fn choose_engine() -> Result<Engine> {
    let args = image::Args {
        template: config::TEMPLATE.into(),
        ..image::Args::default()
    };
    let manifest = image::build(&args)?;
    let why_not = match deps::qemu_version() {
        None => format!("{} does not run", deps::QEMU),
        Some(v) if v < deps::QEMU_OLDEST => {
            format!("QEMU {v} is older than {}", deps::QEMU_OLDEST)
        }
        Some(v) => {
            let accel = if Path::new("/dev/kvm").exists() {
                "KVM when it boots a guest, else TCG"
            } else {
                "TCG (no /dev/kvm: software emulation, slow)"
            };
            say(&format!(
                "ENGINE: qemu — QEMU {v} runs and the guest image is at {} (kernel {}); \
                 VMs use {accel}; template {} (python3, node, git; commands run as \
                 `user` in /home/user), pool warmup imports Python's and Node's common \
                 modules; no network in sandboxes",
                args.out().display(),
                manifest.kernel.release,
                config::TEMPLATE
            ));
            return Ok(Engine::Qemu { image: args.out() });
        }
    };
    tool::require(&["bwrap"])?;
    say(&format!(
        "ENGINE: process — {why_not}; sandboxes are bubblewrap namespaces over the guest \
         image's rootfs ({}/rootfs, read-only), each as its own unprivileged uid with \
         seccomp and cgroup limits; they share this machine's kernel, which isolates much \
         less than a VM. Template {} (python3, node, git; commands run as `user` in \
         /home/user), pool warmup imports Python's and Node's common modules; no network \
         in sandboxes",
        args.out().display(),
        config::TEMPLATE
    ));
    Ok(Engine::Process { image: args.out() })
}

/// Copies `sbx` into `$CARGO_HOME/bin` (a Rust user has it on PATH), through a temporary
/// file and a rename so a running `sbx` is never overwritten in place.
fn install_sbx(built: &Path) -> Result<()> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or_else(|| Error::Invalid("neither CARGO_HOME nor HOME is set".into()))?;
    let bin = cargo_home.join("bin");
    fs::create_dir_all(&bin).map_err(Error::io("creating", &bin))?;
    let target = bin.join("sbx");
    let temporary = bin.join(format!(".sbx.up-{}", std::process::id()));
    fs::copy(built, &temporary).map_err(Error::io("copying sbx to", &temporary))?;
    fs::rename(&temporary, &target).map_err(Error::io("installing", &target))?;
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir == bin));
    if on_path {
        say(&format!("installed {} (on PATH)", target.display()));
    } else {
        say(&format!(
            "installed {}; {} is not on PATH: add it, or run sbx by that path",
            target.display(),
            bin.display()
        ));
    }
    Ok(())
}

fn print_usage(engine: &Engine, token_file: &Path) {
    let first_claim = match engine {
        Engine::Qemu { .. } => {
            "the first claims wait for the pool's golden VM to boot and be snapshotted"
        }
        Engine::Process { .. } => "the first claims wait for the pool's golden sandbox",
    };
    let url = config::URL;
    let token = token_file.display();
    eprintln!(
        "
up: sandboxd is starting in the foreground on {url}; Ctrl-C (or SIGTERM) stops it
    and destroys its sandboxes. It is ready when it logs `sandboxd serving`;
    {first_claim}.

  In another terminal:

    sbx run -- python3 -c 'print(1)'     # claim, run (as `user`), release
    sbx run --user root -- id            # as root (VM engine; see docs/templates.md)
    sbx claim                            # prints an id and its token
    sbx exec ID -- sh -c 'echo hi'       # then: sbx release ID

  The same with curl:

    T=$(cat {token})
    curl -s -H \"Authorization: Bearer $T\" -X POST {url}/v1/claim -d '{{}}'
    curl -s -H \"Authorization: Bearer $T\" -X POST {url}/v1/sandboxes/ID/exec \\
         -d '{{\"argv\": [\"uname\", \"-a\"]}}'
    curl -s -H \"Authorization: Bearer $T\" -X POST {url}/v1/sandboxes/ID/release
"
    );
}
