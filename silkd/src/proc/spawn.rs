//! Spawning one command: argv, env and cwd checks that name what is wrong (before any
//! fork, so the kernel's limits answer `bad_request`, not `internal`), a cleared
//! environment, its own process group (and cgroup when there is one), pipes for the
//! output.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tokio::net::unix::pipe;

use super::cgroup::{self, NewCgroup};
use crate::{Error, Result};

/// `PATH` every command starts with.
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The environment every command starts with, before the request's `env`.
const BASE_ENV: [(&str, &str); 3] = [("PATH", BASE_PATH), ("HOME", "/root"), ("TERM", "dumb")];
/// The kernel's longest single argument or `KEY=value` string, its NUL included
/// (`MAX_ARG_STRLEN`, 32 pages); execve fails with E2BIG past it.
pub const MAX_ARG_STRLEN: usize = 32 * 4096;
/// Longest cwd accepted (`PATH_MAX`, its NUL included).
pub const PATH_MAX: usize = 4096;

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

/// Refuses what execve would refuse for its size or content: NUL bytes anywhere, an
/// empty or `=`-holding env key, one string over [`MAX_ARG_STRLEN`], argv + env over the
/// kernel's total (`ARG_MAX`, a quarter of the stack limit), a cwd over [`PATH_MAX`].
pub fn check(spec: &Spec) -> Result<()> {
    let Some(arg0) = spec.argv.first() else {
        return Err(Error::BadRequest("argv is empty".into()));
    };
    if arg0.is_empty() {
        return Err(Error::BadRequest("argv[0] is empty".into()));
    }
    // execve's cost: each string with its NUL, plus a pointer to it, plus two NULL ends.
    let ptr = std::mem::size_of::<usize>();
    let mut total = 2 * ptr;
    for (i, a) in spec.argv.iter().enumerate() {
        if a.contains('\0') {
            return Err(Error::BadRequest(format!("argv[{i}] contains a NUL byte")));
        }
        check_strlen(&format!("argv[{i}]"), a.len() + 1)?;
        total += a.len() + 1 + ptr;
    }
    let base = BASE_ENV.iter().map(|(k, v)| (*k, *v));
    let extra = spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    for (k, v) in base.chain(extra) {
        if k.is_empty() || k.contains(['=', '\0']) {
            return Err(Error::BadRequest(format!(
                "env key {:?} must be non-empty without '=' or NUL",
                truncated(k)
            )));
        }
        if v.contains('\0') {
            return Err(Error::BadRequest(format!(
                "env value of {:?} contains a NUL byte",
                truncated(k)
            )));
        }
        check_strlen(&format!("env {:?}", truncated(k)), k.len() + v.len() + 2)?;
        total += k.len() + v.len() + 2 + ptr;
    }
    let arg_max = arg_max();
    if total > arg_max {
        return Err(Error::BadRequest(format!(
            "argv and env take {total} bytes; the kernel takes at most {arg_max} (ARG_MAX)"
        )));
    }
    if let Some(cwd) = &spec.cwd {
        if cwd.contains('\0') {
            return Err(Error::BadRequest("cwd contains a NUL byte".into()));
        }
        if cwd.len() >= PATH_MAX {
            return Err(Error::BadRequest(format!(
                "cwd is {} bytes; at most {} are accepted",
                cwd.len(),
                PATH_MAX - 1
            )));
        }
    }
    Ok(())
}

fn check_strlen(what: &str, with_nul: usize) -> Result<()> {
    if with_nul > MAX_ARG_STRLEN {
        return Err(Error::BadRequest(format!(
            "{what} is {} bytes; the kernel takes at most {} per string",
            with_nul - 1,
            MAX_ARG_STRLEN - 1
        )));
    }
    Ok(())
}

/// The start of `s`, for messages about strings that may be huge.
fn truncated(s: &str) -> &str {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The kernel's limit on argv + env, from `sysconf(_SC_ARG_MAX)` (a quarter of the stack
/// limit, at least 128 KiB).
fn arg_max() -> usize {
    // SAFETY: sysconf reads a limit and has no other effect.
    let n = unsafe { libc::sysconf(libc::_SC_ARG_MAX) };
    if n > 0 {
        n as usize
    } else {
        128 * 1024
    }
}

/// Starts the command, inside `cgroup` when given. Must run under the process table lock
/// (see `proc`), because the child is not waited for here: the reaper collects it. The
/// spec has passed [`check`].
pub fn spawn(spec: &Spec, cgroup: Option<&NewCgroup>) -> Result<Spawned> {
    let arg0 = &spec.argv[0];
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
        .envs(BASE_ENV)
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
    if let Some(cg) = cgroup {
        let procs = std::os::fd::AsRawFd::as_raw_fd(&cg.procs);
        // SAFETY: `enter` makes one write(2), async-signal-safe; the descriptor stays open
        // in the parent until spawn returns. Joining before exec means nothing the
        // command runs, however quickly it forks, starts outside its cgroup.
        unsafe {
            cmd.pre_exec(move || cgroup::enter(procs));
        }
    }
    let mut child = cmd.spawn().map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT | libc::EACCES | libc::ENOEXEC | libc::ENOTDIR | libc::E2BIG) => {
            Error::BadRequest(format!("cannot execute {}: {e}", program.display()))
        }
        // std's own refusal of a string it cannot pass (a NUL byte).
        None if e.kind() == std::io::ErrorKind::InvalidInput => {
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
