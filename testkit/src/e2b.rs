//! The E2B compatibility tests' side: the Python environment with the official SDK
//! (`target/e2b-venv`, made by `cargo xtask deps`), a free port for `[e2b] listen`, and
//! running the pytest suite under `e2b/tests/` against a node with its output kept.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The venv's Python; panics naming `cargo xtask deps` when it is missing.
pub fn venv_python() -> PathBuf {
    let python = workspace().join("target/e2b-venv/bin/python");
    assert!(
        python.is_file(),
        "the E2B test environment is missing at {}: run `cargo xtask deps`",
        python.display()
    );
    python
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root")
}

/// A TCP port free a moment ago on 127.0.0.1 (`[e2b] listen` needs one in the config
/// before the daemon starts; the daemon fails loudly if another process took it since).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `[e2b]` config for `port`, with the alias the SDK's default template needs.
pub fn config_section(port: u16, template: &str) -> String {
    format!(
        "\n[e2b]\nlisten = \"127.0.0.1:{port}\"\ntemplate_aliases = {{ base = \"{template}\" }}\n"
    )
}

/// Runs pytest on `tests` (paths under `e2b/tests/`) with the SDK pointed at
/// `127.0.0.1:port` and `api_key`; `-k` filters when given. Blocking: call it from
/// `spawn_blocking`.
pub fn pytest(port: u16, api_key: &str, tests: &[&str], filter: Option<&str>) -> Output {
    let root = workspace();
    let url = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new(venv_python());
    cmd.current_dir(root.join("e2b"))
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-x",
            "--tb=short",
        ])
        .args(tests.iter().map(|t| format!("tests/{t}")))
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", api_key)
        // Another tenant's key, for the isolation checks.
        .env("E2B_TEST_OTHER_KEY", crate::TENANT_B)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN");
    if let Some(k) = filter {
        cmd.args(["-k", k]);
    }
    cmd.output().expect("running pytest")
}
