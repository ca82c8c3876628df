//! The commands that change what a running hub delivers: `redeliver` (an
//! event again, to one subscription or all of its topic's), `replay` (a
//! topic's events since a time, to one subscription), `webhook-replay`
//! (an outbox webhook's rows re-opened) and `endpoints`
//! (list the troubled callbacks and webhooks, disable or enable one, read
//! the history of their state changes). Each
//! is one request to the operator API, printed as a table or (`--json`)
//! as the API's answer.

use chrono::{DateTime, Utc};
use clap::Subcommand;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::client::{Failure, Hub, HubArgs, cell, elements};
use crate::table::{Table, fields};

/// A time as the command line gives it: RFC 3339.
pub(crate) fn parse_time(value: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(value.trim())
        .map(|time| time.with_timezone(&Utc))
        .map_err(|error| {
            format!("{value:?} is not an RFC 3339 time such as 2026-12-01T10:00:00Z: {error}")
        })
}

/// Which channel an endpoint is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Channel {
    /// A WebSub subscription's callback URL.
    Websub,
    /// An outbox webhook, by its name.
    Webhook,
    /// The operator webhook, which endpoint changes are sent to (its own
    /// changes are in the history; it cannot be disabled).
    Operator,
}

impl Channel {
    fn label(self) -> &'static str {
        match self {
            Self::Websub => "websub",
            Self::Webhook => "webhook",
            Self::Operator => "operator",
        }
    }
}

/// `websub endpoints …`.
#[derive(Debug, Subcommand)]
pub(crate) enum EndpointsCommand {
    /// List the endpoints that failed since their last delivery or are
    /// disabled, disabled first.
    List {
        /// Only this channel's.
        #[arg(long, value_enum)]
        channel: Option<Channel>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Disable an endpoint: its deliveries are recorded as skipped, and
    /// none is sent, until it is enabled.
    Disable {
        /// The callback URL (or the webhook's name).
        endpoint: String,
        /// Why, shown wherever it is listed.
        #[arg(long)]
        reason: Option<String>,
        #[arg(long, value_enum, default_value = "websub")]
        channel: Channel,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// The history of endpoint state changes (failing, open, recovered,
    /// disabled, enabled), newest first.
    History {
        /// Only this channel's.
        #[arg(long, value_enum)]
        channel: Option<Channel>,
        /// Only this endpoint's: a callback URL, or a webhook's name.
        #[arg(long)]
        endpoint: Option<String>,
        /// At most this many (1 to 1000; 100 by default).
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Enable an endpoint again, its failures cleared.
    Enable {
        /// The callback URL (or the webhook's name).
        endpoint: String,
        /// First ask the callback to confirm its subscription (a
        /// verification GET); stay disabled unless it does.
        #[arg(long)]
        probe: bool,
        #[arg(long, value_enum, default_value = "websub")]
        channel: Channel,
        #[command(flatten)]
        hub: HubArgs,
    },
}

pub(crate) async fn endpoints(command: EndpointsCommand) -> Result<(), Failure> {
    match command {
        EndpointsCommand::List { channel, hub } => {
            let hub = hub.connect()?;
            let query: Vec<(&str, &str)> = channel
                .map(|channel| ("channel", channel.label()))
                .into_iter()
                .collect();
            let answer = hub.get("endpoints", &query).await?;
            hub.print(&answer, endpoints_table);
            Ok(())
        }
        EndpointsCommand::History {
            channel,
            endpoint,
            limit,
            hub,
        } => {
            let hub = hub.connect()?;
            let limit = limit.map(|limit| limit.to_string());
            let mut query: Vec<(&str, &str)> = Vec::new();
            if let Some(channel) = channel {
                query.push(("channel", channel.label()));
            }
            if let Some(endpoint) = &endpoint {
                query.push(("endpoint", endpoint));
            }
            if let Some(limit) = &limit {
                query.push(("limit", limit));
            }
            let answer = hub.get("endpoints/changes", &query).await?;
            hub.print(&answer, history_table);
            Ok(())
        }
        EndpointsCommand::Disable {
            endpoint,
            reason,
            channel,
            hub,
        } => {
            let body = json!({"endpoint": endpoint, "reason": reason, "channel": channel.label()});
            steer(&hub.connect()?, "endpoints/disable", &body, "disabled").await
        }
        EndpointsCommand::Enable {
            endpoint,
            probe,
            channel,
            hub,
        } => {
            let body = json!({"endpoint": endpoint, "probe": probe, "channel": channel.label()});
            steer(&hub.connect()?, "endpoints/enable", &body, "enabled").await
        }
    }
}

fn endpoints_table(answer: &Value) -> String {
    let mut table = Table::new([
        "CHANNEL",
        "ENDPOINT",
        "FAILURES",
        "LAST FAILURE",
        "DISABLED",
        "WHY",
    ]);
    for endpoint in elements(answer) {
        table.row([
            cell(&endpoint["channel"]),
            cell(&endpoint["endpoint"]),
            cell(&endpoint["failures"]),
            cell(&endpoint["last_failure_at"]),
            cell(&endpoint["disabled_at"]),
            match &endpoint["disabled_reason"] {
                Value::Null => cell(&endpoint["last_error"]),
                reason => cell(reason),
            },
        ]);
    }
    if table.is_empty() {
        "every endpoint is healthy\n".to_owned()
    } else {
        table.to_string()
    }
}

fn history_table(answer: &Value) -> String {
    let mut table = Table::new([
        "AT", "CHANNEL", "ENDPOINT", "TO", "FAILURES", "BY", "WHY", "WEBHOOK",
    ]);
    for change in elements(answer) {
        table.row([
            cell(&change["at"]),
            cell(&change["channel"]),
            cell(&change["endpoint"]),
            cell(&change["to"]),
            cell(&change["failures"]),
            cell(&change["source"]),
            cell(&change["reason"]),
            cell(&change["webhook_state"]),
        ]);
    }
    if table.is_empty() {
        "no endpoint has changed state\n".to_owned()
    } else {
        table.to_string()
    }
}

async fn steer(hub: &Hub, path: &str, body: &Value, done: &str) -> Result<(), Failure> {
    let answer = hub.post(path, body).await?;
    hub.print(&answer, |answer| {
        let already = if answer["changed"] == false {
            " (it already was)"
        } else {
            ""
        };
        format!("{done} {}{already}\n", cell(&answer["endpoint"]))
    });
    Ok(())
}

pub(crate) async fn redeliver(
    hub: &Hub,
    event_id: Uuid,
    subscriber: Option<String>,
) -> Result<(), Failure> {
    let answer = hub
        .post(
            "redeliver",
            &json!({"event_id": event_id.to_string(), "subscriber": subscriber}),
        )
        .await?;
    hub.print(&answer, |answer| {
        let mut shown = fields([
            ("redelivery", cell(&answer["redelivery"])),
            ("event", cell(&answer["event_id"])),
        ]);
        for subscriber in elements(&answer["subscribers"]) {
            shown.push_str(&format!("sent again to {}\n", cell(subscriber)));
        }
        for subscriber in elements(&answer["disabled"]) {
            shown.push_str(&format!("left out (disabled) {}\n", cell(subscriber)));
        }
        shown
    });
    Ok(())
}

pub(crate) async fn replay(
    hub: &Hub,
    topic: &str,
    subscriber: &str,
    since: DateTime<Utc>,
    limit: Option<usize>,
) -> Result<(), Failure> {
    let answer = hub
        .post(
            "replay",
            &json!({
                "topic": topic,
                "subscriber": subscriber,
                "since": since.to_rfc3339(),
                "limit": limit,
            }),
        )
        .await?;
    hub.print(&answer, |answer| {
        let mut shown = format!(
            "replaying {} events of {topic} to {subscriber}\n",
            cell(&answer["replayed"])
        );
        if let Some(resume) = answer["resume_since"].as_str() {
            shown.push_str(&format!(
                "more follow: replay again with --since {resume}\n"
            ));
        }
        shown
    });
    Ok(())
}

pub(crate) async fn webhook_replay(
    hub: &Hub,
    webhook: &str,
    since: Option<DateTime<Utc>>,
    event_id: Option<Uuid>,
    limit: Option<usize>,
) -> Result<(), Failure> {
    let answer = hub
        .post(
            "webhooks/replay",
            &json!({
                "subscriber": webhook,
                "since": since.map(|since| since.to_rfc3339()),
                "event_id": event_id.map(|id| id.to_string()),
                "limit": limit,
            }),
        )
        .await?;
    hub.print(&answer, |answer| {
        format!(
            "re-opened {} rows of webhook {webhook}\n",
            cell(&answer["reopened"])
        )
    });
    Ok(())
}

pub(crate) async fn webhook_deliveries(hub: &Hub, query: &[(&str, &str)]) -> Result<(), Failure> {
    let answer = hub.get("webhooks/deliveries", query).await?;
    hub.print(&answer, |answer| {
        let mut table = Table::new([
            "OUTBOX",
            "EVENT",
            "NAME",
            "WEBHOOK",
            "STATE",
            "RETRIES",
            "RECORDED",
            "LAST ERROR",
        ]);
        for delivery in elements(answer) {
            table.row([
                cell(&delivery["outbox"]),
                cell(&delivery["event_id"]),
                cell(&delivery["event_name"]),
                cell(&delivery["subscriber"]),
                cell(&delivery["state"]),
                cell(&delivery["retry_count"]),
                cell(&delivery["created_at"]),
                cell(&delivery["last_error"]),
            ]);
        }
        if table.is_empty() {
            "no delivery matches\n".to_owned()
        } else {
            table.to_string()
        }
    });
    Ok(())
}
