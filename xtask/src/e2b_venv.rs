//! The Python environment the E2B compatibility tests run the official SDK in
//! (`target/e2b-venv`, from `e2b/requirements.txt`, every package pinned). Made by
//! `cargo xtask deps`; remade only when the requirements change (a stamp file holds the
//! ones it was made from). Why `venv --without-pip` plus the system `pip3 --python`:
//! Debian's `python3-venv` (ensurepip) is then not needed, only `python3-pip`.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::{tool, Error, Result};

/// The environment, under the workspace root.
pub const VENV: &str = "target/e2b-venv";
/// The pinned requirements, under the workspace root.
pub const REQUIREMENTS: &str = "e2b/requirements.txt";
const STAMP: &str = "requirements.stamp";

/// Makes (or keeps) the environment.
pub fn ensure(root: &Path) -> Result<()> {
    let venv = root.join(VENV);
    let req_path = root.join(REQUIREMENTS);
    let want = fs::read_to_string(&req_path).map_err(|source| Error::Io {
        context: "reading the E2B test requirements",
        path: req_path.clone(),
        source,
    })?;
    if fs::read_to_string(venv.join(STAMP)).ok().as_deref() == Some(want.as_str()) {
        eprintln!("deps: e2b venv: ready ({})", venv.display());
        return Ok(());
    }
    tool::stream(
        "e2b venv",
        Command::new("python3")
            .args(["-m", "venv", "--without-pip", "--clear"])
            .arg(&venv),
    )?;
    tool::stream(
        "e2b venv",
        Command::new("pip3")
            .arg("--python")
            .arg(venv.join("bin/python"))
            .args([
                "install",
                "--quiet",
                "--no-input",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&req_path),
    )?;
    fs::write(venv.join(STAMP), want).map_err(|source| Error::Io {
        context: "writing the e2b venv stamp",
        path: venv.join(STAMP),
        source,
    })?;
    eprintln!("deps: e2b venv: made ({})", venv.display());
    Ok(())
}
