//! What to run ([`Command`]) and how it ended ([`ExitStatus`], [`Signal`], [`Output`]):
//! plain values, turned into the HTTP exec body or the wire `Exec` frame (and the exec
//! answer back into an [`Output`]) here and nowhere else.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use base64::Engine as _;

/// A command to run in a sandbox: argv, working directory, extra environment, timeout and
/// whether it reads stdin. Build it once; run it with [`Sandbox::exec`](crate::Sandbox::exec)
/// (buffered) or [`Sandbox::spawn`](crate::Sandbox::spawn) (streaming).
///
/// ```
/// use std::time::Duration;
/// use sandbox_sdk::Command;
///
/// let cmd = Command::new("sh")
///     .args(["-c", "echo $GREETING from $(pwd)"])
///     .cwd("/tmp")
///     .env("GREETING", "hello")
///     .timeout(Duration::from_secs(10));
/// assert_eq!(cmd.argv(), ["sh", "-c", "echo $GREETING from $(pwd)"]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    argv: Vec<String>,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    timeout: Option<Duration>,
    stdin: bool,
    user: Option<String>,
    pty: Option<wire::Pty>,
    detach: bool,
}

impl Command {
    /// A command running `program` (looked up in the guest's `PATH` when it has no `/`).
    pub fn new(program: impl Into<String>) -> Command {
        Command {
            argv: vec![program.into()],
            cwd: None,
            env: BTreeMap::new(),
            timeout: None,
            stdin: false,
            user: None,
            pty: None,
            detach: false,
        }
    }

    /// A shell command line, run by the sandbox user's login shell (`SHELL`, from the
    /// template's `user.shell`; `/bin/sh` when unset) with `-c`: pipes, `&&`, `cd`,
    /// globs and variables work as in a terminal. The argv is a small `/bin/sh` wrapper
    /// that `exec`s that shell, so the line is passed as one argument, never re-quoted.
    ///
    /// ```
    /// use sandbox_sdk::Command;
    ///
    /// let cmd = Command::shell("cd /tmp && ls | wc -l");
    /// assert_eq!(cmd.argv().last().unwrap(), "cd /tmp && ls | wc -l");
    /// ```
    pub fn shell(line: impl Into<String>) -> Command {
        // Only the guest knows the user's shell (silkd sets `SHELL` from /etc/passwd).
        Command::from_argv([
            "/bin/sh",
            "-c",
            "exec \"${SHELL:-/bin/sh}\" -c \"$1\"",
            "sh",
        ])
        .arg(line)
    }

    /// A command from a whole argv; [`Sandbox::exec`](crate::Sandbox::exec) refuses an
    /// empty one with [`Error::BadRequest`](crate::Error::BadRequest).
    pub fn from_argv<I, S>(argv: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Command {
            argv: argv.into_iter().map(Into::into).collect(),
            ..Command::new("")
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Command {
        self.argv.push(arg.into());
        self
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// Working directory inside the sandbox.
    pub fn cwd(mut self, dir: impl Into<String>) -> Command {
        self.cwd = Some(dir.into());
        self
    }

    /// Sets one environment variable on top of the guest's base `PATH`, `HOME`, `TERM`.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Command {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Sets several environment variables.
    pub fn envs<I, K, V>(mut self, vars: I) -> Command
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Kill the command (its whole process group) after this long; the call then fails
    /// with [`Error::Timeout`](crate::Error::Timeout). Enforced by the guest agent itself.
    pub fn timeout(mut self, timeout: Duration) -> Command {
        self.timeout = Some(timeout);
        self
    }

    /// Whether a spawned command reads stdin from [`Process::stdin`](crate::Process::stdin)
    /// (default: no, its stdin is `/dev/null`). Buffered exec has no stdin.
    pub fn stdin(mut self, on: bool) -> Command {
        self.stdin = on;
        self
    }

    /// Runs the command as this user (a name or numeric uid from the sandbox's
    /// `/etc/passwd`) instead of the template's user; an unknown user is a 400.
    pub fn user(mut self, user: impl Into<String>) -> Command {
        self.user = Some(user.into());
        self
    }

    /// Runs a spawned command under a pseudo-terminal of `rows` x `cols`: its stdin,
    /// stdout and stderr are the terminal, all output arrives as stdout (with the
    /// terminal's `\r\n`), stdin is always open (bytes are keystrokes: `0x03` is
    /// Ctrl-C), and [`Process::resize`](crate::Process::resize) changes the size. `TERM`
    /// is `xterm-256color` unless [`term`](Command::term) says otherwise. Buffered exec
    /// refuses it. Sizes must be 1..=4096; others are a `BadRequest` from the guest.
    pub fn pty(mut self, rows: u32, cols: u32) -> Command {
        let term = self.pty.take().and_then(|p| p.term);
        self.pty = Some(wire::Pty { rows, cols, term });
        self
    }

    /// `TERM` for a [`pty`](Command::pty) command (letters, digits, `.`, `_`, `+`, `-`).
    pub fn term(mut self, term: impl Into<String>) -> Command {
        let pty = self.pty.get_or_insert(wire::Pty {
            rows: 24,
            cols: 80,
            term: None,
        });
        pty.term = Some(term.into());
        self
    }

    /// Keeps a spawned command running when its [`Process`](crate::Process) is dropped
    /// or its connection breaks: the guest keeps its output in a bounded ring, and
    /// [`Sandbox::attach`](crate::Sandbox::attach) follows it again later (by pid, from
    /// [`Sandbox::processes`](crate::Sandbox::processes)); end it with
    /// [`Process::kill`](crate::Process::kill) or [`Sandbox::kill`](crate::Sandbox::kill).
    /// It takes no [`timeout`](Command::timeout) (the guest refuses the pair); buffered
    /// exec refuses it.
    pub fn detach(mut self, on: bool) -> Command {
        self.detach = on;
        self
    }

    /// Whether the command is detached.
    pub fn is_detached(&self) -> bool {
        self.detach
    }

    /// Whether the command runs under a pseudo-terminal.
    pub fn has_pty(&self) -> bool {
        self.pty.is_some()
    }

    /// The program and its arguments.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// Whether the command reads stdin (always, under a pty).
    pub fn reads_stdin(&self) -> bool {
        self.stdin || self.pty.is_some()
    }

    /// The body of `POST /v1/sandboxes/{id}/exec`.
    pub(crate) fn exec_request(&self) -> api::ExecRequest {
        api::ExecRequest {
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            env: (!self.env.is_empty()).then(|| self.env.clone()),
            timeout_seconds: self.timeout.map(|t| t.as_secs_f64()),
            encoding: None,
            user: self.user.clone(),
        }
    }

    /// The wire `Exec` frame that starts the command over the relay.
    pub(crate) fn exec_frame(&self) -> wire::Request {
        wire::Request::Exec {
            pty: self.pty.clone(),
            detach: self.detach,
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            env: (!self.env.is_empty()).then(|| {
                self.env
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            }),
            stdin: self.stdin,
            // Round up so that a sub-millisecond timeout is not sent as "none".
            timeout_ms: self
                .timeout
                .map(|t| t.as_millis().max(1).try_into().unwrap_or(u64::MAX)),
            user: self.user.clone(),
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// A signal (this number) ended it.
    Signal(i32),
}

impl ExitStatus {
    /// From the optional code and signal that both the HTTP answer and the wire carry.
    pub(crate) fn from_parts(code: Option<i32>, signal: Option<i32>) -> Option<ExitStatus> {
        match (signal, code) {
            (Some(s), _) => Some(ExitStatus::Signal(s)),
            (None, Some(c)) => Some(ExitStatus::Code(c)),
            (None, None) => None,
        }
    }

    /// True when it exited with code 0.
    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }

    /// The exit code, when it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            ExitStatus::Code(c) => Some(c),
            ExitStatus::Signal(_) => None,
        }
    }

    /// The signal, when one ended it.
    pub fn signal(self) -> Option<i32> {
        match self {
            ExitStatus::Code(_) => None,
            ExitStatus::Signal(s) => Some(s),
        }
    }

    /// The status a shell would report: the code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }
}

/// `exit code 3`, or `killed by SIGKILL (signal 9)` (the number alone when it has no name).
impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exit code {c}"),
            ExitStatus::Signal(s) => match Signal::from_number(*s) {
                Some(sig) => write!(f, "killed by {sig} (signal {s})"),
                None => write!(f, "killed by signal {s}"),
            },
        }
    }
}

/// A signal by name, for [`Process::kill_with`](crate::Process::kill_with) and
/// [`Sandbox::kill`](crate::Sandbox::kill), so callers need no `libc`. The numbers are
/// Linux's (the guest's), whatever system the client runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Signal {
    /// SIGHUP (1): the terminal went away; many daemons reload on it.
    Hup,
    /// SIGINT (2): Ctrl-C.
    Int,
    /// SIGQUIT (3).
    Quit,
    /// SIGKILL (9): cannot be caught.
    Kill,
    /// SIGUSR1 (10).
    Usr1,
    /// SIGUSR2 (12).
    Usr2,
    /// SIGTERM (15): asks to end.
    Term,
    /// SIGCONT (18): resumes a stopped process.
    Cont,
    /// SIGSTOP (19): stops it; cannot be caught.
    Stop,
}

impl Signal {
    const ALL: [(Signal, i32, &'static str); 9] = [
        (Signal::Hup, 1, "SIGHUP"),
        (Signal::Int, 2, "SIGINT"),
        (Signal::Quit, 3, "SIGQUIT"),
        (Signal::Kill, 9, "SIGKILL"),
        (Signal::Usr1, 10, "SIGUSR1"),
        (Signal::Usr2, 12, "SIGUSR2"),
        (Signal::Term, 15, "SIGTERM"),
        (Signal::Cont, 18, "SIGCONT"),
        (Signal::Stop, 19, "SIGSTOP"),
    ];

    /// Its number in the guest.
    pub fn number(self) -> i32 {
        Signal::ALL
            .iter()
            .find(|(s, ..)| *s == self)
            .expect("listed")
            .1
    }

    /// The signal with this number, when it is one named here.
    pub fn from_number(n: i32) -> Option<Signal> {
        Signal::ALL
            .iter()
            .find(|(_, num, _)| *num == n)
            .map(|(s, ..)| *s)
    }
}

/// `SIGTERM` and so on.
impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Signal::ALL
            .iter()
            .find(|(s, ..)| s == self)
            .expect("listed")
            .2;
        f.write_str(name)
    }
}

impl From<Signal> for i32 {
    fn from(signal: Signal) -> i32 {
        signal.number()
    }
}

/// What a buffered exec returns: how the command ended and its exact output bytes.
///
/// A non-zero exit is still `Ok(Output)`: check [`success`](Output::success), or turn it
/// into an error with [`check`](Output::check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// How it ended.
    pub exit: ExitStatus,
    /// Everything it wrote to stdout, byte for byte.
    pub stdout: Vec<u8>,
    /// Everything it wrote to stderr, byte for byte.
    pub stderr: Vec<u8>,
}

impl Output {
    /// True when the command exited with code 0.
    pub fn success(&self) -> bool {
        self.exit.success()
    }

    /// Stdout as text. Invalid UTF-8 is never an error here: each invalid sequence becomes
    /// U+FFFD (`�`), as `String::from_utf8_lossy` does, and valid text is borrowed as is.
    /// The exact bytes stay in [`stdout`](Output::stdout); use
    /// `String::from_utf8(out.stdout)` to refuse invalid text instead.
    pub fn stdout_text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.stdout)
    }

    /// Stderr as text, with the same rule as [`stdout_text`](Output::stdout_text).
    pub fn stderr_text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.stderr)
    }

    /// From the exec answer's fields, whichever of the plain or `_b64` forms came. A
    /// partial answer (504, 413) has neither code nor signal when a node did not say; the
    /// node kills what it cuts short, so it counts as SIGKILL.
    pub(crate) fn from_answer(answer: api::ExecResponse) -> Result<Output, String> {
        let cut = answer.timed_out || answer.truncated;
        let exit = match ExitStatus::from_parts(answer.exit_code, answer.signal) {
            Some(exit) => exit,
            None if cut => ExitStatus::Signal(Signal::Kill.number()),
            None => return Err("exec answer has neither exit_code nor signal".into()),
        };
        Ok(Output {
            exit,
            stdout: stream_bytes("stdout", answer.stdout, answer.stdout_b64)?,
            stderr: stream_bytes("stderr", answer.stderr, answer.stderr_b64)?,
        })
    }
}

fn stream_bytes(name: &str, text: Option<String>, b64: Option<String>) -> Result<Vec<u8>, String> {
    match (text, b64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("{name}_b64 is not base64: {e}")),
        (None, None) => Ok(Vec::new()),
        (Some(_), Some(_)) => Err(format!("exec answer has both {name} and {name}_b64")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_both_request_forms() {
        let cmd = Command::new("env")
            .env("B", "2")
            .env("A", "1")
            .cwd("/tmp")
            .timeout(Duration::from_millis(1500))
            .stdin(true)
            .user("root");
        let http = cmd.exec_request();
        assert_eq!(http.argv, ["env"]);
        assert_eq!(http.timeout_seconds, Some(1.5));
        assert_eq!(http.user.as_deref(), Some("root"));
        assert_eq!(http.env.unwrap().len(), 2);
        match cmd.exec_frame() {
            wire::Request::Exec {
                argv,
                cwd,
                env,
                stdin,
                timeout_ms,
                user,
                pty,
                detach,
            } => {
                assert_eq!(pty, None);
                assert!(!detach);
                assert_eq!(user.as_deref(), Some("root"));
                assert_eq!(argv, ["env"]);
                assert_eq!(cwd.as_deref(), Some("/tmp"));
                assert_eq!(
                    env.unwrap(),
                    [("A".into(), "1".into()), ("B".into(), "2".into())]
                );
                assert!(stdin);
                assert_eq!(timeout_ms, Some(1500));
            }
            other => panic!("not an exec frame: {other:?}"),
        }
    }

    #[test]
    fn omits_what_is_unset() {
        let http = Command::from_argv(["true"]).exec_request();
        assert_eq!(http.env, None);
        assert_eq!(http.cwd, None);
        assert_eq!(http.timeout_seconds, None);
        let json = serde_json::to_string(&http).unwrap();
        assert_eq!(json, r#"{"argv":["true"]}"#);
    }

    #[test]
    fn exit_status_forms() {
        assert_eq!(
            ExitStatus::from_parts(Some(7), None),
            Some(ExitStatus::Code(7))
        );
        assert_eq!(
            ExitStatus::from_parts(None, Some(9)),
            Some(ExitStatus::Signal(9))
        );
        assert_eq!(ExitStatus::from_parts(None, None), None);
        assert_eq!(ExitStatus::Signal(9).shell_code(), 137);
        assert_eq!(ExitStatus::Code(3).shell_code(), 3);
        assert!(ExitStatus::Code(0).success());
        assert!(!ExitStatus::Signal(15).success());
        assert_eq!(ExitStatus::Code(3).to_string(), "exit code 3");
        assert_eq!(
            ExitStatus::Signal(9).to_string(),
            "killed by SIGKILL (signal 9)"
        );
        assert_eq!(ExitStatus::Signal(64).to_string(), "killed by signal 64");
    }

    #[test]
    fn signals_by_name_are_linux_numbers() {
        for (signal, n, name) in Signal::ALL {
            assert_eq!(signal.number(), n);
            assert_eq!(i32::from(signal), n);
            assert_eq!(Signal::from_number(n), Some(signal));
            assert_eq!(signal.to_string(), name);
        }
        assert_eq!(Signal::Term.number(), 15);
        assert_eq!(Signal::from_number(0), None);
    }

    #[test]
    fn text_accessors_replace_invalid_utf8() {
        let out = Output {
            exit: ExitStatus::Code(1),
            stdout: "héllo\n".into(),
            stderr: b"bad \xff byte".to_vec(),
        };
        assert!(matches!(out.stdout_text(), Cow::Borrowed("héllo\n")));
        assert_eq!(out.stderr_text(), "bad \u{fffd} byte");
        assert!(!out.success());
    }

    #[test]
    fn shell_passes_the_line_as_one_argument() {
        let cmd = Command::shell("echo 'a b' \"$HOME\" && false");
        assert_eq!(cmd.argv()[0], "/bin/sh");
        assert_eq!(cmd.argv().last().unwrap(), "echo 'a b' \"$HOME\" && false");
        assert_eq!(cmd.argv().len(), 5);
    }
}
