//! The subcommands that manage sandboxes rather than run commands in them: claim, renew,
//! ls, info (release is one SDK call, made in `main`). One call each, printed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox_sdk::{ClaimOptions, Client, Error};

use crate::cli::{claim_options, ClaimArgs};
use crate::progress::with_progress;

/// `sbx claim`: prints the id, token and deadline (or the claim answer as JSON).
pub async fn claim_cmd(client: &Client, args: ClaimArgs, json: bool) -> Result<(), Error> {
    claim_with(client, "claiming a sandbox", claim_options(args), json).await
}

/// Claims with `opts` (a fresh sandbox or a fork) and prints it as `sbx claim` does.
pub async fn claim_with(
    client: &Client,
    what: &str,
    opts: ClaimOptions,
    json: bool,
) -> Result<(), Error> {
    let sandbox = with_progress(what, client.claim(opts)).await?;
    let token = sandbox.token().unwrap_or_default();
    let deadline = sandbox.deadline_unix().unwrap_or_default();
    if json {
        let answer = api::ClaimResponse {
            id: sandbox.id().to_string(),
            token: token.to_string(),
            deadline,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&answer).expect("serializes")
        );
    } else {
        println!("id       {}", sandbox.id());
        println!("token    {token}");
        println!("deadline {deadline} ({})", sandbox.deadline_display());
    }
    Ok(())
}

/// `sbx renew ID --ttl SECS`: prints the new deadline.
pub async fn renew_cmd(client: &Client, id: String, ttl: u64) -> Result<(), Error> {
    let sandbox = client.sandbox(id);
    sandbox.renew(Duration::from_secs(ttl)).await?;
    let deadline = sandbox.deadline_unix().unwrap_or_default();
    println!("deadline {deadline} ({})", sandbox.deadline_display());
    Ok(())
}

/// `sbx ls`: the caller's sandboxes, as a table or JSON.
pub async fn ls_cmd(client: &Client, json: bool) -> Result<(), Error> {
    let sandboxes = client.list().await?;
    if json {
        let list = api::SandboxList { sandboxes };
        println!(
            "{}",
            serde_json::to_string_pretty(&list).expect("serializes")
        );
        return Ok(());
    }
    println!(
        "{:<20} {:<12} {:<8} {:<7} {:>9}  TENANT",
        "ID", "TEMPLATE", "SIZE", "STATE", "EXPIRES"
    );
    for s in sandboxes {
        let state = match s.state {
            sandbox_sdk::SandboxState::Ready => "ready",
            sandbox_sdk::SandboxState::Failed => "failed",
            sandbox_sdk::SandboxState::Hibernated => "hibernated",
        };
        println!(
            "{:<20} {:<12} {:<8} {:<7} {:>8}s  {}",
            s.id,
            s.template,
            s.size,
            state,
            seconds_until(s.deadline),
            s.tenant.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

/// `sbx info [ID]`: the node, or one sandbox, as JSON.
pub async fn info_cmd(client: &Client, id: Option<String>) -> Result<(), Error> {
    let text = match id {
        Some(id) => serde_json::to_string_pretty(&client.sandbox_info(&id).await?),
        None => serde_json::to_string_pretty(&client.info().await?),
    };
    println!("{}", text.expect("serializes"));
    Ok(())
}

fn seconds_until(deadline: u64) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    deadline as i64 - now as i64
}
