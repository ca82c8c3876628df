//! Outbox feeds: the hub as a consumer of producers' outbox tables.
//!
//! A feed runs an outbox [`Dispatcher`] on a producer's database. Its
//! in-process subscriber is the [`WebSubBridge`], which turns every event
//! into a hub event — the envelope as content, `application/json`, on a
//! topic rendered from a [`TopicTemplate`] — recorded in the hub's own
//! [`EventLog`]; the hub's dispatcher then delivers it to the topic's WebSub
//! subscribers, signed and with `Link` headers, like any published content.
//! The same feed can also deliver to webhooks listed in a file
//! ([`WebhooksFile`]), which it watches and reloads on change.
//!
//! A feed is configured by a [`FeedConfig`], the `[[feed]]` section of the
//! hub's configuration file:
//!
//! ```toml
//! [[feed]]
//! database_url = "postgres://auth@db/auth"
//! outbox_table = "shared.outbox"
//! deliveries_table = "shared.outbox_deliveries"
//! subscriber = "websub-hub"          # its delivery rows' name; keep it stable
//! topic_template = "{public_url}topics/{event_name}"
//! start_from = "2026-01-01T00:00:00Z"  # or "now"
//! poll_interval = "1s"
//! webhooks_file = "/etc/websub/webhooks.toml"
//! signing_secret = "…"
//! retention = "30d"
//! delivery_retries = 10
//! delivery_max_backoff = "10s"
//! [feed.webhook_headers]
//! X-Internal-API-Key = "…"
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use url::Url;

use super::dispatcher::{
    Dispatcher, DispatcherConfig, DispatcherError, Handler, HandlerError, RegistrationError,
    ReloadError, WebhookRegistrar, WebhookSubscriber,
};
use super::envelope::{ENVELOPE_CONTENT_TYPE, Envelope};
use super::{DEFAULT_DELIVERIES_TABLE, DEFAULT_OUTBOX_TABLE, OutboxTables};
use crate::clock::{Clock, SystemClock};
use crate::delivery::RetryPolicy;
use crate::events::{EventLog, NewEvent};
use crate::net::NetPolicy;
use crate::setting::{ConfigError, parse_duration};

/// The topic template a feed uses unless configured otherwise.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "{public_url}topics/{event_name}";

/// The subscriber name a feed's bridge delivers as unless configured
/// otherwise.
pub const DEFAULT_SUBSCRIBER: &str = "websub-hub";

/// How often a feed looks at its webhooks file for changes.
pub const WEBHOOKS_FILE_CHECK: Duration = Duration::from_secs(1);

fn invalid(setting: &'static str, value: impl ToString, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        setting,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// How an outbox event's topic URL is built: text with placeholders
/// `{public_url}` (the hub's public URL, ending with a slash),
/// `{event_name}`, `{app}` (empty when none), `{resource_type}` and
/// `{event_type}`. Values other than the public URL are percent-encoded
/// (everything but letters, digits and `-._~`), so they stay one path
/// segment or query value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<Part>,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    PublicUrl,
    EventName,
    App,
    ResourceType,
    EventType,
}

impl TopicTemplate {
    /// Parses a template; an unknown placeholder or an unmatched brace is
    /// refused.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let refuse = |reason: String| invalid("topic-template", text, reason);
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Literal(rest.to_owned()));
                    break;
                }
                Some(at) if rest[at..].starts_with('}') => {
                    return Err(refuse("a `}` without its `{`".to_owned()));
                }
                Some(at) => {
                    if at > 0 {
                        parts.push(Part::Literal(rest[..at].to_owned()));
                    }
                    let Some(end) = rest[at..].find('}') else {
                        return Err(refuse("a `{` without its `}`".to_owned()));
                    };
                    let name = &rest[at + 1..at + end];
                    parts.push(match name {
                        "public_url" => Part::PublicUrl,
                        "event_name" => Part::EventName,
                        "app" => Part::App,
                        "resource_type" => Part::ResourceType,
                        "event_type" => Part::EventType,
                        other => {
                            return Err(refuse(format!(
                                "unknown placeholder {{{other}}} (known: {{public_url}}, \
                                 {{event_name}}, {{app}}, {{resource_type}}, {{event_type}})"
                            )));
                        }
                    });
                    rest = &rest[at + end + 1..];
                }
            }
        }
        Ok(Self {
            parts,
            text: text.to_owned(),
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The topic of `envelope` for a hub at `public_url`.
    pub fn render(&self, public_url: &Url, envelope: &Envelope) -> String {
        let mut topic = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => topic.push_str(text),
                Part::PublicUrl => topic.push_str(public_url.as_str()),
                Part::EventName => encode_into(&mut topic, &envelope.event_name),
                Part::App => encode_into(&mut topic, envelope.app.as_deref().unwrap_or("")),
                Part::ResourceType => encode_into(&mut topic, &envelope.resource_type),
                Part::EventType => encode_into(&mut topic, &envelope.event_type),
            }
        }
        topic
    }

    /// Checks that the template renders absolute http(s) URLs for a hub at
    /// `public_url`.
    pub fn check(&self, public_url: &Url) -> Result<(), ConfigError> {
        let sample = Envelope {
            event_id: uuid::Uuid::nil(),
            event_name: "auth-api.user.authenticated".to_owned(),
            app: Some("app".to_owned()),
            occurred_at: DateTime::UNIX_EPOCH,
            resource_type: "user".to_owned(),
            resource_id: "1".to_owned(),
            event_type: "authenticated".to_owned(),
            data: serde_json::Value::Null,
        };
        let rendered = self.render(public_url, &sample);
        match Url::parse(&rendered) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(()),
            _ => Err(invalid(
                "topic-template",
                &self.text,
                format!("renders {rendered:?}, not an absolute http(s) URL"),
            )),
        }
    }
}

/// Appends `value` percent-encoded: everything but RFC 3986's unreserved
/// characters.
fn encode_into(out: &mut String, value: &str) {
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}

/// The handler that turns outbox events into hub events: it records the
/// envelope (`application/json`) on the event's topic in the hub's event
/// log, then wakes the hub's dispatcher, which delivers it to the topic's
/// WebSub subscribers.
///
/// Delivery is at least once: an event recorded whose outbox row could not
/// be marked processed is recorded again on the retry. WebSub subscribers
/// de-duplicate on the envelope's `event_id`.
#[derive(Clone)]
pub struct WebSubBridge {
    events: Arc<dyn EventLog>,
    wake: Arc<dyn Fn() + Send + Sync>,
    public_url: Url,
    template: TopicTemplate,
    /// The runtime the event log's connections belong to, when the bridge
    /// runs on another (a feed's own).
    log_runtime: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for WebSubBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSubBridge")
            .field("events", &self.events)
            .field("public_url", &self.public_url.as_str())
            .field("template", &self.template.text)
            .finish_non_exhaustive()
    }
}

impl WebSubBridge {
    /// A bridge recording into `events` and calling `wake` after each
    /// record (the hub's `dispatch::Dispatcher::wake`).
    pub fn new(
        events: Arc<dyn EventLog>,
        wake: Arc<dyn Fn() + Send + Sync>,
        public_url: Url,
        template: TopicTemplate,
    ) -> Self {
        Self {
            events,
            wake,
            public_url,
            template,
            log_runtime: None,
        }
    }

    /// Records on `runtime`, the one the event log's connections belong
    /// to, while the bridge itself is called on another.
    pub fn recording_on(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.log_runtime = Some(runtime);
        self
    }

    /// The topic an envelope is recorded on.
    pub fn topic(&self, envelope: &Envelope) -> String {
        self.template.render(&self.public_url, envelope)
    }
}

#[async_trait]
impl Handler for WebSubBridge {
    async fn handle(&self, envelope: &Envelope) -> Result<(), HandlerError> {
        let event = NewEvent {
            topic: self.topic(envelope),
            content_type: ENVELOPE_CONTENT_TYPE.to_owned(),
            body: Bytes::from(envelope.to_json()),
        };
        let now = SystemClock.now();
        match &self.log_runtime {
            Some(runtime) => {
                let events = self.events.clone();
                runtime
                    .spawn(async move { events.record(event, now).await })
                    .await??;
            }
            None => {
                self.events.record(event, now).await?;
            }
        }
        (self.wake)();
        Ok(())
    }
}

/// The webhooks file a feed reads its webhook subscribers from (TOML): one
/// `[[webhook]]` table per (event name, subscriber).
///
/// ```toml
/// [[webhook]]
/// event = "auth-api.user.authenticated"
/// subscriber = "ush-users-api"     # what its delivery rows are recorded under
/// app = "ush"                      # optional: only this app's events (and app-less ones)
/// url = "http://ush-users-api:8000/api/v1/internal/events"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksFile {
    /// The entries.
    #[serde(default)]
    pub webhook: Vec<WebhookEntry>,
}

/// One `[[webhook]]` of a [`WebhooksFile`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookEntry {
    /// The event name.
    pub event: String,
    /// The subscriber's name.
    pub subscriber: String,
    /// Its app, if it wants one app's events.
    pub app: Option<String>,
    /// Where its deliveries go.
    pub url: String,
}

impl WebhooksFile {
    /// Parses the file's text; `path` names it in errors. Every URL must be
    /// absolute and every (event, subscriber) pair appear once.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let refuse = |reason: String| ConfigError::File {
            path: path.display().to_string(),
            reason,
        };
        let file: Self = toml::from_str(text).map_err(|error| refuse(error.to_string()))?;
        let mut seen = HashSet::new();
        for entry in &file.webhook {
            Url::parse(&entry.url).map_err(|error| {
                refuse(format!(
                    "webhook {:?} of {:?}: url {:?}: {error}",
                    entry.subscriber, entry.event, entry.url
                ))
            })?;
            if !seen.insert((entry.event.as_str(), entry.subscriber.as_str())) {
                return Err(refuse(format!(
                    "webhook {:?} of {:?} is listed twice",
                    entry.subscriber, entry.event
                )));
            }
        }
        Ok(file)
    }

    /// Reads and parses the file at `path`.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::File {
            path: path.display().to_string(),
            reason: error.to_string(),
        })?;
        Self::parse(&text, path)
    }

    /// Registers every entry, by event name.
    pub fn register(&self, registrar: &mut dyn WebhookRegistrar) -> Result<(), RegistrationError> {
        let mut by_event: BTreeMap<&str, HashMap<String, WebhookSubscriber>> = BTreeMap::new();
        for entry in &self.webhook {
            let Ok(url) = Url::parse(&entry.url) else {
                return Err(RegistrationError::InvalidUrl {
                    event_name: entry.event.clone(),
                    subscriber: entry.subscriber.clone(),
                    url: entry.url.clone(),
                });
            };
            by_event.entry(&entry.event).or_default().insert(
                entry.subscriber.clone(),
                WebhookSubscriber {
                    app: entry.app.clone(),
                    url,
                },
            );
        }
        for (event, subscribers) in by_event {
            registrar.register_webhooks(event, subscribers)?;
        }
        Ok(())
    }
}

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
    /// Event names the bridge forwards; every event when unset.
    pub events: Option<Vec<String>>,
    /// How far back expansion looks: RFC 3339, or `"now"` (the feed's start,
    /// so events written while the hub was down and not yet expanded are
    /// skipped). Every event when unset.
    pub start_from: Option<String>,
    /// How often to poll besides `NOTIFY` (`1s`).
    pub poll_interval: Option<String>,
    /// The `NOTIFY` channel (derived from the outbox table's name).
    pub notify_channel: Option<String>,
    /// A [`WebhooksFile`] of webhook subscribers, watched for changes.
    pub webhooks_file: Option<PathBuf>,
    /// The secret webhook bodies are signed with.
    pub signing_secret: Option<String>,
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
    /// Delivery rows claimed per round trip at most (100).
    pub delivery_batch_size: Option<usize>,
    /// A delivery claimed by a process that died is claimed again after this
    /// (`60s`; must exceed `delivery_timeout`).
    pub visibility_timeout: Option<String>,
    /// Allow webhooks on loopback, private, link-local or unique-local
    /// addresses; the hub's `allow_private_network` when unset.
    pub allow_private_network: Option<bool>,
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
            webhook_headers: BTreeMap::new(),
            retention: None,
            delivery_retries: None,
            delivery_max_backoff: None,
            delivery_timeout: None,
            delivery_concurrency: None,
            delivery_per_subscriber: None,
            delivery_batch_size: None,
            visibility_timeout: None,
            allow_private_network: None,
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
            batch_size: self.delivery_batch_size.unwrap_or(defaults.batch_size),
            network: NetPolicy {
                allow_private_network: self.allow_private_network.unwrap_or(false),
            },
            signing_secret: self.signing_secret.clone(),
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

fn reason_of(error: ConfigError) -> String {
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
        "webhook-header" => "feed.webhook_headers",
        "delivery-timeout" => "feed.delivery_timeout",
        "visibility-timeout" => "feed.visibility_timeout",
        "batch-size" => "feed.delivery_batch_size",
        "concurrency" => "feed.delivery_concurrency",
        "per-subscriber" => "feed.delivery_per_subscriber",
        other => other,
    }
}

/// Failures starting or reloading a feed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FeedError {
    /// A setting, or the webhooks file, is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The dispatcher could not be built.
    #[error(transparent)]
    Dispatcher(#[from] DispatcherError),
    /// The producer's database could not be reached, or lacks the tables.
    #[error("feed database ({tables}): {source}")]
    Database {
        /// The tables the feed reads.
        tables: String,
        /// What the database said.
        #[source]
        source: sqlx::Error,
    },
    /// A webhook registration was refused.
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    /// The feed's thread or runtime could not be started.
    #[error("could not start the feed's thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl From<ReloadError<RegistrationError>> for FeedError {
    fn from(error: ReloadError<RegistrationError>) -> Self {
        match error {
            ReloadError::Registration(error) | ReloadError::Function(error) => {
                Self::Registration(error)
            }
        }
    }
}

/// Starts feeds; see [`Feed::start`].
#[derive(Debug)]
pub struct Feed;

impl Feed {
    /// Starts a feed: validates `config`, connects to the producer's
    /// database (checking both tables are there), registers the bridge —
    /// recording into `events` and calling `wake` — and the webhooks file's
    /// subscribers, then runs the dispatcher and watches the file until
    /// `shutdown`.
    ///
    /// The feed runs on a thread and single-threaded runtime of its own: a
    /// feed's work is a stream of small steps (a notification, a statement,
    /// a POST) whose latency suffers from hopping between worker threads,
    /// and it is kept apart from the hub's own deliveries, which cannot
    /// starve it, nor it them. The bridge records on the calling runtime,
    /// where the event log's connections live.
    pub async fn start(
        config: FeedConfig,
        events: Arc<dyn EventLog>,
        wake: Arc<dyn Fn() + Send + Sync>,
        public_url: &Url,
        shutdown: CancellationToken,
    ) -> Result<FeedHandle, FeedError> {
        let hub_runtime = tokio::runtime::Handle::current();
        let public_url = public_url.clone();
        let (started, start_result) = oneshot::channel();
        let (finished, stopped) = oneshot::channel();
        std::thread::Builder::new()
            .name("outbox-feed".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = started.send(Err(FeedError::Thread(error)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let set_up = Self::set_up(config, events, wake, &public_url, hub_runtime).await;
                    let state = match set_up {
                        Ok(state) => state,
                        Err(error) => {
                            let _ = started.send(Err(error));
                            return;
                        }
                    };
                    let _ = started.send(Ok(state.clone()));
                    let watcher = state
                        .webhooks_file
                        .is_some()
                        .then(|| tokio::spawn(state.clone().watch(shutdown.clone())));
                    state.dispatcher.clone().run(shutdown).await;
                    if let Some(watcher) = watcher {
                        let _ = watcher.await;
                    }
                });
                let _ = finished.send(());
            })
            .map_err(FeedError::Thread)?;
        let state = start_result.await.map_err(|_| {
            FeedError::Thread(std::io::Error::other(
                "the feed's thread stopped while starting",
            ))
        })??;
        Ok(FeedHandle { state, stopped })
    }

    /// Everything [`Feed::start`] does before running.
    async fn set_up(
        config: FeedConfig,
        events: Arc<dyn EventLog>,
        wake: Arc<dyn Fn() + Send + Sync>,
        public_url: &Url,
        hub_runtime: tokio::runtime::Handle,
    ) -> Result<Arc<FeedState>, FeedError> {
        let dispatcher_config = config.dispatcher_config()?;
        let template = TopicTemplate::parse(&config.topic_template)?;
        template.check(public_url).map_err(|error| {
            invalid(
                "feed.topic_template",
                &config.topic_template,
                reason_of(error),
            )
        })?;
        let tables = dispatcher_config.tables.clone();
        let database = |source| FeedError::Database {
            tables: tables.to_string(),
            source,
        };
        // Claims rely on READ COMMITTED (a row claimed concurrently fails the
        // re-checked predicate instead of failing the statement), whatever
        // the producer's database default. Claims and outcomes lost in a
        // crash only mean a delivery made again, so they need not wait for
        // the WAL to be flushed. The dispatcher's statements take arrays,
        // which lead the planner to plan them afresh at every call (costing
        // more than running them); their generic plans are as good.
        let options = PgConnectOptions::from_str(&config.database_url)
            .map_err(database)?
            .options([
                ("default_transaction_isolation", "read committed"),
                ("synchronous_commit", "off"),
                ("plan_cache_mode", "force_generic_plan"),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(database)?;
        for table in [tables.outbox_sql(), tables.deliveries_sql()] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT 1 FROM {table} LIMIT 0"
            )))
            .execute(&pool)
            .await
            .map_err(database)?;
        }
        let dispatcher = Dispatcher::new(pool, dispatcher_config)?;
        let bridge =
            WebSubBridge::new(events, wake, public_url.clone(), template).recording_on(hub_runtime);
        match &config.events {
            Some(names) => {
                for name in names {
                    dispatcher.register_handler(name, bridge.clone())?;
                }
            }
            None => dispatcher.register_catch_all_handler(bridge)?,
        }
        let state = Arc::new(FeedState {
            dispatcher: dispatcher.clone(),
            webhooks_file: config.webhooks_file.clone(),
            seen: Mutex::new(None),
        });
        state.reload()?;
        info!(tables = %tables, channel = dispatcher.channel(), "outbox feed started");
        Ok(state)
    }
}

/// What a running feed's handle and its file watcher share.
#[derive(Debug)]
struct FeedState {
    dispatcher: Dispatcher,
    webhooks_file: Option<PathBuf>,
    /// The webhooks file's text as last read, applied or not: the watcher
    /// reloads only when it changes, so a broken file is reported once.
    seen: Mutex<Option<String>>,
}

impl FeedState {
    fn reload(&self) -> Result<(), FeedError> {
        let Some(path) = &self.webhooks_file else {
            return Ok(());
        };
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::File {
            path: path.display().to_string(),
            reason: error.to_string(),
        });
        if let Ok(text) = &text {
            *self
                .seen
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(text.clone());
        }
        let file = WebhooksFile::parse(&text?, path)?;
        self.dispatcher
            .reload_webhooks(|registrar| file.register(registrar))?;
        info!(path = %path.display(), webhooks = file.webhook.len(), "webhooks loaded");
        Ok(())
    }

    async fn watch(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(path) = self.webhooks_file.clone() else {
            return;
        };
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(WEBHOOKS_FILE_CHECK) => {}
            }
            // Unreadable (being replaced, say) counts as unchanged: the
            // webhooks in force stay until a readable file says otherwise.
            let Ok(text) = tokio::fs::read_to_string(&path).await else {
                continue;
            };
            let changed = self
                .seen
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .as_deref()
                != Some(text.as_str());
            if changed && let Err(error) = self.reload() {
                warn!(path = %path.display(), %error, "the webhooks file changed but was not applied; the previous webhooks stay");
            }
        }
    }
}

/// A running feed.
#[derive(Debug)]
pub struct FeedHandle {
    state: Arc<FeedState>,
    /// Resolved (or dropped, if its thread panicked) when the feed's thread
    /// is done.
    stopped: oneshot::Receiver<()>,
}

impl FeedHandle {
    /// Reads the webhooks file again and applies it (on SIGHUP, say). A
    /// file that cannot be read, parsed or registered changes nothing; the
    /// error says why.
    pub fn reload(&self) -> Result<(), FeedError> {
        let result = self.state.reload();
        if let Err(error) = &result {
            warn!(%error, "reloading the webhooks file failed; the previous webhooks stay");
        }
        result
    }

    /// The feed's dispatcher.
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.state.dispatcher
    }

    /// Waits until the feed has stopped (after its shutdown token is
    /// cancelled) and its in-flight deliveries are recorded.
    pub async fn stopped(self) {
        if self.stopped.await.is_err() {
            warn!("the outbox feed stopped abnormally");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(app: Option<&str>) -> Envelope {
        Envelope {
            event_id: uuid::Uuid::nil(),
            event_name: "auth-api.user.authenticated".to_owned(),
            app: app.map(str::to_owned),
            occurred_at: DateTime::UNIX_EPOCH,
            resource_type: "user profile".to_owned(),
            resource_id: "1".to_owned(),
            event_type: "authenticated".to_owned(),
            data: serde_json::Value::Null,
        }
    }

    fn hub() -> Url {
        Url::parse("https://hub.example/websub/").expect("url")
    }

    #[test]
    fn the_default_template_puts_topics_under_the_hub() {
        let template = TopicTemplate::parse(DEFAULT_TOPIC_TEMPLATE).expect("valid");
        assert_eq!(
            template.render(&hub(), &envelope(None)),
            "https://hub.example/websub/topics/auth-api.user.authenticated"
        );
        template.check(&hub()).expect("renders URLs");
    }

    #[test]
    fn placeholders_are_encoded_and_app_may_be_empty() {
        let template =
            TopicTemplate::parse("{public_url}{app}/{resource_type}/{event_type}?e={event_name}")
                .expect("valid");
        assert_eq!(
            template.render(&hub(), &envelope(Some("ush/ü"))),
            "https://hub.example/websub/ush%2F%C3%BC/user%20profile/authenticated?e=auth-api.user.authenticated"
        );
        assert_eq!(
            template.render(&hub(), &envelope(None)),
            "https://hub.example/websub//user%20profile/authenticated?e=auth-api.user.authenticated"
        );
    }

    #[test]
    fn bad_templates_are_refused() {
        for bad in ["{public_url}{nope}", "{public_url", "x}{event_name}"] {
            assert!(
                matches!(
                    TopicTemplate::parse(bad),
                    Err(ConfigError::Invalid {
                        setting: "topic-template",
                        ..
                    })
                ),
                "{bad}"
            );
        }
        let relative = TopicTemplate::parse("topics/{event_name}").expect("parses");
        assert!(relative.check(&hub()).is_err(), "not an absolute URL");
    }

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
        let cases: [(&str, Spoil); 9] = [
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

    #[test]
    fn webhooks_files_parse_and_register_by_event() {
        let path = Path::new("webhooks.toml");
        let file = WebhooksFile::parse(
            r#"
            [[webhook]]
            event = "e1"
            subscriber = "a"
            app = "ush"
            url = "http://a.example/events"

            [[webhook]]
            event = "e1"
            subscriber = "b"
            url = "http://b.example/events"

            [[webhook]]
            event = "e2"
            subscriber = "a"
            url = "http://a.example/other"
            "#,
            path,
        )
        .expect("parse");
        #[derive(Default)]
        struct Seen(BTreeMap<String, Vec<(String, Option<String>, String)>>);
        impl WebhookRegistrar for Seen {
            fn register_webhooks(
                &mut self,
                event_name: &str,
                subscribers: HashMap<String, WebhookSubscriber>,
            ) -> Result<(), RegistrationError> {
                let mut entries: Vec<_> = subscribers
                    .into_iter()
                    .map(|(name, subscriber)| (name, subscriber.app, subscriber.url.to_string()))
                    .collect();
                entries.sort();
                self.0.insert(event_name.to_owned(), entries);
                Ok(())
            }
        }
        let mut seen = Seen::default();
        file.register(&mut seen).expect("register");
        assert_eq!(
            seen.0["e1"],
            [
                (
                    "a".to_owned(),
                    Some("ush".to_owned()),
                    "http://a.example/events".to_owned()
                ),
                ("b".to_owned(), None, "http://b.example/events".to_owned()),
            ]
        );
        assert_eq!(seen.0["e2"].len(), 1);

        for bad in [
            "[[webhook]]\nevent = \"e\"\nsubscriber = \"a\"\nurl = \"not a url\"\n",
            "[[webhook]]\nevent = \"e\"\nsubscriber = \"a\"\nurl = \"http://x/\"\n\
             [[webhook]]\nevent = \"e\"\nsubscriber = \"a\"\nurl = \"http://y/\"\n",
            "[[webhook]]\nevent = \"e\"\nsubscriber = \"a\"\nurl = \"http://x/\"\nextra = 1\n",
            "[[hook]]\n",
        ] {
            assert!(
                matches!(
                    WebhooksFile::parse(bad, path),
                    Err(ConfigError::File { .. })
                ),
                "{bad}"
            );
        }
    }
}
