//! Spawning one command: argv and cwd checks that name the bad path, a cleared
//! environment, its own process group, pipes for the output.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tokio::net::unix::pipe;

use crate::{Error, Result};

/// `PATH` every command starts with.
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What to run.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Working directory.
    pub cwd: Option<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Whether stdin is a pipe (else `/dev/null`).
    pub stdin: bool,
}

/// A started child: its pid and the async ends of its pipes.
pub struct Spawned {
    /// Pid, also its process group id.
    pub pid: u32,
    /// Write end of its stdin, when requested.
    pub stdin: Option<pipe::Sender>,
    /// Read end of its stdout.
    pub stdout: pipe::Receiver,
    /// Read end of its stderr.
    pub stderr: pipe::Receiver,
}

/// Starts the command. Must run under the process table lock (see `proc`), because the
/// child is not waited for here: the reaper collects it.
pub fn spawn(spec: &Spec) -> Result<Spawned> {
    let Some(arg0) = spec.argv.first() else {
        return Err(Error::BadRequest("argv is empty".into()));
    };
    if arg0.is_empty() {
        return Err(Error::BadRequest("argv[0] is empty".into()));
    }
    if let Some(cwd) = &spec.cwd {
        check_cwd(Path::new(cwd))?;
    }
    let path_var = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or(BASE_PATH);
    let program = resolve(arg0, path_var, spec.cwd.as_deref())?;

    let mut cmd = Command::new(&program);
    cmd.arg0(arg0)
        .args(&spec.argv[1..])
        .env_clear()
        .env("PATH", BASE_PATH)
        .env("HOME", "/root")
        .env("TERM", "dumb")
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd.spawn().map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT | libc::EACCES | libc::ENOEXEC | libc::ENOTDIR) => {
            Error::BadRequest(format!("cannot execute {}: {e}", program.display()))
        }
        _ => Error::io(format!("spawning {}", program.display()), e),
    })?;
    let pid = child.id();
    let stdin = child
        .stdin
        .take()
        .map(|s| pipe::Sender::from_owned_fd(s.into()))
        .transpose()
        .map_err(|e| Error::io("registering stdin pipe", e))?;
    let stdout = pipe::Receiver::from_owned_fd(child.stdout.take().expect("piped").into())
        .map_err(|e| Error::io("registering stdout pipe", e))?;
    let stderr = pipe::Receiver::from_owned_fd(child.stderr.take().expect("piped").into())
        .map_err(|e| Error::io("registering stderr pipe", e))?;
    // `child` is dropped without waiting: the reaper owns collection.
    Ok(Spawned {
        pid,
        stdin,
        stdout,
        stderr,
    })
}

fn check_cwd(cwd: &Path) -> Result<()> {
    match std::fs::metadata(cwd) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::BadRequest(format!(
            "cwd {} is not a directory",
            cwd.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::BadRequest(format!(
            "cwd {} does not exist",
            cwd.display()
        ))),
        Err(e) => Err(Error::BadRequest(format!("cwd {}: {e}", cwd.display()))),
    }
}

/// Finds the program: a name with `/` is taken as is (relative to `cwd`), else searched in
/// `PATH`. The error names what was looked for.
fn resolve(arg0: &str, path_var: &str, cwd: Option<&str>) -> Result<PathBuf> {
    if arg0.contains('/') {
        let p = match cwd {
            Some(cwd) if !arg0.starts_with('/') => Path::new(cwd).join(arg0),
            _ => PathBuf::from(arg0),
        };
        return check_executable(&p).map(|()| p);
    }
    let mut not_executable = None;
    for dir in path_var.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(OsStr::from_bytes(arg0.as_bytes()));
        match check_executable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if candidate.exists() => not_executable = Some(e),
            Err(_) => {}
        }
    }
    Err(not_executable.unwrap_or_else(|| {
        Error::BadRequest(format!("command {arg0:?} not found in PATH {path_var}"))
    }))
}

fn check_executable(p: &Path) -> Result<()> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Err(Error::BadRequest(format!(
            "{} is a directory, not a command",
            p.display()
        ))),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err(Error::BadRequest(format!(
            "{} is not executable",
            p.display()
        ))),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::BadRequest(format!(
            "command {} does not exist",
            p.display()
        ))),
        Err(e) => Err(Error::BadRequest(format!("command {}: {e}", p.display()))),
    }
}
