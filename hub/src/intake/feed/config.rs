//! A feed's settings (`[[feed]]` in the hub's configuration file), their
//! defaults, and their translation into the outbox dispatcher's settings,
//! naming the first bad value as `feed.<setting>`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::{DEFAULT_TOPIC_TEMPLATE, TopicTemplate};
use crate::config::text::{ConfigError, invalid, parse_duration};
use crate::delivery::RetryPolicy;
use crate::delivery::client::Trust;
use crate::delivery::net::NetPolicy;
use crate::delivery::outbox::{DEFAULT_DELIVERIES_TABLE, DEFAULT_OUTBOX_TABLE, OutboxTables};
use crate::delivery::outbox::{DispatcherConfig, WebhookSignature};

/// The subscriber name a feed's bridge delivers as unless configured
/// otherwise.
pub const DEFAULT_SUBSCRIBER: &str = "websub-hub";

/// One `[[feed]]`: a producer's outbox the hub consumes. Every field but
/// `database_url` has a default; durations are strings like `"10s"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedConfig {
    /// The producer's database (`postgres://…`).
    pub database_url: String,
    /// The outbox table, `table` or `schema.table` (`outbox`).
    #[serde(default = "default_outbox_table")]
    pub outbox_table: String,
    /// The deliveries table (`outbox_deliveries`).
    #[serde(default = "default_deliveries_table")]
    pub deliveries_table: String,
    /// The name the bridge's delivery rows are recorded under
    /// (`websub-hub`). Keep it stable: a new name re-delivers every event
    /// inside `start_from`.
    #[serde(default = "default_subscriber")]
    pub subscriber: String,
    /// The topic of each event (`{public_url}topics/{event_name}`); see
    /// [`TopicTemplate`].
    #[serde(default = "default_topic_template")]
    pub topic_template: String,
    /// Event names the bridge forwards, whether or not their topics have
    /// subscribers. When unset, it forwards the events whose topic has at
    /// least one WebSub subscription, and no other (see
    /// [`super::SubscribedTopics`]).
    pub events: Option<Vec<String>>,
    /// How far back expansion looks: RFC 3339, or `"now"` (the feed's start,
    /// so events written while the hub was down and not yet expanded are
    /// skipped). Every event when unset.
    pub start_from: Option<String>,
    /// How often to poll besides `NOTIFY` (`1s`).
    pub poll_interval: Option<String>,
    /// The `NOTIFY` channel (derived from the outbox table's name).
    pub notify_channel: Option<String>,
    /// A [`WebhooksFile`](super::webhooks_file::WebhooksFile) of webhook subscribers, watched for changes.
    pub webhooks_file: Option<PathBuf>,
    /// The secret webhook bodies are signed with.
    pub signing_secret: Option<String>,
    /// The secret `signing_secret` replaces, while receivers move to the
    /// new one: Standard Webhooks requests carry a signature with each; the
    /// messaging header carries the new one's. Remove it once every
    /// receiver holds the new secret.
    pub previous_signing_secret: Option<String>,
    /// `messaging` (the default: the messaging contract's headers) or
    /// `standard-webhooks` (`webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`; the secret is then `whsec_…`).
    pub signature_scheme: Option<String>,
    /// Headers sent with every webhook.
    #[serde(default)]
    pub webhook_headers: BTreeMap<String, String>,
    /// Delete events older than this from the outbox, hourly.
    pub retention: Option<String>,
    /// Retries of a failed delivery (10). Also read as
    /// `max_delivery_retries`, its former name.
    #[serde(alias = "max_delivery_retries")]
    pub delivery_retries: Option<u32>,
    /// The wait before the last retry (`10s`). Also read as
    /// `max_retry_backoff`, its former name.
    #[serde(alias = "max_retry_backoff")]
    pub delivery_max_backoff: Option<String>,
    /// Time allowed for one webhook delivery (`10s`).
    pub delivery_timeout: Option<String>,
    /// Deliveries in flight at once, over all subscribers (64).
    pub delivery_concurrency: Option<usize>,
    /// Deliveries in flight at once to one subscriber (16). Fairness here is
    /// per subscriber, where the hub's WebSub deliveries share out by
    /// callback host (`delivery_per_host`).
    pub delivery_per_subscriber: Option<usize>,
    /// The least a subscriber's in-flight limit falls to while its webhook
    /// is failing or slowing down (1); it adapts between this and
    /// `delivery_per_subscriber`.
    pub delivery_per_subscriber_min: Option<usize>,
    /// Delivery rows claimed per round trip at most (100).
    pub delivery_batch_size: Option<usize>,
    /// Deliveries to one webhook that exhaust their retries in a row before
    /// it is disabled and its rows are skipped (0, the default, never
    /// disables: every row is tried to its own retry limit, as the
    /// messaging contract has it).
    pub disable_endpoint_after: Option<u32>,
    /// A delivery claimed by a process that died is claimed again after this
    /// (`60s`; must exceed `delivery_timeout`).
    pub visibility_timeout: Option<String>,
    /// Failed attempts in a row that open a webhook's breaker (0, the
    /// default: none, every row tried to its own retry limit as the
    /// messaging contract has it). Beyond the contract: while open, the
    /// webhook's due rows wait without spending retries, and the next real
    /// delivery probes it.
    pub breaker_open_after: Option<u32>,
    /// When a webhook's breaker closes, re-open its rows that ran out of
    /// retries while it was failing (false). Beyond the contract; needs
    /// `breaker_open_after`.
    pub resend_exhausted: Option<bool>,
    /// Reconnection failures of the feed's `LISTEN` connection over which
    /// the wait between attempts grows from zero to `listener_max_backoff`
    /// (10, the messaging contract's `ListenerMaxRetries`); past them it
    /// stays there, and the listener never gives up.
    pub listener_max_retries: Option<u32>,
    /// The longest wait between reconnection attempts of the `LISTEN`
    /// connection (`30s`, the messaging contract's `ListenerMaxBackoff`).
    pub listener_max_backoff: Option<String>,
    /// Allow webhooks on loopback, private, link-local or unique-local
    /// addresses; the hub's `allow_private_network` when unset.
    pub allow_private_network: Option<bool>,
    /// A PEM file of the client certificate (and chain) the feed's
    /// webhooks are shown when they ask for one (mTLS), in place of the
    /// hub's `client_cert`; needs `client_key`. A webhook may have its own
    /// (in the webhooks file).
    pub client_cert: Option<std::path::PathBuf>,
    /// The PEM file of `client_cert`'s private key.
    pub client_key: Option<std::path::PathBuf>,
    /// The roots trusted for HTTPS webhooks, and the hub's client
    /// certificate: not read from the file; the hub gives its own (the
    /// system's roots and `extra_ca`, `client_cert`).
    #[serde(skip)]
    pub trust: Trust,
}

fn default_outbox_table() -> String {
    DEFAULT_OUTBOX_TABLE.to_owned()
}

fn default_deliveries_table() -> String {
    DEFAULT_DELIVERIES_TABLE.to_owned()
}

fn default_subscriber() -> String {
    DEFAULT_SUBSCRIBER.to_owned()
}

fn default_topic_template() -> String {
    DEFAULT_TOPIC_TEMPLATE.to_owned()
}

impl FeedConfig {
    /// A feed of the outbox in `database_url`, with every default.
    pub fn new(database_url: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            outbox_table: default_outbox_table(),
            deliveries_table: default_deliveries_table(),
            subscriber: default_subscriber(),
            topic_template: default_topic_template(),
            events: None,
            start_from: None,
            poll_interval: None,
            notify_channel: None,
            webhooks_file: None,
            signing_secret: None,
            previous_signing_secret: None,
            signature_scheme: None,
            webhook_headers: BTreeMap::new(),
            retention: None,
            delivery_retries: None,
            delivery_max_backoff: None,
            delivery_timeout: None,
            delivery_concurrency: None,
            delivery_per_subscriber: None,
            delivery_per_subscriber_min: None,
            delivery_batch_size: None,
            disable_endpoint_after: None,
            visibility_timeout: None,
            listener_max_retries: None,
            listener_max_backoff: None,
            breaker_open_after: None,
            resend_exhausted: None,
            allow_private_network: None,
            client_cert: None,
            client_key: None,
            trust: Trust::system(),
        }
    }

    /// Checks every setting and builds the dispatcher's configuration; the
    /// first bad value is named (`feed.<setting>`). `start_from = "now"` is
    /// resolved to the current time here.
    pub fn dispatcher_config(&self) -> Result<DispatcherConfig, ConfigError> {
        if !(self.database_url.starts_with("postgres://")
            || self.database_url.starts_with("postgresql://"))
        {
            // The URL may carry a password: not echoed.
            return Err(invalid(
                "feed.database_url",
                "…",
                "must be a postgres:// URL",
            ));
        }
        let tables =
            OutboxTables::new(&self.outbox_table, &self.deliveries_table).map_err(|error| {
                let (setting, value) = if OutboxTables::new(&self.outbox_table, "d").is_err() {
                    ("feed.outbox_table", &self.outbox_table)
                } else {
                    ("feed.deliveries_table", &self.deliveries_table)
                };
                invalid(setting, value, error.to_string())
            })?;
        if self.subscriber.is_empty() {
            return Err(invalid("feed.subscriber", "", "must not be empty"));
        }
        TopicTemplate::parse(&self.topic_template).map_err(|error| {
            invalid(
                "feed.topic_template",
                &self.topic_template,
                reason_of(error),
            )
        })?;
        if let Some(events) = &self.events
            && let Some(empty) = events.iter().find(|name| name.is_empty())
        {
            return Err(invalid("feed.events", empty, "an event name is empty"));
        }
        let start_from = match self.start_from.as_deref() {
            None => None,
            Some("now") => Some(Utc::now()),
            Some(text) => Some(
                DateTime::parse_from_rfc3339(text)
                    .map_err(|error| {
                        invalid(
                            "feed.start_from",
                            text,
                            format!("expected RFC 3339 or \"now\": {error}"),
                        )
                    })?
                    .with_timezone(&Utc),
            ),
        };
        let duration = |setting: &'static str, value: &Option<String>| {
            value
                .as_deref()
                .map(|text| parse_duration(setting, text))
                .transpose()
        };
        let defaults = DispatcherConfig::default();
        let config = DispatcherConfig {
            tables,
            channel: self.notify_channel.clone(),
            subscriber_name: Some(self.subscriber.clone()),
            start_from,
            poll_interval: duration("feed.poll_interval", &self.poll_interval)?
                .unwrap_or(defaults.poll_interval),
            retry: RetryPolicy {
                max_retries: self.delivery_retries.unwrap_or(defaults.retry.max_retries),
                max_backoff: duration("feed.delivery_max_backoff", &self.delivery_max_backoff)?
                    .unwrap_or(defaults.retry.max_backoff),
            },
            concurrency: self.delivery_concurrency.unwrap_or(defaults.concurrency),
            per_subscriber: self
                .delivery_per_subscriber
                .unwrap_or(defaults.per_subscriber),
            per_subscriber_min: self
                .delivery_per_subscriber_min
                .unwrap_or(defaults.per_subscriber_min),
            batch_size: self.delivery_batch_size.unwrap_or(defaults.batch_size),
            network: NetPolicy {
                allow_private_network: self.allow_private_network.unwrap_or(false),
            },
            trust: match crate::config::client_identity(
                ("feed.client_cert", self.client_cert.as_deref()),
                ("feed.client_key", self.client_key.as_deref()),
            )? {
                Some(identity) => self.trust.clone().with_identity(Some(identity)),
                None => self.trust.clone(),
            },
            signing_secret: self.signing_secret.clone(),
            previous_signing_secret: self.previous_signing_secret.clone(),
            signature_scheme: match &self.signature_scheme {
                None => WebhookSignature::default(),
                Some(scheme) => scheme
                    .parse()
                    .map_err(|reason: String| invalid("feed.signature_scheme", scheme, reason))?,
            },
            webhook_headers: self
                .webhook_headers
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
            retention: duration("feed.retention", &self.retention)?,
            delivery_timeout: duration("feed.delivery_timeout", &self.delivery_timeout)?
                .unwrap_or(defaults.delivery_timeout),
            visibility_timeout: duration("feed.visibility_timeout", &self.visibility_timeout)?
                .unwrap_or(defaults.visibility_timeout),
            listener_max_retries: self
                .listener_max_retries
                .unwrap_or(defaults.listener_max_retries),
            listener_max_backoff: duration(
                "feed.listener_max_backoff",
                &self.listener_max_backoff,
            )?
            .unwrap_or(defaults.listener_max_backoff),
            breaker_open_after: self
                .breaker_open_after
                .unwrap_or(defaults.breaker_open_after),
            resend_exhausted: self.resend_exhausted.unwrap_or(defaults.resend_exhausted),
            ..defaults
        };
        config.validate().map_err(|error| match error {
            ConfigError::Invalid {
                setting,
                value,
                reason,
            } => ConfigError::Invalid {
                setting: feed_setting(setting),
                value,
                reason,
            },
            other => other,
        })?;
        Ok(config)
    }
}

pub(super) fn reason_of(error: ConfigError) -> String {
    match error {
        ConfigError::Invalid { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// A dispatcher setting's name as a feed setting.
fn feed_setting(setting: &'static str) -> &'static str {
    match setting {
        "poll-interval" => "feed.poll_interval",
        "notify-channel" => "feed.notify_channel",
        "subscriber-name" => "feed.subscriber",
        "signing-secret" => "feed.signing_secret",
        "previous-signing-secret" => "feed.previous_signing_secret",
        "webhook-header" => "feed.webhook_headers",
        "delivery-timeout" => "feed.delivery_timeout",
        "visibility-timeout" => "feed.visibility_timeout",
        "batch-size" => "feed.delivery_batch_size",
        "concurrency" => "feed.delivery_concurrency",
        "per-subscriber" => "feed.delivery_per_subscriber",
        "per-subscriber-min" => "feed.delivery_per_subscriber_min",
        "listener-max-backoff" => "feed.listener_max_backoff",
        "resend-exhausted" => "feed.resend_exhausted",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_minimal_feed_takes_every_default() {
        let feed: FeedConfig =
            toml::from_str("database_url = \"postgres://db/app\"\n").expect("parse");
        assert_eq!(feed, FeedConfig::new("postgres://db/app"));
        let config = feed.dispatcher_config().expect("valid");
        assert_eq!(config.tables, OutboxTables::default());
        assert_eq!(config.subscriber_name.as_deref(), Some(DEFAULT_SUBSCRIBER));
        assert_eq!(config.poll_interval, Duration::from_secs(1));
        assert_eq!(config.retry.max_retries, 10);
        assert_eq!(config.start_from, None);
        // The messaging contract's listener defaults.
        assert_eq!(config.listener_max_retries, 10);
        assert_eq!(config.listener_max_backoff, Duration::from_secs(30));
        // The contract's per-row behaviour: no breaker, nothing re-sent.
        assert_eq!(config.breaker_open_after, 0);
        assert!(!config.resend_exhausted);
    }

    #[test]
    fn every_setting_applies() {
        let feed: FeedConfig = toml::from_str(
            r#"
            database_url = "postgres://db/app"
            outbox_table = "shared.outbox"
            deliveries_table = "shared.outbox_deliveries"
            subscriber = "hub-eu"
            topic_template = "{public_url}apps/{app}/{event_name}"
            events = ["a", "b"]
            start_from = "2026-01-01T00:00:00+01:00"
            poll_interval = "250ms"
            notify_channel = "shared_events"
            webhooks_file = "/etc/websub/webhooks.toml"
            signing_secret = "s3cret"
            retention = "30d"
            delivery_retries = 3
            delivery_max_backoff = "2s"
            listener_max_retries = 4
            listener_max_backoff = "5s"
            breaker_open_after = 3
            resend_exhausted = true
            [webhook_headers]
            X-Internal-API-Key = "k"
            "#,
        )
        .expect("parse");
        let config = feed.dispatcher_config().expect("valid");
        assert_eq!(config.tables.outbox(), "shared.outbox");
        assert_eq!(config.channel(), "shared_events");
        assert_eq!(config.subscriber_name.as_deref(), Some("hub-eu"));
        assert_eq!(
            config.start_from.map(|at| at.to_rfc3339()),
            Some("2025-12-31T23:00:00+00:00".to_owned())
        );
        assert_eq!(config.poll_interval, Duration::from_millis(250));
        assert_eq!(config.retention, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(config.retry.max_retries, 3);
        assert_eq!(config.retry.max_backoff, Duration::from_secs(2));
        assert_eq!(config.listener_max_retries, 4);
        assert_eq!(config.listener_max_backoff, Duration::from_secs(5));
        assert_eq!(config.breaker_open_after, 3);
        assert!(config.resend_exhausted);
        assert_eq!(config.signing_secret.as_deref(), Some("s3cret"));
        assert_eq!(
            config.webhook_headers,
            [("X-Internal-API-Key".to_owned(), "k".to_owned())]
        );
    }

    #[test]
    fn start_from_now_is_the_current_time() {
        let mut feed = FeedConfig::new("postgres://db/app");
        feed.start_from = Some("now".to_owned());
        let before = Utc::now();
        let start = feed
            .dispatcher_config()
            .expect("valid")
            .start_from
            .expect("set");
        assert!(start >= before && start <= Utc::now());
    }

    #[test]
    fn validation_names_the_bad_setting() {
        type Spoil = fn(&mut FeedConfig);
        let cases: [(&str, Spoil); 12] = [
            ("feed.database_url", |feed| {
                feed.database_url = "mysql://x".to_owned();
            }),
            ("feed.outbox_table", |feed| {
                feed.outbox_table = "Bad Name".to_owned();
            }),
            ("feed.deliveries_table", |feed| {
                feed.deliveries_table = "a.b.c".to_owned();
            }),
            ("feed.subscriber", |feed| feed.subscriber = String::new()),
            ("feed.topic_template", |feed| {
                feed.topic_template = "{public_url}{nope}".to_owned();
            }),
            ("feed.start_from", |feed| {
                feed.start_from = Some("yesterday".to_owned());
            }),
            ("feed.poll_interval", |feed| {
                feed.poll_interval = Some("fast".to_owned());
            }),
            ("feed.retention", |feed| {
                feed.retention = Some("30y".to_owned());
            }),
            ("feed.listener_max_backoff", |feed| {
                feed.listener_max_backoff = Some("soon".to_owned());
            }),
            ("feed.listener_max_backoff", |feed| {
                feed.listener_max_backoff = Some("0s".to_owned());
            }),
            ("feed.resend_exhausted", |feed| {
                feed.resend_exhausted = Some(true);
            }),
            ("feed.webhook_headers", |feed| {
                feed.webhook_headers
                    .insert("Content-Type".to_owned(), "text/plain".to_owned());
            }),
        ];
        for (setting, spoil) in cases {
            let mut feed = FeedConfig::new("postgres://db/app");
            spoil(&mut feed);
            match feed.dispatcher_config() {
                Err(ConfigError::Invalid { setting: named, .. }) => {
                    assert_eq!(named, setting);
                }
                other => panic!("{setting}: expected a refusal, got {other:?}"),
            }
        }
        assert!(toml::from_str::<FeedConfig>("database_url = \"postgres://x\"\npoll = 1").is_err());
        assert!(toml::from_str::<FeedConfig>("outbox_table = \"outbox\"").is_err());
    }
}
