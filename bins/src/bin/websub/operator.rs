//! The commands that ask a running hub through its operator API
//! (`/api/v1/operator/…`): what it holds (topics, subscriptions, outbox
//! feeds), what became of its deliveries, and retrying the failed ones;
//! those that change what it delivers are in [`crate::steer`], and
//! those about who may reach it in [`crate::access`]. Each
//! command is a clap variant of [`OperatorCommand`] and one function that
//! sends its request through [`Hub`] and prints the answer as a table (or
//! as the API's JSON with `--json`); [`run`] maps the outcome to the exit
//! code.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use clap::Subcommand;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::client::{Failure, Hub, HubArgs, cell, elements};
use crate::table::{Table, fields};

/// The commands talking to a running hub.
#[derive(Debug, Subcommand)]
pub(crate) enum OperatorCommand {
    /// List every topic with its number of subscriptions.
    Topics {
        #[command(flatten)]
        hub: HubArgs,
    },
    /// List, show or delete subscriptions.
    Subscriptions {
        #[command(subcommand)]
        command: SubscriptionsCommand,
    },
    /// Show a delivery with its attempts, or retry failed deliveries.
    Deliveries {
        #[command(subcommand)]
        command: DeliveriesCommand,
    },
    /// List the outbox feeds: backlog, oldest undelivered event, listener.
    Feeds {
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Send an event again: to one subscription, or to every subscription
    /// of its topic. A new delivery record each; subscribers receive the
    /// event's own id.
    Redeliver {
        /// The event's id (a UUID).
        #[arg(value_parser = parse_event_id)]
        event_id: Uuid,
        /// Only this subscription of the event's topic (its callback URL).
        #[arg(long)]
        subscriber: Option<String>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Send a topic's events since a time again to one subscription (at
    /// most 10 000 per run; it says where to go on).
    Replay {
        /// The topic URL.
        #[arg(long)]
        topic: String,
        /// The subscription's callback URL.
        #[arg(long)]
        subscriber: String,
        /// Events recorded at or after this time (RFC 3339, e.g.
        /// 2026-12-01T10:00:00Z).
        #[arg(long, value_parser = crate::steer::parse_time)]
        since: DateTime<Utc>,
        /// At most this many events (1 to 10 000).
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Send an outbox webhook's events again: its rows of the events since a
    /// time, or of one event, re-opened due now in every feed.
    WebhookReplay {
        /// The webhook's name.
        webhook: String,
        /// Its rows of events recorded at or after this time (RFC 3339).
        #[arg(long, value_parser = crate::steer::parse_time, required_unless_present = "event_id", conflicts_with = "event_id")]
        since: Option<DateTime<Utc>>,
        /// Its row of this one event.
        #[arg(long, value_parser = parse_event_id)]
        event_id: Option<Uuid>,
        /// At most this many rows per feed (1 to 10 000).
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// List troubled endpoints, or disable or enable one.
    Endpoints {
        #[command(subcommand)]
        command: crate::steer::EndpointsCommand,
    },
    /// List the admin page's sessions, or end one or all of them.
    AdminSessions {
        #[command(subcommand)]
        command: crate::access::AdminSessionsCommand,
    },
    /// Issue a link that signs one subscriber into its portal pages
    /// (its own subscriptions, deliveries and their actions) until it
    /// expires.
    PortalLink {
        /// The subscriber (the `sub` of its user tokens).
        subscriber: String,
        /// How long the link works, e.g. 1h (a week at most).
        #[arg(long, default_value = "1h", value_parser = crate::access::parse_ttl)]
        ttl: u64,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// List the deny list's patterns, or add or remove one: subscribe
    /// requests whose topic or callback a pattern matches are denied.
    Denials {
        #[command(subcommand)]
        command: crate::access::DenialsCommand,
    },
}

/// `websub subscriptions …`.
#[derive(Debug, Subcommand)]
pub(crate) enum SubscriptionsCommand {
    /// List subscriptions: every topic's, or one topic's, or one callback's.
    List {
        /// Only this topic's.
        #[arg(long)]
        topic: Option<String>,
        /// Only this callback's.
        #[arg(long)]
        callback: Option<String>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Show one subscription and how its deliveries are going.
    Show {
        #[command(flatten)]
        pair: Pair,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Remove one subscription at once, without verification of intent.
    Delete {
        #[command(flatten)]
        pair: Pair,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Deny one subscription: remove it and tell its callback why
    /// (hub.mode=denied). To keep it from subscribing again, add a pattern
    /// with `websub denials add`.
    Deny {
        #[command(flatten)]
        pair: Pair,
        /// Sent to the callback as hub.reason.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Set how one subscription's events are delivered: `ordered` (one at
    /// a time, strictly in recording order; a failing event holds the ones
    /// after it) or `unordered` (all at once, the default).
    Delivery {
        #[command(flatten)]
        pair: Pair,
        /// `ordered` or `unordered`.
        #[arg(value_enum)]
        order: DeliveryOrder,
        #[command(flatten)]
        hub: HubArgs,
    },
}

/// How a subscription's events are delivered.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum DeliveryOrder {
    /// One at a time, strictly in recording order.
    Ordered,
    /// All at once (the default).
    Unordered,
}

/// One subscription, by its topic and callback.
#[derive(Debug, clap::Args)]
pub(crate) struct Pair {
    /// The topic URL.
    #[arg(long)]
    topic: String,
    /// The callback URL.
    #[arg(long)]
    callback: String,
}

/// `websub deliveries …`.
#[derive(Debug, Subcommand)]
pub(crate) enum DeliveriesCommand {
    /// List delivery records, newest event first: WebSub deliveries, or
    /// (`--webhook`) an outbox webhook's rows.
    List {
        /// An outbox webhook's rows instead, by its name.
        #[arg(long, conflicts_with_all = ["event_id", "topic", "subscriber"])]
        webhook: Option<String>,
        /// Records of this event and of its redeliveries.
        #[arg(long, value_parser = parse_event_id)]
        event_id: Option<Uuid>,
        /// Only this topic's.
        #[arg(long)]
        topic: Option<String>,
        /// Only this subscriber's (a callback URL).
        #[arg(long)]
        subscriber: Option<String>,
        /// Only those in this state.
        #[arg(long, value_parser = ["pending", "delivered", "dropped", "failed", "skipped"])]
        state: Option<String>,
        /// Events recorded at or after this time (RFC 3339).
        #[arg(long, value_parser = crate::steer::parse_time)]
        since: Option<DateTime<Utc>>,
        /// Events recorded before this time (RFC 3339).
        #[arg(long, value_parser = crate::steer::parse_time)]
        until: Option<DateTime<Utc>>,
        /// At most this many (1 to 1000).
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Show one delivery of an event to a subscriber, with every attempt.
    Show {
        /// The event's id (a UUID).
        #[arg(value_parser = parse_event_id)]
        event_id: Uuid,
        /// The subscriber: the subscription's callback URL.
        #[arg(long)]
        subscriber: String,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Re-open failed deliveries (all, or a topic's, or a subscriber's)
    /// with a fresh retry budget.
    Retry {
        /// Only this topic's.
        #[arg(long)]
        topic: Option<String>,
        /// Only this subscriber's (its callback URL).
        #[arg(long)]
        subscriber: Option<String>,
        #[command(flatten)]
        hub: HubArgs,
    },
}

/// An event id as the command line gives it.
fn parse_event_id(value: &str) -> Result<Uuid, String> {
    Uuid::try_parse(value.trim()).map_err(|_| format!("{value:?} is not an event id (a UUID)"))
}

/// Runs `command` against the hub its options name.
pub(crate) async fn run(command: OperatorCommand) -> Result<(), Failure> {
    use DeliveriesCommand as Deliveries;
    use SubscriptionsCommand as Subscriptions;
    match command {
        OperatorCommand::Topics { hub } => topics(&hub.connect()?).await,
        OperatorCommand::Feeds { hub } => feeds(&hub.connect()?).await,
        OperatorCommand::Redeliver {
            event_id,
            subscriber,
            hub,
        } => crate::steer::redeliver(&hub.connect()?, event_id, subscriber).await,
        OperatorCommand::Replay {
            topic,
            subscriber,
            since,
            limit,
            hub,
        } => crate::steer::replay(&hub.connect()?, &topic, &subscriber, since, limit).await,
        OperatorCommand::Endpoints { command } => crate::steer::endpoints(command).await,
        OperatorCommand::AdminSessions { command } => crate::access::admin_sessions(command).await,
        OperatorCommand::PortalLink {
            subscriber,
            ttl,
            hub,
        } => crate::access::portal_link(&hub.connect()?, &subscriber, ttl).await,
        OperatorCommand::Denials { command } => crate::access::denials(command).await,
        OperatorCommand::WebhookReplay {
            webhook,
            since,
            event_id,
            limit,
            hub,
        } => crate::steer::webhook_replay(&hub.connect()?, &webhook, since, event_id, limit).await,
        OperatorCommand::Subscriptions { command } => match command {
            Subscriptions::List {
                topic,
                callback,
                hub,
            } => list_subscriptions(&hub.connect()?, topic, callback).await,
            Subscriptions::Show { pair, hub } => show_subscription(&hub.connect()?, &pair).await,
            Subscriptions::Delete { pair, hub } => {
                delete_subscription(&hub.connect()?, &pair).await
            }
            Subscriptions::Deny { pair, reason, hub } => {
                deny_subscription(&hub.connect()?, &pair, &reason).await
            }
            Subscriptions::Delivery { pair, order, hub } => {
                set_delivery(&hub.connect()?, &pair, order).await
            }
        },
        OperatorCommand::Deliveries { command } => match command {
            Deliveries::List {
                webhook,
                event_id,
                topic,
                subscriber,
                state,
                since,
                until,
                limit,
                hub,
            } => {
                let event_id = event_id.map(|id| id.to_string());
                let since = since.map(|time| time.to_rfc3339());
                let until = until.map(|time| time.to_rfc3339());
                let limit = limit.map(|limit| limit.to_string());
                let subscriber = webhook.as_deref().or(subscriber.as_deref());
                let query: Vec<(&str, &str)> = [
                    ("event_id", event_id.as_deref()),
                    ("topic", topic.as_deref()),
                    ("subscriber", subscriber),
                    ("state", state.as_deref()),
                    ("since", since.as_deref()),
                    ("until", until.as_deref()),
                    ("limit", limit.as_deref()),
                ]
                .into_iter()
                .filter_map(|(name, value)| Some((name, value?)))
                .collect();
                match webhook {
                    Some(_) => crate::steer::webhook_deliveries(&hub.connect()?, &query).await,
                    None => list_deliveries(&hub.connect()?, &query).await,
                }
            }
            Deliveries::Show {
                event_id,
                subscriber,
                hub,
            } => show_delivery(&hub.connect()?, event_id, &subscriber).await,
            Deliveries::Retry {
                topic,
                subscriber,
                hub,
            } => retry_deliveries(&hub.connect()?, topic, subscriber).await,
        },
    }
}

async fn topics(hub: &Hub) -> Result<(), Failure> {
    let answer = hub.get("topics", &[]).await?;
    hub.print(&answer, |answer| {
        let mut table = Table::new(["TOPIC", "SUBSCRIBERS"]);
        for topic in elements(answer) {
            table.row([cell(&topic["topic"]), cell(&topic["subscribers"])]);
        }
        table.to_string()
    });
    Ok(())
}

/// The operator API lists one topic's subscriptions at a time: without
/// `--topic`, every topic is asked in turn.
async fn list_subscriptions(
    hub: &Hub,
    topic: Option<String>,
    callback: Option<String>,
) -> Result<(), Failure> {
    let topics = match topic {
        Some(topic) => vec![topic],
        None => elements(&hub.get("topics", &[]).await?)
            .iter()
            .filter_map(|topic| topic["topic"].as_str().map(str::to_owned))
            .collect(),
    };
    let mut listed = Vec::new();
    for topic in &topics {
        let answer = hub.get("subscriptions", &[("topic", topic)]).await?;
        listed.extend(
            elements(&answer)
                .iter()
                .filter(|subscription| {
                    callback
                        .as_deref()
                        .is_none_or(|callback| subscription["callback"] == callback)
                })
                .cloned(),
        );
    }
    hub.print(&Value::Array(listed), |answer| {
        let mut table = Table::new(["TOPIC", "CALLBACK", "OWNER", "SIGNED", "EXPIRES"]);
        for subscription in elements(answer) {
            table.row([
                cell(&subscription["topic"]),
                cell(&subscription["callback"]),
                cell(&subscription["owner"]),
                cell(&subscription["has_secret"]),
                cell(&subscription["expires_at"]),
            ]);
        }
        table.to_string()
    });
    Ok(())
}

impl Pair {
    fn query(&self) -> [(&str, &str); 2] {
        [("topic", &self.topic), ("callback", &self.callback)]
    }
}

async fn show_subscription(hub: &Hub, pair: &Pair) -> Result<(), Failure> {
    let answer = hub.get("subscription", &pair.query()).await?;
    hub.print(&answer, |answer| {
        let delivery = &answer["delivery"];
        fields([
            ("topic", cell(&answer["topic"])),
            ("callback", cell(&answer["callback"])),
            ("owner", cell(&answer["owner"])),
            ("signed", cell(&answer["has_secret"])),
            ("lease seconds", cell(&answer["lease_seconds"])),
            ("created", cell(&answer["created_at"])),
            ("verified", cell(&answer["verified_at"])),
            ("expires", cell(&answer["expires_at"])),
            ("ordered", cell(&answer["ordered"])),
            ("last success", cell(&delivery["last_success"])),
            ("last error", cell(&delivery["last_error"])),
            ("pending", cell(&delivery["pending"])),
            ("failed", cell(&delivery["failed"])),
        ])
    });
    Ok(())
}

async fn set_delivery(hub: &Hub, pair: &Pair, order: DeliveryOrder) -> Result<(), Failure> {
    let ordered = matches!(order, DeliveryOrder::Ordered);
    let answer = hub
        .put(
            "subscription/delivery",
            &pair.query(),
            &json!({ "ordered": ordered }),
        )
        .await?;
    hub.print(&answer, |answer| {
        let how = if answer["ordered"].as_bool() == Some(true) {
            "one at a time, in recording order"
        } else {
            "all at once"
        };
        format!(
            "{} gets {} events {how}\n",
            cell(&answer["callback"]),
            cell(&answer["topic"])
        )
    });
    Ok(())
}

async fn delete_subscription(hub: &Hub, pair: &Pair) -> Result<(), Failure> {
    let Pair { topic, callback } = pair;
    hub.delete("subscriptions", &pair.query()).await?;
    let removed = json!({ "topic": topic, "callback": callback, "removed": true });
    hub.print(&removed, |_| {
        format!("removed the subscription of {callback} to {topic}\n")
    });
    Ok(())
}

async fn deny_subscription(hub: &Hub, pair: &Pair, reason: &str) -> Result<(), Failure> {
    let Pair { topic, callback } = pair;
    let body = json!({ "topic": topic, "callback": callback, "reason": reason });
    let answer = hub.post("subscriptions/deny", &body).await?;
    hub.print(&answer, |answer| {
        let told = if answer["notified"].as_bool() == Some(true) {
            "told it why"
        } else {
            "its callback did not acknowledge the notice"
        };
        format!("denied the subscription of {callback} to {topic}; {told}\n")
    });
    Ok(())
}

async fn show_delivery(hub: &Hub, event_id: Uuid, subscriber: &str) -> Result<(), Failure> {
    let event_id = event_id.to_string();
    let answer = hub
        .get(
            "delivery",
            &[("event_id", &event_id), ("subscriber", subscriber)],
        )
        .await?;
    hub.print(&answer, |answer| {
        let mut shown = fields([
            ("event", cell(&answer["event_id"])),
            ("subscriber", cell(&answer["subscriber"])),
            ("state", cell(&answer["state"])),
            ("retries", cell(&answer["retry_count"])),
            ("last error", cell(&answer["last_error"])),
            ("processed", cell(&answer["processed_at"])),
            ("next attempt", cell(&answer["next_attempt_at"])),
        ]);
        let mut attempts = Table::new(["AT", "MS", "STATUS", "ERROR", "RESPONSE"]);
        for attempt in elements(&answer["attempts"]) {
            attempts.row([
                cell(&attempt["at"]),
                attempt["duration_ms"]
                    .as_f64()
                    .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1}")),
                cell(&attempt["status"]),
                cell(&attempt["error"]),
                cell(&attempt["response"]),
            ]);
        }
        let _ = write!(shown, "\n{attempts}");
        shown
    });
    Ok(())
}

async fn list_deliveries(hub: &Hub, query: &[(&str, &str)]) -> Result<(), Failure> {
    let answer = hub.get("deliveries", query).await?;
    hub.print(&answer, |answer| {
        let mut table = Table::new([
            "EVENT",
            "SUBSCRIBER",
            "STATE",
            "RETRIES",
            "RECORDED",
            "LAST ERROR",
            "REDELIVERS",
        ]);
        for delivery in elements(answer) {
            table.row([
                cell(&delivery["event_id"]),
                cell(&delivery["subscriber"]),
                cell(&delivery["state"]),
                cell(&delivery["retry_count"]),
                cell(&delivery["created_at"]),
                cell(&delivery["last_error"]),
                cell(&delivery["original_id"]),
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

async fn retry_deliveries(
    hub: &Hub,
    topic: Option<String>,
    subscriber: Option<String>,
) -> Result<(), Failure> {
    let answer = hub
        .post(
            "deliveries/retry",
            &json!({ "topic": topic, "subscriber": subscriber }),
        )
        .await?;
    hub.print(&answer, |answer| {
        format!("re-opened {} failed deliveries\n", cell(&answer["retried"]))
    });
    Ok(())
}

async fn feeds(hub: &Hub) -> Result<(), Failure> {
    let answer = hub.get("feeds", &[]).await?;
    hub.print(&answer, |answer| {
        let mut table = Table::new([
            "OUTBOX",
            "BACKLOG",
            "OLDEST UNDELIVERED",
            "LISTENER",
            "SAMPLED",
        ]);
        for feed in elements(answer) {
            let oldest = feed["oldest_undelivered_seconds"]
                .as_f64()
                .map_or_else(|| "-".to_owned(), |seconds| format!("{seconds:.0}s"));
            let listener = match feed["listener_connected"].as_bool() {
                Some(true) => "connected",
                _ => "disconnected",
            };
            table.row([
                cell(&feed["outbox_table"]),
                cell(&feed["backlog"]),
                oldest,
                listener.to_owned(),
                cell(&feed["sampled_at"]),
            ]);
        }
        if table.is_empty() {
            "this hub runs no outbox feed\n".to_owned()
        } else {
            table.to_string()
        }
    });
    Ok(())
}
