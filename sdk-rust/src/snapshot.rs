//! Snapshots, forks, hibernate and wake: [`Sandbox::snapshot`], [`Sandbox::hibernate`],
//! [`Sandbox::wake`], [`ClaimOptions::from_snapshot`] (a fork is a claim), and the
//! tenant's list and delete on [`Client`].

use std::time::Duration;

use hyper::{Method, StatusCode};

use crate::client::{ClaimOptions, Client};
use crate::error::Result;
use crate::sandbox::Sandbox;

pub use api::snapshots::{SnapshotInfo, SnapshotResponse as Snapshot};

/// What [`Sandbox::snapshot`] sends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotOptions {
    body: api::snapshots::SnapshotRequest,
}

impl SnapshotOptions {
    /// No name; the node's default lifetime.
    pub fn new() -> SnapshotOptions {
        SnapshotOptions::default()
    }

    /// A label (1–64 of `A-Z a-z 0-9 . _ -`).
    pub fn name(mut self, name: impl Into<String>) -> SnapshotOptions {
        self.body.name = Some(name.into());
        self
    }

    /// Lifetime, rounded up to whole seconds; the node clamps it to its maximum.
    pub fn ttl(mut self, ttl: Duration) -> SnapshotOptions {
        self.body.ttl_seconds = Some(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0));
        self
    }
}

impl ClaimOptions {
    /// A fork of snapshot `id`: a new sandbox restored from it (template and size are
    /// the snapshot's).
    pub fn from_snapshot(id: impl Into<String>) -> ClaimOptions {
        let mut opts = ClaimOptions::new();
        opts.body.snapshot = Some(id.into());
        opts
    }
}

impl Sandbox {
    /// Snapshots the running sandbox (it runs on): memory, devices and writable layer
    /// for a VM; the writable layer only (`memory: false`) on the process engine. Over
    /// the tenant's quota: [`Error::LimitReached`](crate::Error::LimitReached); no disk
    /// room: [`Error::NoSpace`](crate::Error::NoSpace).
    pub async fn snapshot(&self, opts: SnapshotOptions) -> Result<Snapshot> {
        let body = serde_json::to_vec(&opts.body).expect("a snapshot body always serializes");
        self.call(Method::POST, "snapshot", Some(body))
            .await?
            .json(StatusCode::OK)
    }

    /// Writes the sandbox out and frees its memory; its id and token stay valid, and the
    /// next exec, file, relay or port call wakes it. The process engine refuses (409,
    /// [`Error::Unexpected`](crate::Error::Unexpected)).
    pub async fn hibernate(&self) -> Result<()> {
        self.call(Method::POST, "hibernate", None)
            .await?
            .expect(StatusCode::NO_CONTENT)
    }

    /// Wakes a hibernated sandbox now (any call would); an awake one is left as it is.
    pub async fn wake(&self) -> Result<()> {
        self.call(Method::POST, "wake", None)
            .await?
            .expect(StatusCode::NO_CONTENT)
    }
}

impl Client {
    /// The caller's snapshots (root: all), oldest first.
    pub async fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        let list: api::snapshots::SnapshotList = self
            .call(Method::GET, "/v1/snapshots", self.token(), None)
            .await?
            .json(StatusCode::OK)?;
        Ok(list.snapshots)
    }

    /// Deletes one of the caller's snapshots (forks running from it go on).
    pub async fn delete_snapshot(&self, id: &str) -> Result<()> {
        if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') || id.is_empty() {
            // Never a path of its own: anything else is no snapshot of ours.
            return Err(crate::Error::NotFound {
                what: format!("snapshot {id} not found"),
            });
        }
        self.call(
            Method::DELETE,
            &format!("/v1/snapshots/{id}"),
            self.token(),
            None,
        )
        .await?
        .expect(StatusCode::NO_CONTENT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_carry_only_what_was_set() {
        let body = serde_json::to_value(&ClaimOptions::from_snapshot("snap-1").body).unwrap();
        assert_eq!(body, serde_json::json!({ "snapshot": "snap-1" }));
        let opts = SnapshotOptions::new()
            .name("n")
            .ttl(Duration::from_millis(1500));
        let body = serde_json::to_value(&opts.body).unwrap();
        assert_eq!(body, serde_json::json!({ "name": "n", "ttl_seconds": 2 }));
    }
}
