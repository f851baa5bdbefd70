//! [`Sandbox`]: one claimed sandbox and the calls made with its token: buffered exec, wire
//! RPCs over the relay (kill, ps), renew and release, and [`ReleaseOnDrop`].
//! [`Sandbox::spawn`] is defined in `process.rs`, beside the [`Process`](crate::Process)
//! it returns, so that this module does not depend on it.

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::{Method, StatusCode};
use wire::{Request, Response};

use crate::command::Command;
use crate::error::{Error, Result};
use crate::outcome::Output;
use crate::relay::{self, Relay};
use crate::transport::{Answer, Http};

/// Largest request body sandboxd accepts (docs/api.md).
const MAX_REQUEST_BODY: usize = 1024 * 1024;

/// One sandbox: its id, the token that acts on it, and its deadline when known.
///
/// Dropping a `Sandbox` does not release it (the node does at its deadline): call
/// [`release`](Sandbox::release) when done, claim it with
/// [`Client::with_sandbox`](crate::Client::with_sandbox) (released however the closure
/// ends), or hold it through [`release_on_drop`](Sandbox::release_on_drop).
///
/// Clones are handles on the same sandbox and share what is known of its deadline.
#[derive(Clone)]
pub struct Sandbox {
    /// The node's connection pool, shared with the [`Client`](crate::Client) it came from.
    http: Http,
    /// How many times a busy (503) buffered exec is retried.
    busy_retries: u32,
    id: String,
    token: Option<String>,
    /// Unix seconds; 0 while unknown. Shared by clones, so a renew through one is seen by
    /// all (and `renew` needs only `&self`).
    deadline: Arc<AtomicU64>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .field("deadline", &self.deadline_unix())
            .finish()
    }
}

impl Sandbox {
    pub(crate) fn claimed(http: Http, busy_retries: u32, claim: api::ClaimResponse) -> Sandbox {
        Sandbox {
            http,
            busy_retries,
            id: claim.id,
            token: Some(claim.token),
            deadline: Arc::new(AtomicU64::new(claim.deadline)),
        }
    }

    pub(crate) fn attached(
        http: Http,
        busy_retries: u32,
        id: String,
        token: Option<String>,
    ) -> Sandbox {
        Sandbox {
            http,
            busy_retries,
            id,
            token,
            deadline: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The sandbox id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The token this handle acts with: the sandbox's own for a claimed sandbox.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// When the node will destroy the sandbox unless renewed; unknown for a handle made by
    /// [`Client::sandbox`](crate::Client::sandbox) until [`renew`](Sandbox::renew) is called.
    pub fn deadline(&self) -> Option<SystemTime> {
        self.deadline_unix()
            .map(|s| UNIX_EPOCH + Duration::from_secs(s))
    }

    /// The deadline as Unix seconds, as the API carries it.
    pub fn deadline_unix(&self) -> Option<u64> {
        Some(self.deadline.load(Ordering::Acquire)).filter(|s| *s != 0)
    }

    /// The deadline for people: `in 9m 58s` (or `passed 3s ago`, `unknown`).
    pub fn deadline_display(&self) -> DeadlineDisplay {
        DeadlineDisplay(self.deadline())
    }

    /// Moves the deadline to `ttl` from now (rounded up to whole seconds, clamped by the
    /// node); returns the granted deadline. Works on a shared handle: every clone sees it.
    pub async fn renew(&self, ttl: Duration) -> Result<SystemTime> {
        let ttl_seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let body = serde_json::to_vec(&api::RenewRequest { ttl_seconds })
            .expect("a renew body always serializes");
        let renewed: api::RenewResponse = self
            .call(Method::POST, "renew", Some(body))
            .await?
            .json(StatusCode::OK)?;
        self.deadline.store(renewed.deadline, Ordering::Release);
        Ok(UNIX_EPOCH + Duration::from_secs(renewed.deadline))
    }

    /// Gives the sandbox back; everything running in it is killed. Releasing a sandbox
    /// that is already gone (released, expired) succeeds.
    pub async fn release(&self) -> Result<()> {
        match self
            .call(Method::POST, "release", None)
            .await?
            .expect(StatusCode::NO_CONTENT)
        {
            Err(Error::NotFound { .. }) => Ok(()),
            other => other,
        }
    }

    /// This handle, released when the returned guard is dropped (on an early `?` return
    /// or a panic too), in a task on the current tokio runtime: best effort, as a drop
    /// cannot wait (a runtime shutting down may not run it). Prefer
    /// [`ReleaseOnDrop::release`], or [`Client::with_sandbox`](crate::Client::with_sandbox),
    /// which wait for the release and report its error.
    pub fn release_on_drop(self) -> ReleaseOnDrop {
        ReleaseOnDrop(Some(self))
    }

    /// Runs a command to completion and returns its exit status and exact output. A
    /// non-zero exit is `Ok` (see [`Output::check`]).
    ///
    /// Output over the node's cap fails with [`Error::OutputTooLarge`], a timeout with
    /// [`Error::Timeout`]; in both cases the command was killed, and the error carries what
    /// it wrote until then ([`Error::partial_output`]). A busy node (503) is
    /// retried as [`Client::with_busy_retries`](crate::Client::with_busy_retries) says, then fails with [`Error::Busy`].
    pub async fn exec(&self, cmd: &Command) -> Result<Output> {
        if cmd.is_detached() {
            return Err(Error::BadRequest(
                "buffered exec waits for the end; use Sandbox::spawn for a detached command".into(),
            ));
        }
        if cmd.has_pty() {
            return Err(Error::BadRequest(
                "buffered exec has no terminal; use Sandbox::spawn for a Command::pty".into(),
            ));
        }
        if cmd.reads_stdin() {
            return Err(Error::BadRequest(
                "buffered exec has no stdin; use Sandbox::spawn for a command that reads it".into(),
            ));
        }
        let body = serde_json::to_vec(&cmd.exec_request()).expect("an exec body always serializes");
        // sandboxd answers an oversized body with the same 413 as an output over the cap;
        // refusing it here keeps `OutputTooLarge` meaning only the latter.
        if body.len() > MAX_REQUEST_BODY {
            return Err(Error::BadRequest(format!(
                "the exec request is {} bytes; sandboxd accepts at most {MAX_REQUEST_BODY}",
                body.len()
            )));
        }
        let answer: api::ExecResponse = self
            .http
            .send_retrying_busy(
                Method::POST,
                &self.path("exec"),
                self.token(),
                body,
                self.busy_retries,
            )
            .await?
            .json(StatusCode::OK)?;
        decode_output(answer)
    }

    /// The guest's commands, running and recently exited (a wire `Ps`).
    pub async fn processes(&self) -> Result<Vec<wire::ProcInfo>> {
        match self.rpc(Request::Ps).await? {
            Response::Procs { procs } => Ok(procs),
            other => Err(Error::Protocol(format!("expected procs, got {other:?}"))),
        }
    }

    /// Signals the process group of the command with this `pid` (SIGKILL when `signal` is
    /// `None`; a number or a [`Signal`](crate::Signal): `Some(Signal::Term.into())`). A
    /// command that already ended, or that the guest forgot, is not an error.
    pub async fn kill(&self, pid: u32, signal: Option<i32>) -> Result<()> {
        match self.rpc(Request::Kill { pid, signal }).await {
            Ok(Response::Done) | Err(Error::NotFound { .. }) => Ok(()),
            Ok(other) => Err(Error::Protocol(format!("expected done, got {other:?}"))),
            Err(e) => Err(e),
        }
    }

    /// One request on a fresh relay connection and its single answer.
    async fn rpc(&self, req: Request) -> Result<Response> {
        relay::rpc(&self.http, &self.path("agent"), self.token(), req).await
    }

    /// A fresh relay connection to the sandbox's guest agent.
    pub(crate) async fn relay(&self) -> Result<Relay> {
        relay::connect(&self.http, &self.path("agent"), self.token()).await
    }

    /// The node's connection pool.
    pub(crate) fn http(&self) -> &Http {
        &self.http
    }

    pub(crate) fn path(&self, verb: &str) -> String {
        format!("/v1/sandboxes/{}/{verb}", self.id)
    }

    pub(crate) async fn call(
        &self,
        method: Method,
        verb: &str,
        json: Option<Vec<u8>>,
    ) -> Result<Answer> {
        self.http
            .send(method, &self.path(verb), self.token(), json)
            .await
    }
}

/// Turns the exec answer into exact bytes, whichever of the plain or `_b64` fields came.
fn decode_output(answer: api::ExecResponse) -> Result<Output> {
    Output::from_answer(answer).map_err(Error::Protocol)
}

/// A [`Sandbox`] that is released when dropped; from [`Sandbox::release_on_drop`]. Derefs
/// to the sandbox.
#[derive(Debug)]
pub struct ReleaseOnDrop(Option<Sandbox>);

impl ReleaseOnDrop {
    /// Releases now and waits for the answer (nothing is left for the drop to do).
    pub async fn release(mut self) -> Result<()> {
        let sandbox = self.0.take().expect("held until release or drop");
        sandbox.release().await
    }

    /// Gives the sandbox back to the caller without releasing it.
    pub fn keep(mut self) -> Sandbox {
        self.0.take().expect("held until release or drop")
    }
}

impl Deref for ReleaseOnDrop {
    type Target = Sandbox;

    fn deref(&self) -> &Sandbox {
        self.0.as_ref().expect("held until release or drop")
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let Some(sandbox) = self.0.take() else {
            return;
        };
        // Outside a runtime nothing can be spawned; the node's deadline still ends it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = sandbox.release().await;
            });
        }
    }
}

/// How [`Sandbox::deadline_display`] shows a deadline: `in 9m 58s`, `passed 3s ago`, or
/// `unknown` (a handle from [`Client::sandbox`](crate::Client::sandbox) before a renew).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineDisplay(Option<SystemTime>);

impl fmt::Display for DeadlineDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(at) = self.0 else {
            return f.write_str("unknown");
        };
        match at.duration_since(SystemTime::now()) {
            Ok(left) => write!(f, "in {}", Span(left)),
            Err(past) => write!(f, "passed {} ago", Span(past.duration())),
        }
    }
}

/// A duration in whole seconds, as `1h 2m 3s` (largest units first, zeros left out).
struct Span(Duration);

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.as_secs();
        let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
        let mut parts = Vec::new();
        if h > 0 {
            parts.push(format!("{h}h"));
        }
        if m > 0 {
            parts.push(format!("{m}m"));
        }
        if s > 0 || parts.is_empty() {
            parts.push(format!("{s}s"));
        }
        f.write_str(&parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::ExitStatus;

    fn answer(json: &str) -> Result<Output> {
        decode_output(serde_json::from_str(json).unwrap())
    }

    #[test]
    fn deadlines_display_readably() {
        assert_eq!(Span(Duration::from_secs(0)).to_string(), "0s");
        assert_eq!(Span(Duration::from_secs(598)).to_string(), "9m 58s");
        assert_eq!(Span(Duration::from_secs(3600)).to_string(), "1h");
        assert_eq!(Span(Duration::from_secs(3723)).to_string(), "1h 2m 3s");
        assert_eq!(DeadlineDisplay(None).to_string(), "unknown");
        let later = SystemTime::now() + Duration::from_secs(3600);
        assert!(DeadlineDisplay(Some(later))
            .to_string()
            .starts_with("in 59m"));
        let earlier = SystemTime::now() - Duration::from_secs(7);
        assert!(DeadlineDisplay(Some(earlier))
            .to_string()
            .starts_with("passed "));
    }

    #[test]
    fn decodes_text_and_base64_fields() {
        let out = answer(r#"{"exit_code":0,"stdout":"héllo\n","stderr_b64":"/wABgA=="}"#).unwrap();
        assert_eq!(out.exit, ExitStatus::Code(0));
        assert_eq!(out.stdout, "héllo\n".as_bytes());
        assert_eq!(out.stderr, [0xff, 0x00, 0x01, 0x80]);
    }

    #[test]
    fn signal_wins_over_a_missing_code() {
        let out = answer(r#"{"exit_code":null,"signal":9,"stdout":"","stderr":""}"#).unwrap();
        assert_eq!(out.exit, ExitStatus::Signal(9));
    }

    #[test]
    fn refuses_malformed_answers() {
        assert!(matches!(
            answer(r#"{"exit_code":null}"#),
            Err(Error::Protocol(_))
        ));
        assert!(matches!(
            answer(r#"{"exit_code":0,"stdout":"a","stdout_b64":"YQ=="}"#),
            Err(Error::Protocol(_))
        ));
        assert!(matches!(
            answer(r#"{"exit_code":0,"stdout_b64":"not base64!"}"#),
            Err(Error::Protocol(_))
        ));
    }
}
