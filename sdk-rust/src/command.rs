//! What to run ([`Command`]): a plain value, turned into the HTTP exec body or the wire
//! `Exec` frame here and nowhere else. How it ended lives in `outcome.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

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
            // The SDK hands out bytes either way; as a JSON string, output full of control
            // bytes grows sixfold (`\u0000`) and parses at 25 MiB/s (`bench throughput`).
            encoding: Some(api::Encoding::Base64),
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
        assert_eq!(json, r#"{"argv":["true"],"encoding":"base64"}"#);
    }

    #[test]
    fn shell_passes_the_line_as_one_argument() {
        let cmd = Command::shell("echo 'a b' \"$HOME\" && false");
        assert_eq!(cmd.argv()[0], "/bin/sh");
        assert_eq!(cmd.argv().last().unwrap(), "echo 'a b' \"$HOME\" && false");
        assert_eq!(cmd.argv().len(), 5);
    }
}
