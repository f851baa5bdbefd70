//! How a command ended ([`ExitStatus`], [`Signal`]) and what it wrote ([`Output`]): plain
//! values; the exec answer becomes an [`Output`] here and nowhere else.

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;

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
}
