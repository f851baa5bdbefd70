//! [`Client`]: one node's URL, a caller token and a pooled connection; claims sandboxes and
//! answers the node-wide routes. Per-sandbox calls live on [`Sandbox`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::{Method, StatusCode};

use crate::error::{Error, Result};
use crate::sandbox::Sandbox;
use crate::transport::{Answer, Endpoint, Http};

/// The URL [`Client::from_env`] uses when `SANDBOXD_URL` is unset.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7777";

/// How many times [`Sandbox::exec`] retries a 503 by default.
pub const DEFAULT_BUSY_RETRIES: u32 = 5;

/// A client for one sandboxd node. Cheap to clone: clones share one connection pool.
///
/// The token (root or tenant) authorizes claims, listing and node info. Each claimed
/// [`Sandbox`] carries its own token for its own calls.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    url: String,
    http: Http,
    token: Option<String>,
    busy_retries: u32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("Client")
            .field("url", &self.inner.url)
            .field("token", &self.inner.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// What to claim. Every field is optional; the node's defaults fill the rest.
///
/// ```
/// use std::time::Duration;
/// use sandbox_sdk::ClaimOptions;
///
/// let opts = ClaimOptions::new().template("base").size("small").ttl(Duration::from_secs(600));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimOptions {
    pub(crate) body: api::ClaimRequest,
}

impl ClaimOptions {
    /// The node's default template, size and lifetime.
    pub fn new() -> ClaimOptions {
        ClaimOptions::default()
    }

    /// Template name (one of the node's configured templates).
    pub fn template(mut self, name: impl Into<String>) -> ClaimOptions {
        self.body.template = Some(name.into());
        self
    }

    /// Size name (one of the node's configured sizes).
    pub fn size(mut self, name: impl Into<String>) -> ClaimOptions {
        self.body.size = Some(name.into());
        self
    }

    /// Lifetime, rounded up to whole seconds; the node clamps it to its maximum.
    pub fn ttl(mut self, ttl: Duration) -> ClaimOptions {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        self.body.ttl_seconds = Some(secs);
        self
    }
}

impl Client {
    /// A client for the node at `url`: `http://host:port`, `host:port`, or `unix:/path`
    /// for a Unix socket. No connection is made until the first call.
    pub fn new(url: &str) -> Result<Client> {
        let endpoint = Endpoint::parse(url)?;
        Ok(Client {
            inner: Arc::new(Inner {
                url: url.to_string(),
                http: Http::new(endpoint),
                token: None,
                busy_retries: DEFAULT_BUSY_RETRIES,
            }),
        })
    }

    /// A client from `SANDBOXD_URL` ([`DEFAULT_URL`] when unset or empty) and
    /// `SANDBOXD_TOKEN` (none when unset or empty).
    pub fn from_env() -> Result<Client> {
        let url = std::env::var("SANDBOXD_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_URL.to_string());
        let client = Client::new(&url)?;
        Ok(match std::env::var("SANDBOXD_TOKEN") {
            Ok(token) if !token.is_empty() => client.with_token(token),
            _ => client,
        })
    }

    /// The same client authenticating with `token` (root or tenant).
    pub fn with_token(self, token: impl Into<String>) -> Client {
        self.map(|inner| inner.token = Some(token.into()))
    }

    /// The same client retrying a busy (503) buffered exec at most `retries` times,
    /// waiting as `Retry-After` says (default [`DEFAULT_BUSY_RETRIES`]; 0 never retries).
    pub fn with_busy_retries(self, retries: u32) -> Client {
        self.map(|inner| inner.busy_retries = retries)
    }

    fn map(self, f: impl FnOnce(&mut Inner)) -> Client {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        f(&mut inner);
        Client {
            inner: Arc::new(inner),
        }
    }

    /// The URL this client was made with.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Claims a sandbox. Fails with [`Error::LimitReached`](crate::Error::LimitReached) at the node's or tenant's
    /// `max_claims`, [`Error::BadRequest`](crate::Error::BadRequest) for an unknown template or size.
    pub async fn claim(&self, opts: ClaimOptions) -> Result<Sandbox> {
        let body = serde_json::to_vec(&opts.body).expect("a claim body always serializes");
        let claimed: api::ClaimResponse = self
            .call(Method::POST, "/v1/claim", self.token(), Some(body))
            .await?
            .json(StatusCode::OK)?;
        Ok(Sandbox::claimed(
            self.inner.http.clone(),
            self.inner.busy_retries,
            claimed,
        ))
    }

    /// Claims a sandbox, runs `f` with it, and releases it however `f` ends: `Ok`, an early
    /// `?` error (returned as is), or a panic (released from a task, then the panic goes
    /// on). The release is waited for; its own failure is returned only when `f`
    /// succeeded. `f`'s error type is the caller's, as long as the SDK's converts into it.
    ///
    /// ```no_run
    /// # async fn run(client: sandbox_sdk::Client) -> Result<(), sandbox_sdk::Error> {
    /// use sandbox_sdk::{ClaimOptions, Command};
    /// let text = client
    ///     .with_sandbox(ClaimOptions::new(), |sb| async move {
    ///         let out = sb.exec(&Command::shell("uname -r")).await?.check()?;
    ///         Ok::<_, sandbox_sdk::Error>(out.stdout_text().into_owned())
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn with_sandbox<T, E, F, Fut>(&self, opts: ClaimOptions, f: F) -> Result<T, E>
    where
        F: FnOnce(Sandbox) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        // The guard covers a panic in `f`; on every other way out it is released here.
        let guard = self.claim(opts).await?.release_on_drop();
        let outcome = f(Sandbox::clone(&guard)).await;
        let released = guard.release().await;
        let value = outcome?;
        released?;
        Ok(value)
    }

    /// A handle on an existing sandbox, authenticating with this client's token (root
    /// may act on any sandbox). Makes no call.
    pub fn sandbox(&self, id: impl Into<String>) -> Sandbox {
        self.attach(id.into(), self.inner.token.clone())
    }

    /// A handle on an existing sandbox with its own token. Makes no call.
    pub fn sandbox_with_token(&self, id: impl Into<String>, token: impl Into<String>) -> Sandbox {
        self.attach(id.into(), Some(token.into()))
    }

    fn attach(&self, id: String, token: Option<String>) -> Sandbox {
        let inner = &self.inner;
        Sandbox::attached(inner.http.clone(), inner.busy_retries, id, token)
    }

    /// The caller's sandboxes (root sees all, a tenant its own). Never tokens.
    pub async fn list(&self) -> Result<Vec<api::SandboxSummary>> {
        let list: api::SandboxList = self
            .call(Method::GET, "/v1/sandboxes", self.token(), None)
            .await?
            .json(StatusCode::OK)?;
        Ok(list.sandboxes)
    }

    /// One sandbox by id (root only).
    pub async fn sandbox_info(&self, id: &str) -> Result<api::SandboxSummary> {
        self.call(
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            self.token(),
            None,
        )
        .await?
        .json(StatusCode::OK)
    }

    /// The node: pools and goldens, claims, limits, engine, version (root only).
    pub async fn info(&self) -> Result<api::InfoResponse> {
        self.call(Method::GET, "/v1/info", self.token(), None)
            .await?
            .json(StatusCode::OK)
    }

    /// `Ok` when the node is serving (`GET /healthz`, no token needed).
    pub async fn health(&self) -> Result<()> {
        self.call(Method::GET, "/healthz", None, None)
            .await?
            .expect(StatusCode::OK)
    }

    pub(crate) fn token(&self) -> Option<&str> {
        self.inner.token.as_deref()
    }

    /// One HTTP call to the node.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        json: Option<Vec<u8>>,
    ) -> Result<Answer> {
        self.inner.http.send(method, path, token, json).await
    }
}
