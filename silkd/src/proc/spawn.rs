//! Spawning one command: who runs it and with what environment and cwd ([`prepare`]),
//! argv, env and cwd checks that name what is wrong (before any fork, so the kernel's
//! limits answer `bad_request`, not `internal`), a cleared environment, its own process
//! group (and cgroup when there is one), the user switch, pipes for the output.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tokio::net::unix::pipe;

use super::cgroup::{self, NewCgroup};
use super::pty;
use super::user::{self, Account};
use crate::{Error, Result};

/// `PATH` every command starts with.
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// `LANG` every command starts with: UTF-8 without needing a generated locale.
const BASE_LANG: &str = "C.UTF-8";
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
    /// Who runs it (name or uid); the `--user` default when absent.
    pub user: Option<String>,
    /// A pseudo-terminal instead of pipes.
    pub pty: Option<wire::Pty>,
}

/// What [`prepare`] decided: the whole environment, the cwd, and the user to switch to.
#[derive(Debug)]
pub struct Launch {
    /// Every variable the command gets, each key once (later sources win).
    pub env: Vec<(String, String)>,
    /// The request's cwd, else the template's workdir.
    pub cwd: Option<String>,
    /// The account to become between fork and exec; `None` stays silkd's own.
    pub switch: Option<Account>,
}

/// Resolves the user (the request's, else `--user`, else silkd's own), and builds the
/// environment: `PATH`, `HOME` (the user's home), `USER`, `LOGNAME`, `LANG`, `TERM`,
/// then the template's `--env`, then the request's `env`. A silkd that is not root runs
/// commands only as itself: any other user is `bad_request` (it has no right to switch,
/// e.g. the process engine's sandbox when sandboxd is not root).
pub fn prepare(spec: &Spec) -> Result<Launch> {
    let defaults = user::defaults();
    let user::Runner { account, switch } = user::runner(spec.user.as_deref())?;
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| match env.iter_mut().find(|(key, _)| key == k) {
        Some(e) => e.1 = v.to_string(),
        None => env.push((k.to_string(), v.to_string())),
    };
    set("PATH", BASE_PATH);
    set("HOME", account.as_ref().map_or("/", |a| a.home.as_str()));
    if let Some(a) = &account {
        set("USER", &a.name);
        set("LOGNAME", &a.name);
        set("SHELL", &a.shell);
    }
    set("LANG", BASE_LANG);
    set("TERM", spec.pty.as_ref().map_or("dumb", |p| p.term()));
    for (k, v) in defaults.env.iter().chain(&spec.env) {
        set(k, v);
    }
    Ok(Launch {
        env,
        cwd: spec.cwd.clone().or_else(|| defaults.workdir.clone()),
        switch,
    })
}

/// A started child: its pid and the async ends of its pipes (or its terminal).
pub struct Spawned {
    /// Pid, also its process group id.
    pub pid: u32,
    /// Write end of its stdin, when requested (the pty master under a pty).
    pub stdin: Option<pipe::Sender>,
    /// Read end of its stdout (the pty master under a pty: all its output).
    pub stdout: pipe::Receiver,
    /// Read end of its stderr; none under a pty (one stream).
    pub stderr: Option<pipe::Receiver>,
    /// The pty master, for resizes.
    pub pty: Option<std::os::fd::OwnedFd>,
}

/// Refuses what execve would refuse for its size or content: NUL bytes anywhere, an
/// empty or `=`-holding env key, one string over [`MAX_ARG_STRLEN`], argv + env over the
/// kernel's total (`ARG_MAX`, a quarter of the stack limit), a cwd over [`PATH_MAX`].
pub fn check(spec: &Spec, launch: &Launch) -> Result<()> {
    let Some(arg0) = spec.argv.first() else {
        return Err(Error::BadRequest("argv is empty".into()));
    };
    if arg0.is_empty() {
        return Err(Error::BadRequest("argv[0] is empty".into()));
    }
    if let Some(p) = &spec.pty {
        p.check().map_err(Error::BadRequest)?;
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
    for (k, v) in launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())) {
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
    if let Some(cwd) = &launch.cwd {
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
pub fn spawn(spec: &Spec, launch: &Launch, cgroup: Option<&NewCgroup>) -> Result<Spawned> {
    let arg0 = &spec.argv[0];
    if let Some(cwd) = &launch.cwd {
        check_cwd(Path::new(cwd))?;
    }
    let path_var = launch
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or(BASE_PATH);
    let program = resolve(arg0, path_var, launch.cwd.as_deref())?;

    let mut cmd = Command::new(&program);
    cmd.arg0(arg0)
        .args(&spec.argv[1..])
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)));
    let master = match &spec.pty {
        None => {
            cmd.process_group(0)
                .stdin(if spec.stdin {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            None
        }
        Some(p) => {
            let pair = pty::open(p.rows, p.cols)?;
            let dup = |fd: &std::os::fd::OwnedFd| {
                fd.try_clone()
                    .map_err(|e| Error::io("dup of the pty slave", e))
            };
            cmd.stdin(Stdio::from(dup(&pair.slave)?))
                .stdout(Stdio::from(dup(&pair.slave)?))
                .stderr(Stdio::from(pair.slave));
            // No process_group(0): setsid, which a group leader may not call, makes the
            // child leader of its own session and group (pid = pgid all the same).
            // SAFETY: two async-signal-safe syscalls, see `pty::become_controlling`.
            unsafe {
                cmd.pre_exec(pty::become_controlling);
            }
            Some(pair.master)
        }
    };
    if let Some(cwd) = &launch.cwd {
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
    if let Some(a) = &launch.switch {
        let (uid, gid, groups) = (a.uid, a.gid, a.groups.clone());
        // SAFETY: three syscalls on values moved in before the fork; nothing allocates.
        // Groups first and uid last: after setresuid the child may no longer change them.
        // Registered after the cgroup step, which needs silkd's rights.
        unsafe {
            cmd.pre_exec(move || {
                let ok = |r: libc::c_int| {
                    if r == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                };
                ok(libc::setgroups(groups.len(), groups.as_ptr()))?;
                ok(libc::setresgid(gid, gid, gid))?;
                ok(libc::setresuid(uid, uid, uid))
            });
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
    // The parent's copies of the slave go with `cmd`, so the master reads EIO once the
    // command and everything it started have closed theirs.
    drop(cmd);
    if let Some(master) = master {
        let (stdout, stdin) = pty::master_io(&master)?;
        return Ok(Spawned {
            pid,
            stdin: Some(stdin),
            stdout,
            stderr: None,
            pty: Some(master),
        });
    }
    let stdin = child
        .stdin
        .take()
        .map(|s| pipe::Sender::from_owned_fd(s.into()))
        .transpose()
        .map_err(|e| Error::io("registering stdin pipe", e))?;
    let stdout: std::os::fd::OwnedFd = child.stdout.take().expect("piped").into();
    widen(&stdout);
    let stdout = pipe::Receiver::from_owned_fd(stdout)
        .map_err(|e| Error::io("registering stdout pipe", e))?;
    let stderr = pipe::Receiver::from_owned_fd(child.stderr.take().expect("piped").into())
        .map_err(|e| Error::io("registering stderr pipe", e))?;
    // `child` is dropped without waiting: the reaper owns collection.
    Ok(Spawned {
        pid,
        stdin,
        stdout,
        stderr: Some(stderr),
        pty: None,
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

/// A command's stdout pipe holds [`PIPE_BYTES`] instead of the kernel's 64 KiB, so a fast
/// writer fills whole output frames between two of our reads (fewer frames and wake-ups
/// per byte: `bench throughput`). Best effort: a host capping pipes lower keeps 64 KiB.
fn widen(fd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    // SAFETY: F_SETPIPE_SZ on a pipe fd we own; no memory is passed.
    unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_SETPIPE_SZ,
            PIPE_BYTES as libc::c_int,
        )
    };
}

/// What [`widen`] asks a stdout pipe to hold: 1 MiB, the default `pipe-max-size`.
const PIPE_BYTES: usize = 1 << 20;
