//! `sbx snapshot take|ls|rm`, `sbx fork`, `sbx hibernate`, `sbx wake`: one SDK call
//! each, printed.

use std::time::Duration;

use clap::Subcommand;
use sandbox_sdk::{ClaimOptions, Client, Error, SnapshotOptions};

use crate::manage::claim_with;
use crate::progress::with_progress;

/// `sbx snapshot ...`.
#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Snapshot a running sandbox (it runs on); print the snapshot's id.
    Take {
        /// Sandbox id.
        id: String,
        /// A label (1-64 of A-Z a-z 0-9 . _ -).
        #[arg(long)]
        name: Option<String>,
        /// Lifetime in seconds (the node's default when absent).
        #[arg(long)]
        ttl: Option<u64>,
    },
    /// List snapshots (root: all; tenant: its own).
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot (forks running from it go on).
    Rm {
        /// Snapshot id.
        id: String,
    },
}

/// Runs one `sbx snapshot` subcommand.
pub async fn snapshot_cmd(client: &Client, cmd: SnapshotCmd) -> Result<(), Error> {
    match cmd {
        SnapshotCmd::Take { id, name, ttl } => {
            let mut opts = SnapshotOptions::new();
            if let Some(n) = name {
                opts = opts.name(n);
            }
            if let Some(t) = ttl {
                opts = opts.ttl(Duration::from_secs(t));
            }
            let sandbox = client.sandbox(id);
            let snap = with_progress("taking a snapshot", sandbox.snapshot(opts)).await?;
            println!("{}", snap.snapshot_id);
            if !snap.memory {
                eprintln!("(the writable layer only: this engine keeps no memory)");
            }
            Ok(())
        }
        SnapshotCmd::Ls { json } => {
            let snapshots = client.snapshots().await?;
            if json {
                let list = api::snapshots::SnapshotList { snapshots };
                println!(
                    "{}",
                    serde_json::to_string_pretty(&list).expect("serializes")
                );
                return Ok(());
            }
            println!(
                "{:<30} {:<16} {:<20} {:<6} {:>8}  EXPIRES",
                "ID", "NAME", "SOURCE", "MEMORY", "MIB"
            );
            for s in snapshots {
                println!(
                    "{:<30} {:<16} {:<20} {:<6} {:>8}  {}",
                    s.id,
                    s.name.as_deref().unwrap_or("-"),
                    s.source,
                    if s.memory { "yes" } else { "no" },
                    s.bytes >> 20,
                    s.expires
                );
            }
            Ok(())
        }
        SnapshotCmd::Rm { id } => client.delete_snapshot(&id).await,
    }
}

/// `sbx fork SNAPSHOT`: claims a fork; prints it like `sbx claim`.
pub async fn fork_cmd(
    client: &Client,
    snapshot: String,
    ttl: Option<u64>,
    json: bool,
) -> Result<(), Error> {
    let mut opts = ClaimOptions::from_snapshot(snapshot);
    if let Some(t) = ttl {
        opts = opts.ttl(Duration::from_secs(t));
    }
    claim_with(client, "forking a snapshot", opts, json).await
}

/// `sbx hibernate ID` and `sbx wake ID`.
pub async fn power_cmd(client: &Client, id: String, hibernate: bool) -> Result<(), Error> {
    let sandbox = client.sandbox(id);
    if hibernate {
        with_progress("hibernating", sandbox.hibernate()).await
    } else {
        with_progress("waking", sandbox.wake()).await
    }
}
