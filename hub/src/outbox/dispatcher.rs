//! The outbox dispatcher: expands events into one delivery row per
//! registered subscriber, claims due rows, hands each to its in-process
//! handler or POSTs it to its webhook, and records the outcome per row —
//! processed, or retried with backoff until the retry limit, keeping the
//! last error.
//!
//! It wakes on the producers' `NOTIFY` (a dedicated connection, see the
//! `listener` module) and polls every [`DispatcherConfig::poll_interval`]
//! whatever the listener's state. Several dispatchers — tasks, processes,
//! replicas — may share one pair of tables: claims use `FOR UPDATE SKIP
//! LOCKED` and never overlap, and expansion is idempotent. Expansion only
//! ever writes rows for this dispatcher's own subscribers, so services that
//! consume the same outbox under other subscriber names are independent.
//!
//! Delivery is at least once: a row is claimed before its attempt and
//! written back after it; a process killed in between leaves a claim that
//! becomes claimable again after [`DispatcherConfig::visibility_timeout`].
//! Attempts run concurrently, bounded overall and per subscriber, so one
//! slow or dead subscriber never holds up another.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use futures::FutureExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, debug_span, info, warn};
use url::Url;
use uuid::Uuid;

use super::envelope::{ENVELOPE_CONTENT_TYPE, Envelope};
use super::sql::{ClaimedRow, Completion, Outcome, Queries, Rooms, Subscriptions};
use super::{OutboxError, OutboxTables, check_channel, purge_expired};
use crate::setting::ConfigError;
use crate::delivery::attempt::{self, Answer, MESSAGING_SCHEME, Request};
use crate::delivery::client::{self, Purpose};
use crate::delivery::recorder::{self, Batching, OutcomeStore};
use crate::delivery::{Channel, Judge, RetryPolicy, Verdict, error_chain};
use crate::net::{NetError, NetPolicy};
use crate::future::or_never;
use crate::signature::{MESSAGING_EVENT_ID_HEADER, MESSAGING_SIGNATURE_HEADER};

/// Everything a dispatcher needs besides its pool. [`Default`] gives the
/// messaging contract's defaults; set what differs, then
/// [`Dispatcher::new`] validates it.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// The outbox and deliveries tables.
    pub tables: OutboxTables,
    /// The `NOTIFY` channel to listen on; `None` is
    /// [`OutboxTables::default_channel`], what [`super::Outbox`] notifies on
    /// by default.
    pub channel: Option<String>,
    /// The subscriber in-process handlers deliver as. Stored in every one of
    /// their delivery rows, so it must stay stable: a new name orphans the
    /// old rows and re-delivers every event inside `start_from`. Required to
    /// register a handler; a dispatcher that only sends webhooks needs none.
    pub subscriber_name: Option<String>,
    /// How far back expansion looks: events created before this get no new
    /// delivery rows, so a newly registered subscriber does not replay the
    /// whole history. Rows that exist are delivered whatever their age.
    /// `None` looks at every event.
    pub start_from: Option<DateTime<Utc>>,
    /// How often to expand and claim when nothing wakes the dispatcher.
    pub poll_interval: Duration,
    /// Retries after a failed first attempt and their backoff (10, the last
    /// after 10 s): a row whose retries are exhausted is never claimed again
    /// and keeps its `last_error`.
    pub retry: RetryPolicy,
    /// Listener reconnection failures over which the wait grows from zero to
    /// `listener_max_backoff` (10); past them it stays there, forever.
    pub listener_max_retries: u32,
    /// The longest wait between listener reconnection attempts (30 s).
    pub listener_max_backoff: Duration,
    /// How often the listener's connection is checked with a `NOTIFY` to
    /// itself (30 s): a connection that lost its peer without a word (a
    /// network partition) is found dead when the previous check has not come
    /// back by the time the next is due.
    pub listener_ping_interval: Duration,
    /// Time allowed for one webhook POST (by the default client) or one
    /// handler call (10 s).
    pub delivery_timeout: Duration,
    /// A claim older than this is taken to be from a dead process and its
    /// row becomes claimable again (60 s). Must exceed `delivery_timeout`.
    pub visibility_timeout: Duration,
    /// The secret webhook bodies are signed with
    /// ([`MESSAGING_SIGNATURE_HEADER`]); no signature without one.
    pub signing_secret: Option<String>,
    /// Headers sent with every webhook POST, e.g. an internal API key.
    pub webhook_headers: Vec<(String, String)>,
    /// Which addresses webhooks may be POSTed to: by default public ones
    /// only, as for WebSub callbacks. Webhooks of services on the same
    /// private network need `allow_private_network`.
    pub network: NetPolicy,
    /// Delete events older than this (and their delivery rows), every
    /// `retention_interval`, starting at start-up. `None` deletes nothing.
    pub retention: Option<Duration>,
    /// How often the retention sweep runs (an hour).
    pub retention_interval: Duration,
    /// Delivery rows claimed per round trip at most (100).
    pub batch_size: usize,
    /// Attempts in flight at once, over all subscribers (64).
    pub concurrency: usize,
    /// Attempts in flight at once to one subscriber (16), so that a slow one
    /// cannot take every slot. A subscriber's rows are claimed up to four
    /// times this many ahead (fewer when the visibility timeout leaves less
    /// than four delivery timeouts of patience), so that its next attempt is
    /// ready the moment one finishes.
    pub per_subscriber: usize,
    /// How far before the previous scan a polling scan starts looking (60 s):
    /// an event's `created_at` is its transaction's start, so one committed
    /// later than this after it began is found by the next full scan rather
    /// than the next poll (or at once, if it was notified).
    pub expand_lookback: Duration,
    /// How long any one statement the dispatcher runs may take (60 s)
    /// before it is abandoned, with its connection, and retried: a
    /// connection whose peer vanished without closing it would otherwise
    /// hold the dispatcher until the operating system gives up on it.
    pub query_timeout: Duration,
    /// How often expansion looks at every event since `start_from` rather
    /// than only recent ones (5 min). It also does at start-up, after the
    /// listener reconnects, and whenever registrations change.
    pub catch_up_interval: Duration,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            tables: OutboxTables::default(),
            channel: None,
            subscriber_name: None,
            start_from: None,
            poll_interval: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            listener_max_retries: 10,
            listener_max_backoff: Duration::from_secs(30),
            listener_ping_interval: Duration::from_secs(30),
            delivery_timeout: Duration::from_secs(10),
            visibility_timeout: Duration::from_secs(60),
            signing_secret: None,
            webhook_headers: Vec::new(),
            network: NetPolicy::default(),
            retention: None,
            retention_interval: Duration::from_secs(3600),
            batch_size: 100,
            concurrency: 64,
            per_subscriber: 16,
            expand_lookback: Duration::from_secs(60),
            query_timeout: Duration::from_secs(60),
            catch_up_interval: Duration::from_secs(300),
        }
    }
}

fn invalid(setting: &'static str, value: impl ToString, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        setting,
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl DispatcherConfig {
    /// The channel listened on.
    pub fn channel(&self) -> String {
        self.channel
            .clone()
            .unwrap_or_else(|| self.tables.default_channel())
    }

    /// Checks every setting; the first bad one is named in the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("poll-interval", self.poll_interval),
            ("delivery-timeout", self.delivery_timeout),
            ("listener-ping-interval", self.listener_ping_interval),
            ("retention-interval", self.retention_interval),
            ("catch-up-interval", self.catch_up_interval),
            ("query-timeout", self.query_timeout),
        ];
        for (setting, value) in positive {
            if value.is_zero() {
                return Err(invalid(setting, "0s", "must be more than zero"));
            }
        }
        if self.visibility_timeout <= self.delivery_timeout {
            return Err(invalid(
                "visibility-timeout",
                format!("{:?}", self.visibility_timeout),
                format!(
                    "must exceed the delivery timeout ({:?}), or claims of attempts still \
                     running would be taken over",
                    self.delivery_timeout
                ),
            ));
        }
        for (setting, value) in [
            ("batch-size", self.batch_size),
            ("concurrency", self.concurrency),
            (
                "per-subscriber",
                self.per_subscriber,
            ),
        ] {
            if value == 0 {
                return Err(invalid(setting, 0, "must be at least 1"));
            }
        }
        if let Some(channel) = &self.channel {
            check_channel(channel)
                .map_err(|error| invalid("notify-channel", channel, error.to_string()))?;
        }
        if let Some(name) = &self.subscriber_name
            && name.is_empty()
        {
            return Err(invalid("subscriber-name", "", "must not be empty"));
        }
        if let Some(secret) = &self.signing_secret
            && secret.is_empty()
        {
            return Err(invalid(
                "signing-secret",
                "",
                "must not be empty (leave it unset to send unsigned webhooks)",
            ));
        }
        static_headers(&self.webhook_headers)?;
        Ok(())
    }
}

/// The configured webhook headers, checked: valid names and values, and none
/// of the headers the contract itself sets.
fn static_headers(headers: &[(String, String)]) -> Result<HeaderMap, ConfigError> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid("webhook-header", name, "not a valid header name"))?;
        let reserved = [
            http::header::CONTENT_TYPE.as_str(),
            MESSAGING_SIGNATURE_HEADER,
            MESSAGING_EVENT_ID_HEADER,
        ];
        if reserved
            .iter()
            .any(|reserved| reserved.eq_ignore_ascii_case(name))
        {
            return Err(invalid(
                "webhook-header",
                name,
                "set by the dispatcher itself",
            ));
        }
        // The value is not echoed: headers like this often carry keys.
        let value = HeaderValue::from_str(value).map_err(|_| {
            invalid(
                "webhook-header",
                name,
                "the value is not a valid header value",
            )
        })?;
        map.append(header, value);
    }
    Ok(map)
}

/// A webhook subscriber of one event name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSubscriber {
    /// Which application's events it wants: those recorded for this app and
    /// those recorded for none, never another app's. `None` (or empty) takes
    /// everything.
    pub app: Option<String>,
    /// Where its deliveries are POSTed.
    pub url: Url,
}

/// Why an in-process handler failed; the delivery is retried.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// An in-process consumer of outbox events.
///
/// `Ok` marks the delivery processed; an error (or a panic, or running past
/// the delivery timeout) is retried with backoff like a failed webhook, with
/// the error's text kept in `last_error`. Delivery is at least once, so a
/// handler must tolerate seeing an event twice (de-duplicate on
/// [`Envelope::event_id`]).
///
/// Closures `Fn(Envelope) -> impl Future<Output = Result<(), HandlerError>>`
/// are handlers.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Handles one delivery.
    async fn handle(&self, envelope: &Envelope) -> Result<(), HandlerError>;
}

#[async_trait]
impl<F, Fut> Handler for F
where
    F: Fn(Envelope) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), HandlerError>> + Send,
{
    async fn handle(&self, envelope: &Envelope) -> Result<(), HandlerError> {
        self(envelope.clone()).await
    }
}

/// What webhook registration code is written against, so the same code runs
/// at start-up (against the [`Dispatcher`]) and on reload (against the
/// registrar [`Dispatcher::reload_webhooks`] hands it).
pub trait WebhookRegistrar {
    /// Registers `subscribers` (by name) for `event_name`, replacing any
    /// registration of the same subscriber for the same event name.
    fn register_webhooks(
        &mut self,
        event_name: &str,
        subscribers: HashMap<String, WebhookSubscriber>,
    ) -> Result<(), RegistrationError>;
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationError {
    /// In-process handlers deliver as the dispatcher's subscriber name, and
    /// none is configured.
    #[error("registering an in-process handler needs a subscriber name; configure one")]
    NoSubscriberName,
    /// An empty event name.
    #[error("the event name is empty")]
    EmptyEventName,
    /// An empty subscriber name.
    #[error("a webhook subscriber of {event_name:?} has an empty name")]
    EmptySubscriberName {
        /// The event name it was registered for.
        event_name: String,
    },
    /// A webhook subscriber named like the dispatcher's own subscriber: their
    /// delivery rows would be indistinguishable.
    #[error(
        "webhook subscriber {subscriber:?} has the name in-process handlers deliver as; pick another"
    )]
    ReservedSubscriber {
        /// The name.
        subscriber: String,
    },
    /// A webhook URL that is not http(s).
    #[error("webhook subscriber {subscriber:?} of {event_name:?}: {url} is not an http(s) URL")]
    InvalidUrl {
        /// The event name.
        event_name: String,
        /// The subscriber.
        subscriber: String,
        /// The URL given.
        url: String,
    },
    /// A webhook URL the network policy refuses (a private address while
    /// private networks are not allowed).
    #[error("webhook subscriber {subscriber:?} of {event_name:?}: {url}: {reason}")]
    RefusedUrl {
        /// The event name.
        event_name: String,
        /// The subscriber.
        subscriber: String,
        /// The URL given.
        url: String,
        /// Why the policy refuses it.
        reason: String,
    },
}

/// Why [`Dispatcher::reload_webhooks`] changed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError<E> {
    /// A registration the function made was refused (even if the function
    /// went on and returned `Ok`).
    #[error("a webhook registration was refused: {0}")]
    Registration(#[source] RegistrationError),
    /// The function itself failed.
    #[error("reloading webhooks failed: {0}")]
    Function(#[source] E),
}

/// Failures building a dispatcher.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatcherError {
    /// A setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The default HTTP client could not be built.
    #[error("the webhook HTTP client could not be built: {0}")]
    Client(#[source] NetError),
    /// The database failed.
    #[error("outbox database failed: {0}")]
    Database(#[from] sqlx::Error),
    /// A producer-side operation failed.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
}

/// Registered handlers and webhooks, as of one moment. Replaced whole on
/// every change, so a pass works on one consistent picture.
#[derive(Default)]
struct Registry {
    handlers: HashMap<String, Arc<dyn Handler>>,
    catch_all: Option<Arc<dyn Handler>>,
    webhooks: BTreeMap<String, HashMap<String, WebhookSubscriber>>,
    subscriptions: Subscriptions,
    /// Every subscriber in `subscriptions`, once each, sorted.
    names: Vec<String>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .field("catch_all", &self.catch_all.is_some())
            .field("webhooks", &self.webhooks)
            .finish()
    }
}

impl Registry {
    fn with_subscriptions(mut self, own: Option<&str>) -> Self {
        let mut subscriptions = Subscriptions::default();
        if let Some(own) = own {
            if self.catch_all.is_some() {
                subscriptions.every_event.push(own.to_owned());
            } else {
                for event_name in self.handlers.keys() {
                    subscriptions.subscribers.push(own.to_owned());
                    subscriptions.apps.push(None);
                    subscriptions.event_names.push(event_name.clone());
                }
            }
        }
        for (event_name, subscribers) in &self.webhooks {
            for (name, subscriber) in subscribers {
                subscriptions.subscribers.push(name.clone());
                subscriptions.apps.push(subscriber.app.clone());
                subscriptions.event_names.push(event_name.clone());
            }
        }
        self.names = subscriptions.names();
        self.subscriptions = subscriptions;
        self
    }

    fn copy(&self) -> Self {
        Self {
            handlers: self.handlers.clone(),
            catch_all: self.catch_all.clone(),
            webhooks: self.webhooks.clone(),
            subscriptions: Subscriptions::default(),
            names: Vec::new(),
        }
    }
}

/// Validates one webhook registration into `webhooks`.
fn add_webhooks(
    webhooks: &mut BTreeMap<String, HashMap<String, WebhookSubscriber>>,
    own: Option<&str>,
    network: &NetPolicy,
    event_name: &str,
    subscribers: HashMap<String, WebhookSubscriber>,
) -> Result<(), RegistrationError> {
    if event_name.is_empty() {
        return Err(RegistrationError::EmptyEventName);
    }
    let mut checked = Vec::with_capacity(subscribers.len());
    for (name, mut subscriber) in subscribers {
        if name.is_empty() {
            return Err(RegistrationError::EmptySubscriberName {
                event_name: event_name.to_owned(),
            });
        }
        if Some(name.as_str()) == own {
            return Err(RegistrationError::ReservedSubscriber { subscriber: name });
        }
        if !matches!(subscriber.url.scheme(), "http" | "https") {
            return Err(RegistrationError::InvalidUrl {
                event_name: event_name.to_owned(),
                url: subscriber.url.to_string(),
                subscriber: name,
            });
        }
        // Names are checked again by the client's resolver at connect time.
        if let Err(refused) = network.check_literal(&subscriber.url) {
            return Err(RegistrationError::RefusedUrl {
                event_name: event_name.to_owned(),
                url: subscriber.url.to_string(),
                subscriber: name,
                reason: refused.to_string(),
            });
        }
        if subscriber.app.as_deref() == Some("") {
            subscriber.app = None;
        }
        checked.push((name, subscriber));
    }
    webhooks
        .entry(event_name.to_owned())
        .or_default()
        .extend(checked);
    Ok(())
}

/// The registrar a reload's function registers into: it collects, and
/// remembers the first refusal even if the function carries on.
struct Collector<'a> {
    own: Option<&'a str>,
    network: &'a NetPolicy,
    webhooks: BTreeMap<String, HashMap<String, WebhookSubscriber>>,
    refused: Option<RegistrationError>,
}

impl WebhookRegistrar for Collector<'_> {
    fn register_webhooks(
        &mut self,
        event_name: &str,
        subscribers: HashMap<String, WebhookSubscriber>,
    ) -> Result<(), RegistrationError> {
        let result = add_webhooks(
            &mut self.webhooks,
            self.own,
            self.network,
            event_name,
            subscribers,
        );
        if let Err(error) = &result
            && self.refused.is_none()
        {
            self.refused = Some(error.clone());
        }
        result
    }
}

/// What the next pass must look at, gathered from wake-ups until it runs.
#[derive(Debug, Default)]
struct Pending {
    /// Events announced by `NOTIFY`.
    ids: Vec<Uuid>,
    scan: Scan,
    /// Whether rows may be due that no expansion hands over claimed:
    /// unclaimed ones written by a scan, retries, stale claims, rows other
    /// dispatchers left.
    claim: bool,
}

/// How a scan ended.
#[derive(Debug)]
struct ScanResult {
    scan: Scan,
    since: NaiveDateTime,
    /// Rows written, and the database time the scan ran at.
    outcome: Result<(u64, NaiveDateTime), sqlx::Error>,
}

/// What an expansion of notified events did.
#[derive(Debug)]
struct Expanded {
    /// Every statement succeeded.
    succeeded: bool,
    /// It may have written rows it did not claim.
    left_unclaimed: bool,
}

/// The rows this dispatcher holds claimed.
#[derive(Debug, Default)]
struct Lanes {
    by_subscriber: HashMap<String, Lane>,
    /// In all.
    held: usize,
}

/// The rows one subscriber holds claimed in this dispatcher.
#[derive(Debug)]
struct Lane {
    /// Claimed and not done: attempting, or waiting for a turn.
    held: usize,
    /// One permit per attempt the subscriber may have in flight.
    turns: Arc<Semaphore>,
}

/// How much of the outbox a pass expands, least to most.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scan {
    #[default]
    None,
    /// Events since the previous scan, less the lookback.
    Recent,
    /// Every event since `start_from`.
    Full,
}

/// Where expansion stands between passes.
#[derive(Debug)]
struct Expansion {
    /// The configured cutoff, or the beginning of time.
    start_from: NaiveDateTime,
    /// The database time the last successful scan ran at.
    watermark: Option<NaiveDateTime>,
    /// When the last scan of everything since `start_from` ran.
    last_full_scan: Instant,
}

impl Expansion {
    fn new(start_from: Option<DateTime<Utc>>) -> Self {
        Self {
            start_from: start_from.map_or_else(beginning_of_time, |at| at.naive_utc()),
            watermark: None,
            last_full_scan: Instant::now(),
        }
    }

    /// The oldest `created_at` a scan looks at: for a recent scan, the
    /// previous scan's time less `lookback`; for a full one (or a recent one
    /// with no previous scan), `start_from`; never before `start_from`.
    fn since(&self, scan: Scan, lookback: Duration) -> Option<NaiveDateTime> {
        match (scan, self.watermark) {
            (Scan::None, _) => None,
            (Scan::Recent, Some(mark)) => {
                let lookback =
                    chrono::Duration::from_std(lookback).unwrap_or(chrono::Duration::MAX);
                Some(
                    mark.checked_sub_signed(lookback)
                        .map_or(self.start_from, |since| since.max(self.start_from)),
                )
            }
            (Scan::Recent, None) | (Scan::Full, _) => Some(self.start_from),
        }
    }

    /// A scan from `since` succeeded at database time `at`.
    fn scanned(&mut self, since: NaiveDateTime, at: NaiveDateTime) {
        self.watermark = Some(at);
        if since == self.start_from {
            self.last_full_scan = Instant::now();
        }
    }
}

/// How a claim round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claimed {
    /// Everything due was claimed.
    Idle,
    /// Rows may be waiting for a slot (all slots busy, or a subscriber at
    /// its limit): claim again when one frees.
    WaitingForRoom,
    /// The claim failed.
    Failed,
}

impl Claimed {
    /// Folds this round's end into the run loop's state.
    fn record(self, waiting_for_room: &mut bool, failed: &mut bool) {
        match self {
            Self::Idle => *waiting_for_room = false,
            Self::WaitingForRoom => *waiting_for_room = true,
            Self::Failed => *failed = true,
        }
    }
}

/// How soon a pass runs again after a statement failed (or the poll
/// interval, if shorter).
const ERROR_RETRY: Duration = Duration::from_secs(1);

/// Event ids gathered from notifications before a pass falls back to a
/// recent scan instead (one statement either way).
const MAX_NOTIFIED_IDS: usize = 10_000;

/// The dispatcher. Cheap to clone; clones share registrations and state,
/// so one clone can [`run`](Self::run) while others register.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    config: DispatcherConfig,
    channel: String,
    queries: Queries,
    client: RwLock<reqwest::Client>,
    headers: HeaderMap,
    handlers: Judge,
    webhooks: Judge,
    registry: RwLock<Arc<Registry>>,
    pending: Mutex<Pending>,
    /// Signalled when there is work: a notification, a registration, a
    /// retry falling due, [`Dispatcher::wake`].
    wake: Notify,
    /// Signalled when an attempt finishes and frees a slot.
    room: Notify,
    slots: Arc<Semaphore>,
    lanes: Mutex<Lanes>,
    /// How many rows one subscriber may hold claimed: its concurrency times
    /// [`waves`].
    hold: usize,
    /// How many rows the dispatcher may hold claimed in all: its concurrency
    /// times [`waves`].
    hold_overall: usize,
    listening: AtomicBool,
}

impl Dispatcher {
    /// A dispatcher on `pool` (the producer's database), after validating
    /// `config`. It does nothing until [`run`](Self::run), which is meant to
    /// run once per dispatcher.
    ///
    /// The pool's sessions should use READ COMMITTED (PostgreSQL's
    /// default): a claim that meets a row another dispatcher has just
    /// claimed then skips it, where a stricter level fails the statement
    /// (retried, but noisy). The listener opens one connection of its own
    /// with the pool's connect options.
    pub fn new(pool: PgPool, config: DispatcherConfig) -> Result<Self, DispatcherError> {
        config.validate()?;
        let client = client::build(
            Purpose::Deliveries {
                policy: config.network.clone(),
                max_idle_per_host: config.per_subscriber,
            },
            config.delivery_timeout,
        )
        .map_err(DispatcherError::Client)?;
        let headers = static_headers(&config.webhook_headers)?;
        let waves = waves(&config);
        let hold = config.per_subscriber.saturating_mul(waves);
        let hold_overall = config.concurrency.saturating_mul(waves);
        let handlers = Judge::new(Channel::Handler, config.retry);
        let webhooks = Judge::new(Channel::Webhook, config.retry);
        Ok(Self {
            inner: Arc::new(Inner {
                channel: config.channel(),
                queries: Queries::new(&config.tables, config.query_timeout),
                slots: Arc::new(Semaphore::new(config.concurrency)),
                pool,
                config,
                client: RwLock::new(client),
                headers,
                handlers,
                webhooks,
                registry: RwLock::new(Arc::new(Registry::default())),
                pending: Mutex::new(Pending::default()),
                wake: Notify::new(),
                room: Notify::new(),
                lanes: Mutex::new(Lanes::default()),
                hold,
                hold_overall,
                listening: AtomicBool::new(false),
            }),
        })
    }

    /// Replaces the webhook HTTP client (its own transport, timeout or
    /// instrumentation). Whatever the client, an attempt is abandoned three
    /// quarters of the visibility timeout after its row was claimed, so that
    /// its claim never goes stale while it runs.
    pub fn with_http_client(self, client: reqwest::Client) -> Self {
        *self
            .inner
            .client
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = client;
        self
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &DispatcherConfig {
        &self.inner.config
    }

    /// The pool it runs on.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The `NOTIFY` channel it listens on.
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// Whether the listener is connected and listening right now (for health
    /// checks; delivery goes on by polling when it is not).
    pub fn is_listening(&self) -> bool {
        self.inner.listening.load(Ordering::Relaxed)
    }

    /// Registers the in-process handler of `event_name`, replacing any
    /// previous one. Deliveries are recorded under
    /// [`DispatcherConfig::subscriber_name`], which must be set. Safe while
    /// running; reloads never touch handlers.
    pub fn register_handler<H: Handler + 'static>(
        &self,
        event_name: &str,
        handler: H,
    ) -> Result<(), RegistrationError> {
        self.own_name()?;
        if event_name.is_empty() {
            return Err(RegistrationError::EmptyEventName);
        }
        self.update(|registry| {
            registry
                .handlers
                .insert(event_name.to_owned(), Arc::new(handler));
        });
        Ok(())
    }

    /// Registers a handler for every event name, under the dispatcher's
    /// subscriber name (which must be set). An extension of the messaging
    /// contract, for consumers that forward everything (the WebSub bridge).
    /// A handler registered for a specific event name takes precedence for
    /// that name; there is still one delivery row per event.
    pub fn register_catch_all_handler<H: Handler + 'static>(
        &self,
        handler: H,
    ) -> Result<(), RegistrationError> {
        self.own_name()?;
        self.update(|registry| registry.catch_all = Some(Arc::new(handler)));
        Ok(())
    }

    /// Registers webhook `subscribers` (keyed by subscriber name: what their
    /// rows are recorded under; it never leaves this process) for
    /// `event_name`. A subscriber already registered for the event name is
    /// replaced. Safe while running.
    pub fn register_webhooks(
        &self,
        event_name: &str,
        subscribers: HashMap<String, WebhookSubscriber>,
    ) -> Result<(), RegistrationError> {
        let own = self.inner.config.subscriber_name.as_deref();
        let mut added = BTreeMap::new();
        add_webhooks(
            &mut added,
            own,
            &self.inner.config.network,
            event_name,
            subscribers,
        )?;
        self.update(|registry| {
            for (event, subscribers) in added {
                registry
                    .webhooks
                    .entry(event)
                    .or_default()
                    .extend(subscribers);
            }
        });
        Ok(())
    }

    /// Replaces every registered webhook with what `register` registers, all
    /// at once; handlers are untouched.
    ///
    /// - A subscriber no longer registered stops being expanded and claimed;
    ///   its rows stay, and resume if it is registered again.
    /// - A new subscriber is expanded as at start-up, within `start_from`.
    /// - A changed URL applies from the subscriber's next attempt.
    /// - If `register` fails, or any registration it made was refused (even
    ///   one it went past), nothing changes.
    ///
    /// The change applies from the next pass; a pass already running
    /// finishes with the registrations it began with.
    pub fn reload_webhooks<F, E>(&self, register: F) -> Result<(), ReloadError<E>>
    where
        F: FnOnce(&mut dyn WebhookRegistrar) -> Result<(), E>,
    {
        let mut collector = Collector {
            own: self.inner.config.subscriber_name.as_deref(),
            network: &self.inner.config.network,
            webhooks: BTreeMap::new(),
            refused: None,
        };
        register(&mut collector).map_err(ReloadError::Function)?;
        if let Some(refused) = collector.refused {
            return Err(ReloadError::Registration(refused));
        }
        let webhooks = collector.webhooks;
        self.update(move |registry| registry.webhooks = webhooks);
        Ok(())
    }

    /// Runs a pass now rather than at the next poll: expand recent events,
    /// then claim and deliver.
    pub fn wake(&self) {
        self.request(Scan::Recent);
    }

    fn own_name(&self) -> Result<&str, RegistrationError> {
        self.inner
            .config
            .subscriber_name
            .as_deref()
            .ok_or(RegistrationError::NoSubscriberName)
    }

    fn registry(&self) -> Arc<Registry> {
        self.inner
            .registry
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Applies `change` to a copy of the registry and publishes it, then has
    /// the next pass look at every event (new subscribers are expanded as
    /// at start-up).
    fn update(&self, change: impl FnOnce(&mut Registry)) {
        {
            let mut current = self
                .inner
                .registry
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut next = current.copy();
            change(&mut next);
            *current =
                Arc::new(next.with_subscriptions(self.inner.config.subscriber_name.as_deref()));
        }
        self.request(Scan::Full);
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.inner
            .pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn request(&self, scan: Scan) {
        {
            let mut pending = self.pending();
            pending.scan = pending.scan.max(scan);
            pending.claim = true;
        }
        self.inner.wake.notify_one();
    }

    /// A notification arrived on the channel: its payload names the event
    /// when it came from [`super::Outbox`]; anything else asks for a scan.
    pub(crate) fn notified(&self, payload: &str) {
        {
            let mut pending = self.pending();
            match Uuid::try_parse(payload) {
                Ok(id) if pending.ids.len() < MAX_NOTIFIED_IDS => pending.ids.push(id),
                _ => pending.scan = pending.scan.max(Scan::Recent),
            }
        }
        self.inner.wake.notify_one();
    }

    /// Whether the next pass has nothing to do but expand notified events,
    /// and not so many that they should go at once.
    fn only_notified(&self) -> bool {
        let pending = self.pending();
        pending.scan == Scan::None && !pending.claim && pending.ids.len() < PASS_GATHERING_LIMIT
    }

    /// The listener connected (again): notifications may have been missed.
    pub(crate) fn listener_connected(&self, connected: bool) {
        self.inner.listening.store(connected, Ordering::Relaxed);
        if connected {
            self.request(Scan::Full);
        }
    }

    /// Runs until `shutdown` is cancelled, then lets the attempts in flight
    /// finish (rows still waiting for their turn are handed back) and
    /// records their outcomes before returning.
    pub async fn run(self, shutdown: CancellationToken) {
        let config = &self.inner.config;
        let background = TaskTracker::new();
        background.spawn(super::listener::listen(self.clone(), shutdown.clone()));
        background.spawn(self.clone().advise_on_scan_index());
        if let Some(ttl) = config.retention {
            background.spawn(self.clone().sweep(ttl, shutdown.clone()));
        }
        let attempts = TaskTracker::new();
        let (completed, completions) = mpsc::unbounded_channel();
        let recorder = tokio::spawn(recorder::record(
            RowOutcomes(self.clone()),
            completions,
            batching(config),
        ));

        let mut expansion = Expansion::new(config.start_from);
        let mut next_poll = Instant::now() + config.poll_interval;
        self.request(Scan::Full);
        let retry_after_error = config.poll_interval.min(ERROR_RETRY);
        let mut waiting_for_room = false;
        let mut last_pass = Instant::now();
        // A scan reads every recent event, which takes a while on a busy
        // outbox: it runs beside the passes, so that notified events are not
        // held up behind it. One at a time; what is asked for meanwhile
        // waits in `scan_wanted`.
        let mut scan_wanted = Scan::None;
        let mut scanning: Option<tokio::task::JoinHandle<ScanResult>> = None;
        // After a failed scan, when the next may start.
        let mut scan_retry: Option<Instant> = None;
        while !shutdown.is_cancelled() {
            // Under a stream of notifications, passes are spaced so that
            // each expands several events in its one statement rather than
            // one each; an event arriving after a quiet spell goes at once.
            let spaced = last_pass + PASS_SPACING;
            if Instant::now() < spaced && self.only_notified() {
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep_until(spaced) => {}
                }
            }
            last_pass = Instant::now();
            let work = std::mem::take(&mut *self.pending());
            let registry = self.registry();
            // Whether a statement failed in this pass: the next pass comes
            // soon rather than at the next poll.
            let mut failed = false;
            if !registry.subscriptions.is_empty() {
                scan_wanted = scan_wanted.max(work.scan);
                if expansion.last_full_scan.elapsed() >= config.catch_up_interval {
                    scan_wanted = Scan::Full;
                }
                if scanning.is_none()
                    && scan_retry.is_none()
                    && let Some(since) = expansion.since(scan_wanted, config.expand_lookback)
                {
                    scanning = Some(tokio::spawn(self.clone().scan(
                        registry.clone(),
                        std::mem::take(&mut scan_wanted),
                        since,
                    )));
                }
                // Notified events come back claimed; a claim runs only when
                // something else may be due.
                let mut claim = work.claim;
                // Rows an expansion left unclaimed for want of room are due
                // before any event notified since: while there are some,
                // each pass claims first (no statement while there is no
                // room), and newer events take what room is left. Otherwise
                // newer events would take every slot that frees, and the
                // older rows wait for the next poll.
                if waiting_for_room {
                    self.claim_and_start(&registry, &attempts, &completed, &shutdown)
                        .await
                        .record(&mut waiting_for_room, &mut failed);
                    claim = false;
                }
                if !work.ids.is_empty() {
                    let expanded = self
                        .expand_notified(
                            &work.ids, &registry, &expansion, &attempts, &completed, &shutdown,
                        )
                        .await;
                    failed = !expanded.succeeded;
                    claim |= expanded.left_unclaimed;
                }
                if claim {
                    self.claim_and_start(&registry, &attempts, &completed, &shutdown)
                        .await
                        .record(&mut waiting_for_room, &mut failed);
                }
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = self.inner.wake.notified() => {}
                scanned = or_never(scanning.as_mut()), if scanning.is_some() => {
                    scanning = None;
                    match scanned {
                        Ok(ScanResult { scan, since, outcome: Ok((written, scanned_at)) }) => {
                            debug!(written, ?scan, "expanded");
                            expansion.scanned(since, scanned_at);
                            // Rows a scan writes are unclaimed.
                            self.pending().claim |= written > 0;
                        }
                        Ok(ScanResult { scan, outcome: Err(error), .. }) => {
                            warn!(%error, "expanding outbox events failed; retrying shortly");
                            scan_wanted = scan_wanted.max(scan);
                            scan_retry = Some(Instant::now() + retry_after_error);
                        }
                        Err(error) => {
                            warn!(%error, "an outbox expansion scan stopped abnormally");
                            scan_wanted = scan_wanted.max(Scan::Full);
                            scan_retry = Some(Instant::now() + retry_after_error);
                        }
                    }
                }
                () = self.inner.room.notified(), if waiting_for_room => {
                    self.pending().claim = true;
                }
                () = or_never(scan_retry.map(tokio::time::sleep_until)), if scan_retry.is_some() => {
                    scan_retry = None;
                }
                () = tokio::time::sleep(retry_after_error), if failed => {
                    let mut pending = self.pending();
                    pending.scan = pending.scan.max(Scan::Recent);
                    pending.claim = true;
                }
                () = tokio::time::sleep_until(next_poll) => {
                    next_poll = Instant::now() + config.poll_interval;
                    let mut pending = self.pending();
                    pending.scan = pending.scan.max(Scan::Recent);
                    pending.claim = true;
                }
            }
        }
        if let Some(scan) = scanning {
            scan.abort();
        }
        attempts.close();
        attempts.wait().await;
        drop(completed);
        if let Err(error) = recorder.await {
            warn!(%error, "the outbox outcome recorder stopped abnormally");
        }
        background.close();
        background.wait().await;
    }

    /// Writes the missing delivery rows of the events created since
    /// `since`, unclaimed.
    async fn scan(self, registry: Arc<Registry>, scan: Scan, since: NaiveDateTime) -> ScanResult {
        // While the listener is up, the newest events are left to their
        // notifications; the next scan looks at them, the lookback covering
        // the gap.
        let config = &self.inner.config;
        let spare = if self.is_listening() {
            config.poll_interval.min(config.expand_lookback / 4)
        } else {
            Duration::ZERO
        };
        let outcome = self
            .inner
            .queries
            .expand(&self.inner.pool, &registry.subscriptions, since, spare)
            .await;
        ScanResult {
            scan,
            since,
            outcome,
        }
    }

    /// Expands notified events: their rows come back claimed, as many as
    /// the subscribers have room for, and their attempts start at once.
    /// What failed is scanned for shortly.
    async fn expand_notified(
        &self,
        ids: &[Uuid],
        registry: &Registry,
        expansion: &Expansion,
        attempts: &TaskTracker,
        completed: &mpsc::UnboundedSender<Completion>,
        shutdown: &CancellationToken,
    ) -> Expanded {
        let (rooms, _) = self.rooms(registry);
        match self
            .inner
            .queries
            .expand_and_claim(
                &self.inner.pool,
                &registry.subscriptions,
                expansion.start_from,
                ids,
                &rooms,
            )
            .await
        {
            Ok((claimed, unclaimed)) => {
                self.start(claimed, attempts, completed, shutdown);
                Expanded {
                    succeeded: true,
                    left_unclaimed: unclaimed > 0,
                }
            }
            Err(error) => {
                warn!(%error, "expanding notified events failed; retrying shortly");
                // The events go round again with the next pass: a scan
                // would leave the newest of them to their notifications,
                // which are spent, and find them only a poll or more later.
                let mut pending = self.pending();
                let room = MAX_NOTIFIED_IDS.saturating_sub(pending.ids.len());
                let again = &ids[..ids.len().min(room)];
                pending.ids.splice(0..0, again.iter().copied());
                if again.len() < ids.len() {
                    pending.scan = pending.scan.max(Scan::Recent);
                }
                Expanded {
                    succeeded: false,
                    left_unclaimed: false,
                }
            }
        }
    }

    /// Claims due rows, each subscriber up to its room, and starts an
    /// attempt per row.
    async fn claim_and_start(
        &self,
        registry: &Arc<Registry>,
        attempts: &TaskTracker,
        completed: &mpsc::UnboundedSender<Completion>,
        shutdown: &CancellationToken,
    ) -> Claimed {
        let config = &self.inner.config;
        loop {
            // While rows keep coming, this loop alone claims them; shutdown
            // must still be noticed between claims.
            if shutdown.is_cancelled() {
                return Claimed::Idle;
            }
            let (rooms, saturated) = self.rooms(registry);
            if rooms.total == 0 {
                return if saturated {
                    Claimed::WaitingForRoom
                } else {
                    Claimed::Idle
                };
            }
            let asked = rooms.total.min(config.batch_size);
            let claimed = match self
                .inner
                .queries
                .claim(
                    &self.inner.pool,
                    &registry.subscriptions,
                    config.retry.max_retries,
                    config.visibility_timeout,
                    &rooms,
                    asked,
                )
                .await
            {
                Ok(claimed) => claimed,
                Err(error) => {
                    warn!(%error, "claiming outbox deliveries failed; retrying shortly");
                    return Claimed::Failed;
                }
            };
            let more = claimed.len() == asked;
            self.start(claimed, attempts, completed, shutdown);
            // A subscriber given its whole room may have more due: it is
            // claimed for again once enough of its rows are done.
            let (_, saturated) = self.rooms(registry);
            if saturated {
                return Claimed::WaitingForRoom;
            }
            if !more {
                return Claimed::Idle;
            }
        }
    }

    /// What each registered subscriber may still be given and in all,
    /// and whether any subscriber, or the dispatcher as a whole, has no
    /// room left.
    fn rooms(&self, registry: &Registry) -> (Rooms, bool) {
        let hold = self.inner.hold;
        let lanes = self.lanes();
        let overall = self.inner.hold_overall.saturating_sub(lanes.held);
        let default = hold.min(overall);
        let names = &registry.names;
        let mut rooms = Rooms {
            default: i64::try_from(default).unwrap_or(i64::MAX),
            ..Rooms::default()
        };
        let mut saturated = overall == 0;
        let mut listed = 0;
        let mut total = 0usize;
        for (name, lane) in &lanes.by_subscriber {
            if names.binary_search(name).is_err() {
                continue;
            }
            let room = hold.saturating_sub(lane.held).min(overall);
            saturated |= room == 0;
            listed += 1;
            total = total.saturating_add(room);
            rooms.subscribers.push(name.clone());
            rooms.rows.push(i64::try_from(room).unwrap_or(i64::MAX));
        }
        total = total.saturating_add(default.saturating_mul(names.len() - listed));
        rooms.total = total.min(overall);
        (rooms, saturated)
    }

    /// Starts a task per claimed row: it waits for its subscriber's turn and
    /// a slot, then attempts. A row whose turn has not come by three
    /// quarters of the visibility timeout (or by shutdown) is handed back
    /// uncounted, so that its claim never goes stale while it waits.
    fn start(
        &self,
        claimed: Vec<ClaimedRow>,
        attempts: &TaskTracker,
        completed: &mpsc::UnboundedSender<Completion>,
        shutdown: &CancellationToken,
    ) {
        let deadline = Instant::now() + patience(&self.inner.config);
        let mut envelopes: HashMap<Uuid, Arc<Prepared>> = HashMap::new();
        for row in claimed {
            let turns = self.hold(&row.subscriber);
            let prepared = envelopes
                .entry(row.event_id)
                .or_insert_with(|| Arc::new(Prepared::new(&row)))
                .clone();
            let dispatcher = self.clone();
            let completed = completed.clone();
            let shutdown = shutdown.clone();
            let span = debug_span!(
                "outbox_deliver",
                event = %row.event_id,
                event_name = %row.event_name,
                subscriber = %row.subscriber,
            );
            attempts.spawn(
                async move {
                    let outcome = dispatcher
                        .in_turn(&row, &prepared, turns, deadline, &shutdown)
                        .await;
                    let _ = completed.send(completion(&row, outcome));
                    dispatcher.finished(&row.subscriber);
                }
                .instrument(span),
            );
        }
    }

    async fn in_turn(
        &self,
        row: &ClaimedRow,
        prepared: &Prepared,
        turns: Arc<Semaphore>,
        deadline: Instant,
        shutdown: &CancellationToken,
    ) -> Outcome {
        let turn = async {
            let own = turns.acquire_owned().await.ok()?;
            let slot = self.inner.slots.clone().acquire_owned().await.ok()?;
            Some((own, slot))
        };
        let permits = tokio::select! {
            biased;
            () = shutdown.cancelled() => None,
            permits = tokio::time::timeout_at(deadline, turn) => permits.ok().flatten(),
        };
        match permits {
            Some(_permits) => self.attempt(row, prepared, deadline).await,
            None => Outcome::Released,
        }
    }

    fn lanes(&self) -> std::sync::MutexGuard<'_, Lanes> {
        self.inner
            .lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts one more row held for `subscriber`; returns its turns.
    fn hold(&self, subscriber: &str) -> Arc<Semaphore> {
        let mut lanes = self.lanes();
        lanes.held += 1;
        let lane = lanes
            .by_subscriber
            .entry(subscriber.to_owned())
            .or_insert_with(|| Lane {
                held: 0,
                turns: Arc::new(Semaphore::new(self.inner.config.per_subscriber)),
            });
        lane.held += 1;
        lane.turns.clone()
    }

    /// One row of `subscriber` is done. Once half the room of the
    /// subscriber, or of the dispatcher, is free, the run loop may claim
    /// again: refilling in halves rather than one row at a time keeps claims
    /// few, and what is still held covers the attempts in the meantime.
    fn finished(&self, subscriber: &str) {
        let refill_at = |hold: usize| hold - (hold / 2).max(1);
        let mut lanes = self.lanes();
        lanes.held = lanes.held.saturating_sub(1);
        let mut refill = lanes.held == refill_at(self.inner.hold_overall);
        if let Some(lane) = lanes.by_subscriber.get_mut(subscriber) {
            lane.held = lane.held.saturating_sub(1);
            refill |= lane.held == refill_at(self.inner.hold);
            if lane.held == 0 {
                lanes.by_subscriber.remove(subscriber);
            }
        }
        drop(lanes);
        if refill {
            self.inner.room.notify_one();
        }
    }

    /// One attempt: the handler or webhook registered now for the row's
    /// (subscriber, event name), and what its answer means for the row. It
    /// is abandoned at `deadline`, before its claim could go stale.
    async fn attempt(&self, row: &ClaimedRow, prepared: &Prepared, deadline: Instant) -> Outcome {
        let inner = &self.inner;
        let registry = self.registry();
        let failures_before = u32::try_from(row.retry_count).unwrap_or(0);
        let verdict = if inner.config.subscriber_name.as_deref() == Some(row.subscriber.as_str()) {
            let handler = registry
                .handlers
                .get(&row.event_name)
                .or(registry.catch_all.as_ref());
            let Some(handler) = handler else {
                return Outcome::Released;
            };
            let answer = self
                .call(handler.as_ref(), &prepared.envelope, deadline)
                .await;
            inner.handlers.verdict(answer.into(), failures_before)
        } else {
            let subscriber = registry
                .webhooks
                .get(&row.event_name)
                .and_then(|subscribers| subscribers.get(&row.subscriber));
            // Unregistered since the claim: its rows wait, untouched, for it
            // to come back.
            let Some(subscriber) = subscriber else {
                return Outcome::Released;
            };
            let answer = self.post(subscriber, prepared, deadline).await;
            inner.webhooks.verdict(answer, failures_before)
        };
        match verdict {
            // Only a WebSub channel judges a 410 gone.
            Verdict::Delivered | Verdict::Gone => Outcome::Delivered,
            Verdict::Retry { error, wait } => Outcome::Retry { error, wait },
            Verdict::Exhausted { error } => Outcome::Exhausted { error },
        }
    }

    async fn call(
        &self,
        handler: &dyn Handler,
        envelope: &Envelope,
        deadline: Instant,
    ) -> Result<(), String> {
        let timeout = self
            .inner
            .config
            .delivery_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        let call = std::panic::AssertUnwindSafe(handler.handle(envelope)).catch_unwind();
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(error))) => Err(format!("handler failed: {}", error_chain(&*error))),
            Ok(Err(_)) => Err("handler panicked".to_owned()),
            Err(_) => Err(format!("handler timed out after {timeout:?}")),
        }
    }

    /// One webhook POST: the envelope, its signature when a secret is
    /// configured, the event id, and the configured headers.
    async fn post(
        &self,
        subscriber: &WebhookSubscriber,
        prepared: &Prepared,
        deadline: Instant,
    ) -> Answer {
        let client = self
            .inner
            .client
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let request = Request {
            url: subscriber.url.as_str(),
            scheme: &MESSAGING_SCHEME,
            content_type: HeaderValue::from_static(ENVELOPE_CONTENT_TYPE),
            event_id: prepared.event_id.clone(),
            body: prepared.body.clone(),
            secret: self.inner.config.signing_secret.as_deref().map(str::as_bytes),
            headers: Some(&self.inner.headers),
        };
        attempt::post(
            &client,
            request,
            self.inner.config.delivery_timeout,
            Some(deadline),
        )
        .await
    }

    /// Says once, at start-up, whether polling scans can read only their
    /// window: without an index on `created_at` each reads the whole outbox.
    /// A warning once the table is large enough for that to cost.
    async fn advise_on_scan_index(self) {
        let config = &self.inner.config;
        let tables = &config.tables;
        let outbox = &tables.outbox.text;
        let found = super::sql::scan_index(&self.inner.pool, tables);
        match super::sql::bounded(config.query_timeout, found).await {
            Ok((true, _)) => {
                debug!(%outbox, "polling scans read the outbox by its created_at index")
            }
            Ok((false, rows)) if rows >= LARGE_OUTBOX => warn!(
                %outbox,
                rows,
                "the outbox has no index on created_at, so every poll reads the whole table; \
                 `websub outbox-ddl --scan-index` prints one"
            ),
            Ok((false, _)) => info!(
                %outbox,
                "the outbox has no index on created_at, so every poll reads the whole table \
                 (cheap while it is small); `websub outbox-ddl --scan-index` prints one"
            ),
            Err(error) => debug!(%outbox, %error, "could not look for a created_at index"),
        }
    }

    /// The retention sweep: at start-up, then every `retention_interval`.
    async fn sweep(self, ttl: Duration, shutdown: CancellationToken) {
        let tables = &self.inner.config.tables;
        loop {
            let purge = purge_expired(&self.inner.pool, tables, ttl);
            match tokio::time::timeout(self.inner.config.query_timeout, purge).await {
                Err(_) => warn!("retention sweep timed out; retrying at the next one"),
                Ok(result) => match result {
                    Ok(0) => debug!("retention sweep: nothing expired"),
                    Ok(deleted) => info!(deleted, "retention sweep deleted expired outbox events"),
                    Err(error) => warn!(%error, "retention sweep failed; retrying at the next one"),
                },
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.inner.config.retention_interval) => {}
            }
        }
    }
}

impl WebhookRegistrar for Dispatcher {
    fn register_webhooks(
        &mut self,
        event_name: &str,
        subscribers: HashMap<String, WebhookSubscriber>,
    ) -> Result<(), RegistrationError> {
        Dispatcher::register_webhooks(self, event_name, subscribers)
    }
}

/// An event ready to deliver: its envelope and the exact body, built once
/// for all of a batch's rows of that event.
#[derive(Debug)]
struct Prepared {
    event_id: HeaderValue,
    envelope: Envelope,
    body: Bytes,
}

impl Prepared {
    fn new(row: &ClaimedRow) -> Self {
        let data = serde_json::from_str(&row.payload).unwrap_or_else(|error| {
            // JSONB always prints valid JSON; kept rather than lost.
            warn!(%error, event = %row.event_id, "an outbox payload did not parse");
            serde_json::Value::String(row.payload.clone())
        });
        let envelope = Envelope {
            event_id: row.event_id,
            event_name: row.event_name.clone(),
            app: row.app.clone(),
            occurred_at: row.created_at.and_utc(),
            resource_type: row.resource_type.clone(),
            resource_id: row.resource_id.clone(),
            event_type: row.event_type.clone(),
            data,
        };
        Self {
            event_id: HeaderValue::from_str(&row.event_id.to_string())
                .unwrap_or_else(|_| unreachable!("a UUID is a valid header value")),
            body: Bytes::from(envelope.to_json()),
            envelope,
        }
    }
}

fn completion(row: &ClaimedRow, outcome: Outcome) -> Completion {
    Completion {
        event_id: row.event_id,
        subscriber: row.subscriber.clone(),
        claimed_at: row.claimed_at,
        outcome,
    }
}

/// How many waves of attempts rows are claimed for: as many (at most four)
/// as fit, each taking up to the delivery timeout, before a waiting row's
/// claim must be handed back. Holding more than one wave means the next
/// attempts are ready the moment a slot frees, without a claim in between.
fn waves(config: &DispatcherConfig) -> usize {
    let waves = patience(config).as_nanos() / config.delivery_timeout.as_nanos().max(1);
    usize::try_from(waves.clamp(1, 4)).unwrap_or(1)
}

/// How long after its claim a row may still be attempting, or waiting for
/// its turn: three quarters of the visibility timeout, so that the claim
/// never goes stale meanwhile.
fn patience(config: &DispatcherConfig) -> Duration {
    config.visibility_timeout * 3 / 4
}

/// The lower bound of a scan without `start_from`: before any event.
fn beginning_of_time() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(1, 1, 1)
        .and_then(|date| date.and_hms_opt(0, 0, 0))
        .unwrap_or_else(|| unreachable!("1 January of year 1 is a date"))
}

/// The least time between the starts of two passes that only expand
/// notified events; see [`Dispatcher::run`]. Measured on two cores shared
/// with the producers' database: at 2 ms the extra statements cost the
/// producers about a tenth of their rate, and at 4 ms the median latency
/// from commit to delivery came within a few percent of 5 ms.
const PASS_SPACING: Duration = Duration::from_millis(3);

/// Rows (the planner's estimate) from which an outbox without a `created_at`
/// index earns a warning: reading them all every poll costs a core a
/// noticeable share of its time.
const LARGE_OUTBOX: f64 = 100_000.0;

/// Notified events that start a pass at once, however soon after the last.
const PASS_GATHERING_LIMIT: usize = 64;

/// How outbox outcomes are written: into the producer's own database,
/// whose commits the producers wait on, so one writer gathers for longer and
/// writes larger batches, costing the producers fewer statements (gathering
/// for 60 ms instead of 20 measured no better).
fn batching(config: &DispatcherConfig) -> Batching {
    Batching {
        limit: config.batch_size.max(1) * 4,
        gathering: Duration::from_millis(20),
        writers: 1,
    }
}

/// The producer's deliveries table as the recorder writes to it.
#[derive(Debug)]
struct RowOutcomes(Dispatcher);

#[async_trait]
impl OutcomeStore for RowOutcomes {
    type Outcome = Completion;

    async fn write(&self, batch: &[Completion]) -> Result<(), String> {
        let inner = &self.0.inner;
        inner
            .queries
            .complete(&inner.pool, batch)
            .await
            .map_err(|error| error.to_string())
    }

    fn retry_in(&self, completion: &Completion) -> Option<Duration> {
        match completion.outcome {
            Outcome::Retry { wait, .. } => Some(wait),
            _ => None,
        }
    }

    fn wake(&self) {
        self.0.request(Scan::None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOW: NetPolicy = NetPolicy {
        allow_private_network: true,
    };

    fn url(text: &str) -> Url {
        Url::parse(text).expect("valid URL")
    }

    #[test]
    fn defaults_follow_the_contract_and_validate() {
        let config = DispatcherConfig::default();
        assert_eq!(config.retry, RetryPolicy::default());
        assert_eq!(config.listener_max_retries, 10);
        assert_eq!(config.listener_max_backoff, Duration::from_secs(30));
        assert_eq!(config.channel(), "outbox_events");
        config.validate().expect("the defaults are valid");
    }

    #[test]
    fn validation_names_the_bad_setting() {
        let config = DispatcherConfig {
            visibility_timeout: Duration::from_secs(5),
            ..DispatcherConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Invalid {
                setting: "visibility-timeout",
                ..
            })
        ));
        for header in [
            "Content-Type",
            "x-bootstrapify-messaging-signature",
            "bad header",
        ] {
            let config = DispatcherConfig {
                webhook_headers: vec![(header.to_owned(), "v".to_owned())],
                ..DispatcherConfig::default()
            };
            assert!(
                matches!(
                    config.validate(),
                    Err(ConfigError::Invalid {
                        setting: "webhook-header",
                        ..
                    })
                ),
                "{header}"
            );
        }
        let config = DispatcherConfig {
            webhook_headers: vec![("X-Key".to_owned(), "line\nbreak-secret".to_owned())],
            ..DispatcherConfig::default()
        };
        let error = config.validate().expect_err("a bad value");
        assert!(!error.to_string().contains("secret"), "{error}");
    }

    #[test]
    fn webhook_registrations_are_checked() {
        let mut webhooks = BTreeMap::new();
        let subscriber = |app: Option<&str>, at: &str| WebhookSubscriber {
            app: app.map(str::to_owned),
            url: url(at),
        };
        assert_eq!(
            add_webhooks(&mut webhooks, None, &ALLOW, "", HashMap::new()),
            Err(RegistrationError::EmptyEventName)
        );
        let ftp = HashMap::from([("a".to_owned(), subscriber(None, "ftp://x/"))]);
        assert!(matches!(
            add_webhooks(&mut webhooks, None, &ALLOW, "e", ftp),
            Err(RegistrationError::InvalidUrl { .. })
        ));
        let mine = HashMap::from([("me".to_owned(), subscriber(None, "http://x/"))]);
        assert!(matches!(
            add_webhooks(&mut webhooks, Some("me"), &ALLOW, "e", mine),
            Err(RegistrationError::ReservedSubscriber { .. })
        ));
        assert!(webhooks.is_empty(), "a refused registration adds nothing");
        let empty_app = HashMap::from([("a".to_owned(), subscriber(Some(""), "http://x/"))]);
        add_webhooks(&mut webhooks, None, &ALLOW, "e", empty_app).expect("valid");
        let loopback = HashMap::from([("a".to_owned(), subscriber(None, "http://127.0.0.1:9/"))]);
        assert!(matches!(
            add_webhooks(&mut webhooks, None, &NetPolicy::default(), "e2", loopback),
            Err(RegistrationError::RefusedUrl { .. })
        ));
        assert_eq!(webhooks["e"]["a"].app, None, "an empty app is none");
    }

    #[test]
    fn scans_look_back_from_the_previous_one_never_before_start_from() {
        let start = DateTime::<Utc>::from_timestamp(1_000_000, 0).expect("a time");
        let mut expansion = Expansion::new(Some(start));
        let lookback = Duration::from_secs(60);
        let start = start.naive_utc();
        assert_eq!(expansion.since(Scan::None, lookback), None);
        assert_eq!(
            expansion.since(Scan::Recent, lookback),
            Some(start),
            "no scan yet"
        );
        let later = start + chrono::Duration::hours(1);
        expansion.scanned(start, later);
        assert_eq!(
            expansion.since(Scan::Recent, lookback),
            Some(later - chrono::Duration::seconds(60))
        );
        assert_eq!(expansion.since(Scan::Full, lookback), Some(start));
        // A lookback reaching before the cutoff stops at it.
        assert_eq!(
            expansion.since(Scan::Recent, Duration::from_secs(7200)),
            Some(start)
        );
        assert_eq!(
            Expansion::new(None).since(Scan::Full, lookback),
            Some(beginning_of_time())
        );
    }

    #[test]
    fn subscriptions_cover_handlers_and_webhooks() {
        let mut registry = Registry::default();
        let handler: Arc<dyn Handler> =
            Arc::new(|_envelope: Envelope| async { Ok::<(), HandlerError>(()) });
        registry.handlers.insert("e1".to_owned(), handler.clone());
        registry.webhooks.insert(
            "e2".to_owned(),
            HashMap::from([(
                "hook".to_owned(),
                WebhookSubscriber {
                    app: Some("ush".to_owned()),
                    url: url("http://x/"),
                },
            )]),
        );
        let with_handlers = registry.copy().with_subscriptions(Some("me"));
        let subscriptions = &with_handlers.subscriptions;
        assert_eq!(subscriptions.subscribers, ["me", "hook"]);
        assert_eq!(subscriptions.apps, [None, Some("ush".to_owned())]);
        assert_eq!(subscriptions.event_names, ["e1", "e2"]);
        assert!(subscriptions.every_event.is_empty());

        registry.catch_all = Some(handler);
        let with_catch_all = registry.with_subscriptions(Some("me"));
        assert_eq!(with_catch_all.subscriptions.every_event, ["me"]);
        assert_eq!(with_catch_all.subscriptions.subscribers, ["hook"]);
    }
}
