//! Where the prebuilt binaries are: `target/debug/{silkd,sandboxd,sbx}` and
//! `target/debug/examples/NAME`, found from the test executable's own path so that
//! `CARGO_TARGET_DIR` is respected. Tests never run `cargo build`: `cargo xtask test`
//! (or `cargo build --workspace --bins --examples`) builds them first.

use std::path::{Path, PathBuf};

/// `target/debug` of the build running this test (test executables sit in `deps/`).
pub fn debug_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{} is not under target/debug/deps", exe.display()))
        .to_path_buf()
}

/// `target/debug/<relative>`, or one clear panic saying how to build it.
fn prebuilt(relative: &str) -> PathBuf {
    let path = debug_dir().join(relative);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask test` or `cargo build --workspace --bins --examples` first",
        path.display()
    );
    path
}

/// The debug `silkd` binary.
pub fn silkd() -> PathBuf {
    prebuilt("silkd")
}

/// The debug `sandboxd` binary (sandboxd's own tests use `CARGO_BIN_EXE_sandboxd`).
pub fn sandboxd() -> PathBuf {
    prebuilt("sandboxd")
}

/// A built example, e.g. `example("quickstart")`.
pub fn example(name: &str) -> PathBuf {
    prebuilt(&format!("examples/{name}"))
}
