//! [`Sandbox`]: one claimed sandbox and the calls made with its token: buffered exec, wire
//! RPCs over the relay (kill, ps), renew and release. [`Sandbox::spawn`] is defined in
//! `process.rs`, beside the [`Process`](crate::Process) it returns, so that this module
//! does not depend on it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hyper::{Method, StatusCode};
use wire::{Request, Response};

use crate::command::{Command, ExitStatus, Output};
use crate::error::{Error, Result};
use crate::relay::{self, Relay};
use crate::transport::{Answer, Http};

/// Largest request body sandboxd accepts (docs/api.md).
const MAX_REQUEST_BODY: usize = 1024 * 1024;

/// One sandbox: its id, the token that acts on it, and its deadline when known.
///
/// Dropping a `Sandbox` does not release it (the node does at its deadline): call
/// [`release`](Sandbox::release) when done.
#[derive(Clone)]
pub struct Sandbox {
    /// The node's connection pool, shared with the [`Client`](crate::Client) it came from.
    http: Http,
    /// How many times a busy (503) buffered exec is retried.
    busy_retries: u32,
    id: String,
    token: Option<String>,
    deadline: Option<u64>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .field("deadline", &self.deadline)
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
            deadline: Some(claim.deadline),
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
            deadline: None,
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
        self.deadline.map(|s| UNIX_EPOCH + Duration::from_secs(s))
    }

    /// The deadline as Unix seconds, as the API carries it.
    pub fn deadline_unix(&self) -> Option<u64> {
        self.deadline
    }

    /// Moves the deadline to `ttl` from now (rounded up to whole seconds, clamped by the
    /// node); returns the granted deadline.
    pub async fn renew(&mut self, ttl: Duration) -> Result<SystemTime> {
        let ttl_seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let body = serde_json::to_vec(&api::RenewRequest { ttl_seconds })
            .expect("a renew body always serializes");
        let renewed: api::RenewResponse = self
            .call(Method::POST, "renew", Some(body))
            .await?
            .json(StatusCode::OK)?;
        self.deadline = Some(renewed.deadline);
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
            Err(Error::NotFound) => Ok(()),
            other => other,
        }
    }

    /// Runs a command to completion and returns its exit status and exact output.
    ///
    /// Output over the node's cap fails with [`Error::OutputTooLarge`], a timeout with
    /// [`Error::Timeout`]; in both cases the command was killed. A busy node (503) is
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
    /// `None`). A command that already ended, or that the guest forgot, is not an error.
    pub async fn kill(&self, pid: u32, signal: Option<i32>) -> Result<()> {
        match self.rpc(Request::Kill { pid, signal }).await {
            Ok(Response::Done) | Err(Error::NotFound) => Ok(()),
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

    async fn call(&self, method: Method, verb: &str, json: Option<Vec<u8>>) -> Result<Answer> {
        self.http
            .send(method, &self.path(verb), self.token(), json)
            .await
    }
}

/// Turns the exec answer into exact bytes, whichever of the plain or `_b64` fields came.
fn decode_output(answer: api::ExecResponse) -> Result<Output> {
    let exit = ExitStatus::from_parts(answer.exit_code, answer.signal)
        .ok_or_else(|| Error::Protocol("exec answer has neither exit_code nor signal".into()))?;
    Ok(Output {
        exit,
        stdout: stream_bytes("stdout", answer.stdout, answer.stdout_b64)?,
        stderr: stream_bytes("stderr", answer.stderr, answer.stderr_b64)?,
    })
}

fn stream_bytes(name: &str, text: Option<String>, b64: Option<String>) -> Result<Vec<u8>> {
    match (text, b64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| Error::Protocol(format!("{name}_b64 is not base64: {e}"))),
        (None, None) => Ok(Vec::new()),
        (Some(_), Some(_)) => Err(Error::Protocol(format!(
            "exec answer has both {name} and {name}_b64"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(json: &str) -> Result<Output> {
        decode_output(serde_json::from_str(json).unwrap())
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
