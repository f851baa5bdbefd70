//! Project automation behind `cargo xtask`: system packages, the test gate, the static
//! silkd, the guest image, benchmarks and `up`. It holds no product logic.
//!
//! # Layout
//! - [`deps`]: `cargo xtask deps`, the system packages the tests and a node need.
//! - [`test`]: `cargo xtask test`, the gate `.ci/run` runs.
//! - [`silkd`]: `cargo xtask build-silkd`, silkd as a static binary for the guest.
//! - [`image`]: `cargo xtask image`, the guest image built from Debian packages.
//! - [`bench`]: `cargo xtask bench <name>`.
//! - [`dist`]: `cargo xtask dist`, the Debian package and tarball for operators.
//! - [`up`]: `cargo xtask up`, a node from a fresh clone: packages, build, config, start.
//! - `tool`: running external programs so that a failure names the program.

pub mod bench;
pub mod bench_env;
pub mod deps;
pub mod dist;
pub mod e2b_venv;
pub mod image;
pub mod silkd;
pub mod test;
mod tool;
pub mod up;

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

pub type Result<T> = std::result::Result<T, Error>;

/// Every way a task fails. Messages name the step, tool, package or path involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("step `{step}` failed: `{command}` exited with {status}")]
    StepFailed {
        step: &'static str,
        command: String,
        status: ExitStatus,
    },
    #[error("required tool `{tool}` was not found on PATH ({hint})")]
    MissingTool { tool: String, hint: &'static str },
    #[error("could not start `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("`{command}` exited with {status}: {stderr}")]
    ToolFailed {
        command: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("{what}: run `{fix}`")]
    Missing { what: String, fix: &'static str },
    #[error("Debian package `{package}`: {reason}")]
    Package { package: String, reason: String },
    #[error("{context}: {}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("unknown benchmark `{name}`; known benchmarks: {known}")]
    UnknownBenchmark { name: String, known: String },
}

impl Error {
    /// Wraps an I/O error with what was being done and to which path.
    pub fn io<'a>(context: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
        move |source| Error::Io {
            context,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Renders an error followed by each of its causes, `: `-separated.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

/// The workspace root (the directory holding the virtual manifest).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}
