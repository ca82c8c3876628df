//! The commands about who may reach a running hub, through its operator
//! API: the deny list of topic and callback patterns (`websub denials`),
//! the admin page's sessions (`websub admin-sessions`), and the signed links
//! into a subscriber's portal pages (`websub portal-link`). Denying one
//! subscription is `websub subscriptions deny`, with the others that act
//! on a subscription.

use clap::Subcommand;
use serde_json::json;

use crate::client::{Failure, Hub, HubArgs, cell, elements};
use crate::table::Table;

/// `websub denials …`.
#[derive(Debug, Subcommand)]
pub(crate) enum DenialsCommand {
    /// List every pattern, oldest first.
    List {
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Deny subscribe requests whose topic (--topic) or callback
    /// (--callback) matches PATTERN: a whole URL, * matching any run of
    /// characters.
    Add {
        /// The pattern.
        pattern: String,
        /// Match it against the topic.
        #[arg(
            long,
            conflicts_with = "callback",
            required_unless_present = "callback"
        )]
        topic: bool,
        /// Match it against the callback.
        #[arg(long)]
        callback: bool,
        /// Sent to each denied callback as hub.reason.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Remove a pattern, by its id as listed.
    Remove {
        /// The pattern's id.
        #[arg(value_parser = parse_hex_id)]
        id: String,
        #[command(flatten)]
        hub: HubArgs,
    },
}

/// `websub admin-sessions …`.
#[derive(Debug, Subcommand)]
pub(crate) enum AdminSessionsCommand {
    /// List the sessions that have not ended, newest first.
    List {
        #[command(flatten)]
        hub: HubArgs,
    },
    /// End one session (by its id, as listed), or every one with --all;
    /// their browsers must log in again.
    End {
        /// The session's id.
        #[arg(required_unless_present = "all", conflicts_with = "all", value_parser = parse_hex_id)]
        id: Option<String>,
        /// End every session.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        hub: HubArgs,
    },
}

/// An id the hub hands out for an admin session or a denial: hexadecimal,
/// so that it cannot change the path it is put in.
fn parse_hex_id(value: &str) -> Result<String, String> {
    if !value.is_empty() && value.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not an id (hexadecimal, as the list command shows)"
        ))
    }
}

/// Runs `websub denials …`.
pub(crate) async fn denials(command: DenialsCommand) -> Result<(), Failure> {
    match command {
        DenialsCommand::List { hub } => list_denials(&hub.connect()?).await,
        DenialsCommand::Add {
            pattern,
            topic,
            reason,
            hub,
            ..
        } => {
            let field = if topic { "topic" } else { "callback" };
            add_denial(&hub.connect()?, field, &pattern, &reason).await
        }
        DenialsCommand::Remove { id, hub } => remove_denial(&hub.connect()?, &id).await,
    }
}

/// Runs `websub admin-sessions …`.
pub(crate) async fn admin_sessions(command: AdminSessionsCommand) -> Result<(), Failure> {
    match command {
        AdminSessionsCommand::List { hub } => list_admin_sessions(&hub.connect()?).await,
        AdminSessionsCommand::End { id, hub, .. } => {
            end_admin_sessions(&hub.connect()?, id.as_deref()).await
        }
    }
}

pub(crate) async fn portal_link(hub: &Hub, subscriber: &str, ttl: u64) -> Result<(), Failure> {
    let body = json!({ "subscriber": subscriber, "ttl_seconds": ttl });
    let answer = hub.post("portal-links", &body).await?;
    hub.print(&answer, |answer| {
        format!(
            "{}\n(for {subscriber}, until {})\n",
            cell(&answer["url"]),
            cell(&answer["expires_at"])
        )
    });
    Ok(())
}

/// A link's lifetime, a duration like 1h, in seconds.
pub(crate) fn parse_ttl(value: &str) -> Result<u64, String> {
    websub_hub::config::parse_duration("ttl", value)
        .map(|ttl| ttl.as_secs())
        .map_err(|error| error.to_string())
}

async fn list_denials(hub: &Hub) -> Result<(), Failure> {
    let answer = hub.get("denials", &[]).await?;
    hub.print(&answer, |answer| {
        let mut table = Table::new(["ID", "FIELD", "PATTERN", "REASON", "ADDED"]);
        for denial in elements(answer) {
            table.row([
                cell(&denial["id"]),
                cell(&denial["field"]),
                cell(&denial["pattern"]),
                cell(&denial["reason"]),
                cell(&denial["created_at"]),
            ]);
        }
        if table.is_empty() {
            "the deny list is empty\n".to_owned()
        } else {
            table.to_string()
        }
    });
    Ok(())
}

async fn add_denial(hub: &Hub, field: &str, pattern: &str, reason: &str) -> Result<(), Failure> {
    let body = json!({ "field": field, "pattern": pattern, "reason": reason });
    let answer = hub.post("denials", &body).await?;
    hub.print(&answer, |answer| {
        format!(
            "denying subscriptions whose {field} matches {pattern} (id {})\n",
            cell(&answer["id"])
        )
    });
    Ok(())
}

async fn remove_denial(hub: &Hub, id: &str) -> Result<(), Failure> {
    hub.delete(&format!("denials/{id}"), &[]).await?;
    let removed = json!({ "id": id, "removed": true });
    hub.print(&removed, |_| format!("removed the denial {id}\n"));
    Ok(())
}

async fn list_admin_sessions(hub: &Hub) -> Result<(), Failure> {
    let answer = hub.get("admin-sessions", &[]).await?;
    hub.print(&answer, |answer| {
        let mut table = Table::new(["ID", "KEY", "OPENED", "EXPIRES", "USER AGENT"]);
        for session in elements(answer) {
            table.row([
                cell(&session["id"]),
                cell(&session["key_id"]),
                cell(&session["created_at"]),
                cell(&session["expires_at"]),
                cell(&session["user_agent"]),
            ]);
        }
        if table.is_empty() {
            "no admin session is open\n".to_owned()
        } else {
            table.to_string()
        }
    });
    Ok(())
}

/// Ends the session `id`, or every one without it.
async fn end_admin_sessions(hub: &Hub, id: Option<&str>) -> Result<(), Failure> {
    match id {
        Some(id) => {
            hub.delete(&format!("admin-sessions/{id}"), &[]).await?;
            let ended = json!({ "id": id, "ended": true });
            hub.print(&ended, |_| format!("ended the admin session {id}\n"));
        }
        None => {
            let answer = hub.delete("admin-sessions", &[]).await?;
            hub.print(&answer, |answer| {
                format!("ended {} admin sessions\n", cell(&answer["ended"]))
            });
        }
    }
    Ok(())
}
