//! Output as text lines: [`Lines`] over one [`OutputStream`], and [`Sandbox::exec_lines`],
//! which runs a command while a closure sees each stdout/stderr line as it arrives and
//! still returns the whole [`Output`].
//!
//! The one text rule, for both: a line ends at `\n`, which is removed (with a `\r` just
//! before it); a last line without `\n` still comes at the end; invalid UTF-8 becomes
//! U+FFFD (`�`), as `String::from_utf8_lossy` does. The exact bytes stay available:
//! [`Output`]'s fields, or the [`OutputStream`] itself.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures::Stream;

use crate::command::Command;
use crate::error::{Error, Result};
use crate::outcome::{ExitStatus, Output, Signal};
use crate::process::{Event, OutputStream};
use crate::sandbox::Sandbox;

/// Bytes cut into lines as they arrive; a line may span any number of chunks.
#[derive(Default)]
struct Splitter {
    partial: Vec<u8>,
}

impl Splitter {
    /// Hands each line `bytes` completes to `line`.
    fn push(&mut self, bytes: &[u8], mut line: impl FnMut(String)) {
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            self.partial.extend_from_slice(&rest[..i]);
            line(text(std::mem::take(&mut self.partial)));
            rest = &rest[i + 1..];
        }
        self.partial.extend_from_slice(rest);
    }

    /// The last line, when the output did not end with `\n`.
    fn finish(&mut self) -> Option<String> {
        (!self.partial.is_empty()).then(|| text(std::mem::take(&mut self.partial)))
    }
}

fn text(mut line: Vec<u8>) -> String {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    match String::from_utf8(line) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// One line of a command's output, from [`Sandbox::exec_lines`]. Displays as its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A line it wrote to stdout.
    Stdout(String),
    /// A line it wrote to stderr.
    Stderr(String),
}

impl Line {
    /// The line's text, without its `\n`.
    pub fn text(&self) -> &str {
        match self {
            Line::Stdout(t) | Line::Stderr(t) => t,
        }
    }

    /// True for a stderr line.
    pub fn is_stderr(&self) -> bool {
        matches!(self, Line::Stderr(_))
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

/// An [`OutputStream`] read line by line, from [`OutputStream::lines`]: call
/// [`next_line`](Lines::next_line), or use it as a [`Stream`] of `String`s.
pub struct Lines {
    stream: OutputStream,
    splitter: Splitter,
    ready: VecDeque<String>,
    ended: bool,
}

impl OutputStream {
    /// This stream as text lines (the rule is in [`Lines`]' module docs: `\n` removed,
    /// invalid UTF-8 as U+FFFD, a last unterminated line included).
    ///
    /// ```no_run
    /// # async fn run(sandbox: sandbox_sdk::Sandbox) -> Result<(), sandbox_sdk::Error> {
    /// use sandbox_sdk::Command;
    /// let mut process = sandbox.spawn(&Command::shell("make 2>&1")).await?;
    /// let mut lines = process.take_stdout().expect("not read yet").lines();
    /// while let Some(line) = lines.next_line().await {
    ///     println!("make: {line}");
    /// }
    /// let status = process.wait().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lines(self) -> Lines {
        Lines {
            stream: self,
            splitter: Splitter::default(),
            ready: VecDeque::new(),
            ended: false,
        }
    }
}

impl Lines {
    /// The next line; `None` once the command's stream ended (why it ended comes from
    /// [`Process::wait`](crate::Process::wait)).
    pub async fn next_line(&mut self) -> Option<String> {
        futures::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

impl Stream for Lines {
    type Item = String;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<String>> {
        let this = &mut *self;
        loop {
            if let Some(line) = this.ready.pop_front() {
                return Poll::Ready(Some(line));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.stream).poll_next(cx)) {
                Some(chunk) => {
                    let ready = &mut this.ready;
                    this.splitter.push(&chunk, |line| ready.push_back(line));
                }
                None => {
                    this.ended = true;
                    this.ready.extend(this.splitter.finish());
                }
            }
        }
    }
}

impl Sandbox {
    /// Runs a command over the relay (as [`spawn`](Sandbox::spawn)) and calls `on_line`
    /// with each line of its stdout and stderr as it arrives, in arrival order; returns
    /// the whole [`Output`] at the end, like [`exec`](Sandbox::exec) (a non-zero exit is
    /// `Ok`). Lines follow the rule of [`Lines`]; the `Output` keeps the exact bytes, all
    /// of them (no cap: mind the command's output size). A [`Command::timeout`] that
    /// expires fails with [`Error::Timeout`] carrying the output seen until then. A
    /// command built with stdin gets EOF at once.
    ///
    /// ```no_run
    /// # async fn run(sandbox: sandbox_sdk::Sandbox) -> Result<(), sandbox_sdk::Error> {
    /// use sandbox_sdk::Command;
    /// let out = sandbox
    ///     .exec_lines(&Command::shell("make test"), |line| println!("{line}"))
    ///     .await?;
    /// println!("make: {}", out.exit);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn exec_lines(&self, cmd: &Command, mut on_line: impl FnMut(Line)) -> Result<Output> {
        let mut process = self.spawn(cmd).await?;
        drop(process.stdin());
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let (mut out_lines, mut err_lines) = (Splitter::default(), Splitter::default());
        let exit = loop {
            match process.next_event().await {
                Ok(Some(Event::Stdout(b))) => {
                    stdout.extend_from_slice(&b);
                    out_lines.push(&b, |l| on_line(Line::Stdout(l)));
                }
                Ok(Some(Event::Stderr(b))) => {
                    stderr.extend_from_slice(&b);
                    err_lines.push(&b, |l| on_line(Line::Stderr(l)));
                }
                Ok(Some(Event::Exit(exit))) => break exit,
                Ok(None) => unreachable!("`Exit` ends the loop before events run out"),
                Err(Error::Timeout { .. }) => {
                    // The guest's timer killed it with SIGKILL; keep what it wrote.
                    return Err(Error::Timeout {
                        partial: Some(Box::new(Output {
                            exit: ExitStatus::Signal(Signal::Kill.number()),
                            stdout,
                            stderr,
                        })),
                    });
                }
                Err(e) => return Err(e),
            }
        };
        if let Some(l) = out_lines.finish() {
            on_line(Line::Stdout(l));
        }
        if let Some(l) = err_lines.finish() {
            on_line(Line::Stderr(l));
        }
        Ok(Output {
            exit,
            stdout,
            stderr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut s = Splitter::default();
        let mut lines = Vec::new();
        for c in chunks {
            s.push(c, |l| lines.push(l));
        }
        lines.extend(s.finish());
        lines
    }

    #[test]
    fn lines_span_chunks_and_follow_the_text_rule() {
        assert_eq!(
            split(&[b"a\nb", b"c\r\n", b"\n", b"tail"]),
            ["a", "bc", "", "tail"]
        );
        assert_eq!(split(&[b"x\n"]), ["x"]);
        assert_eq!(split(&[]), Vec::<String>::new());
        // A multi-byte character cut between chunks is whole again; a bad byte is U+FFFD.
        let e = "é".as_bytes();
        assert_eq!(split(&[&e[..1], &e[1..], b"\xff\n"]), ["é\u{fffd}"]);
    }
}
