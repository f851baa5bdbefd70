//! `cargo xtask up`'s files: the node's sandboxd.toml (rendered here, validated by
//! sandboxd itself when it starts), its root token (kept across runs), and the config
//! file `sbx` falls back to. Nothing here starts or builds anything.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The address the node listens on, and the URL `sbx` is given for it.
pub const LISTEN: &str = "127.0.0.1:7777";
pub const URL: &str = "http://127.0.0.1:7777";

/// How sandboxes are made on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    /// VMs booted from this guest image directory.
    Qemu { image: PathBuf },
    /// bubblewrap namespaces over this guest image's `rootfs/` (never the host's `/`).
    Process { image: PathBuf },
}

/// Everything the config depends on.
pub struct Node<'a> {
    pub engine: &'a Engine,
    pub data_dir: &'a Path,
    pub silkd: &'a Path,
    pub token: &'a str,
}

/// The template `up` serves: Debian with python3, pip, node, git and user `user`.
pub const TEMPLATE: &str = "default";
/// The pool's warmup: imports Python's and Node's common modules once in the golden so
/// their files are page-cache resident when the first claim runs them.
pub const WARMUP: &str = "python3 -c 'import json, os, subprocess, sys, pathlib, re' && \
     node -e 'require(\"fs\"); require(\"path\"); require(\"child_process\")'";

/// The sandboxd.toml for `node`: the `default` template (its image: the tree, and the
/// metadata that says which user commands run as), one size, a pool of two warm
/// sandboxes with a warmup.
pub fn render(node: &Node) -> String {
    let (engine, image) = match node.engine {
        Engine::Qemu { image } => ("qemu", image),
        Engine::Process { image } => ("process", image),
    };
    let template = format!("[templates.{TEMPLATE}]\nimage = {}\n", quoted(image));
    let warmup = serde_json::to_string(&["sh", "-c", WARMUP]).expect("strings serialize");
    // On qemu the writable layer is a tmpfs in guest RAM: sandboxd takes at most half of
    // memory_mib for it (the kernel and the template's page cache need the rest).
    let (memory_mib, disk_mib) = match node.engine {
        Engine::Qemu { .. } => (256, 128),
        Engine::Process { .. } => (512, 512),
    };
    format!(
        "# Written by `cargo xtask up` on every run; edit xtask/src/up/config.rs instead.\n\
         # Keys: docs/deploy.md.\n\
         listen = \"{LISTEN}\"\n\
         data_dir = {data_dir}\n\
         api_token = \"{token}\"\n\
         engine = \"{engine}\"\n\
         silkd_path = {silkd}\n\
         \n\
         {template}\
         \n\
         [sizes.small]\n\
         cpus = 1\n\
         memory_mib = {memory_mib}\n\
         disk_mib = {disk_mib}\n\
         \n\
         [[pools]]\n\
         template = \"{TEMPLATE}\"\n\
         size = \"small\"\n\
         warm = 2\n\
         warmup = {warmup}\n",
        data_dir = quoted(node.data_dir),
        token = node.token,
        silkd = quoted(node.silkd),
    )
}

/// Writes the node's sandboxd.toml owner-only (0600), also over a file an earlier run
/// left with a wider mode: it holds the root token.
pub fn write_node_config(path: &Path, node: &Node) -> Result<()> {
    write_private(path, &render(node))
}

/// The root token in `path`, or a fresh one (32 random bytes, hex) written there with
/// mode 0600, so that a re-run keeps the token clients already hold.
pub fn load_or_create_token(path: &Path) -> Result<(String, bool)> {
    if let Ok(text) = fs::read_to_string(path) {
        let token = text.trim();
        if token.len() == 64 && token.chars().all(|c| c.is_ascii_hexdigit()) {
            return Ok((token.to_string(), false));
        }
    }
    let mut bytes = [0u8; 32];
    let urandom = Path::new("/dev/urandom");
    fs::File::open(urandom)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(Error::io("reading", urandom))?;
    let token = hex::encode(bytes);
    write_private(path, &format!("{token}\n"))?;
    Ok((token, true))
}

/// `${XDG_CONFIG_HOME:-$HOME/.config}/sbx/config.toml`, where `sbx` looks when neither a
/// flag nor the environment names the URL or token (sbx/src/config.rs).
pub fn sbx_config_path() -> Result<PathBuf> {
    let dir = |var| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    dir("XDG_CONFIG_HOME")
        .or_else(|| dir("HOME").map(|home| home.join(".config")))
        .map(|config| config.join("sbx/config.toml"))
        .ok_or_else(|| Error::Invalid("neither XDG_CONFIG_HOME nor HOME is set".into()))
}

pub fn render_sbx_config(url: &str, token: &str) -> String {
    format!(
        "# Written by `cargo xtask up`: the node sbx talks to when neither --url/--token\n\
         # nor SANDBOXD_URL/SANDBOXD_TOKEN say otherwise.\n\
         url = {}\n\
         token = {}\n",
        quoted(url),
        quoted(token)
    )
}

/// Writes `text` to `path` (creating its directory) readable by its owner only, also
/// when the file already existed with a wider mode.
pub fn write_private(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(Error::io("opening", path))?;
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .and_then(|()| file.write_all(text.as_bytes()))
        .map_err(Error::io("writing", path))
}

/// A TOML basic string. JSON's string escapes are all valid TOML ones.
fn quoted(value: impl AsRef<Path>) -> String {
    serde_json::to_string(&value.as_ref().to_string_lossy()).expect("a string serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    /// Both configs are what sandboxd itself accepts, with the one pool we promise.
    #[test]
    fn both_configs_pass_sandboxds_own_validation() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("image \"quoted\"");
        fs::create_dir_all(image.join("rootfs")).unwrap();
        for file in ["vmlinuz", "initramfs.cpio.gz"] {
            fs::write(image.join(file), b"").unwrap();
        }
        fs::write(image.join("manifest.json"), b"{}").unwrap();
        let data_dir = dir.path().join("data");
        let silkd = dir.path().join("silkd");
        for (engine, template) in [
            (
                Engine::Qemu {
                    image: image.clone(),
                },
                "default",
            ),
            (
                Engine::Process {
                    image: image.clone(),
                },
                "default",
            ),
        ] {
            let text = render(&Node {
                engine: &engine,
                data_dir: &data_dir,
                silkd: &silkd,
                token: TOKEN,
            });
            let config = sandboxd::Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(
                config.listen_addr().unwrap(),
                sandboxd::config::ListenAddr::Tcp(LISTEN.parse().unwrap())
            );
            let kind = match engine {
                Engine::Qemu { .. } => "qemu",
                Engine::Process { .. } => "process",
            };
            assert_eq!(config.engine.as_str(), kind);
            assert_eq!(config.data_dir, data_dir);
            assert_eq!(config.api_token.as_deref(), Some(TOKEN));
            assert_eq!(config.silkd_path.as_deref(), Some(silkd.as_path()));
            assert_eq!(config.pools.len(), 1);
            assert_eq!(config.pools[0].template, template);
            assert_eq!(config.pools[0].warm, 2);
            assert_eq!(
                config.pools[0].warmup.as_deref(),
                Some(["sh".to_string(), "-c".into(), WARMUP.into()].as_slice())
            );
            assert_eq!(
                config.templates["default"].image.as_deref(),
                Some(image.as_path())
            );
            let size = &config.sizes["small"];
            assert_eq!(size.cpus, 1);
            match engine {
                Engine::Qemu { .. } => {
                    assert_eq!((size.memory_mib, size.disk_mib), (256, 128));
                }
                Engine::Process { .. } => {
                    assert_eq!(config.templates["default"].rootfs, image.join("rootfs"));
                    assert!(!config.process.unsafe_host_rootfs);
                    assert!(!text.contains("unsafe"), "{text}");
                }
            }
        }
    }

    #[test]
    fn the_token_is_kept_across_runs_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("up/token");
        let (first, created) = load_or_create_token(&path).unwrap();
        assert!(created);
        assert_eq!(first.len(), 64);
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (again, created) = load_or_create_token(&path).unwrap();
        assert!(!created);
        assert_eq!(again, first);
        // Anything but a token is replaced by a fresh one.
        fs::write(&path, "short\n").unwrap();
        let (fresh, created) = load_or_create_token(&path).unwrap();
        assert!(created);
        assert_ne!(fresh, first);
    }

    #[test]
    fn the_node_config_is_private_even_over_an_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("up/sandboxd.toml");
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let node = Node {
            engine: &Engine::Process {
                image: dir.path().join("image"),
            },
            data_dir: &dir.path().join("data"),
            silkd: &dir.path().join("silkd"),
            token: TOKEN,
        };
        write_node_config(&path, &node).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(fs::read_to_string(&path).unwrap().contains(TOKEN));
    }

    #[test]
    fn the_sbx_config_is_private_even_over_an_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sbx/config.toml");
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, &render_sbx_config(URL, TOKEN)).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            format!(
                "# Written by `cargo xtask up`: the node sbx talks to when neither --url/--token\n\
                 # nor SANDBOXD_URL/SANDBOXD_TOKEN say otherwise.\n\
                 url = \"{URL}\"\ntoken = \"{TOKEN}\"\n"
            )
        );
    }
}
