//! The outbox's in-process dispatcher: what a service embeds to deliver the
//! rows of its own outbox to in-process handlers and to webhooks, without
//! the hub. The producer side (the tables, [`Outbox`], the envelope) is the
//! `websub-outbox` crate, re-exported here; the delivery core (the attempt,
//! its verdict, retries, clients, endpoint health) is `websub-delivery`.
//! The hub runs one of these per feed and re-exports it as
//! `websub_hub::delivery::outbox`.
//!
//! The dispatcher expands events into one delivery row per registered
//! subscriber, claims due rows, hands each to its in-process handler or
//! POSTs it to its webhook, and records the outcome per row —
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
//! slow or dead subscriber never holds up another. Beyond the messaging
//! contract, a webhook subscriber may have a bound of its own
//! ([`WebhookSubscriber::max_in_flight`]), or ask for its rows one at a
//! time in recording order ([`WebhookSubscriber::ordered`]): those are
//! claimed one by one, the head of its line only, never by an expansion.

pub mod cloudevents;
mod config;
mod deliver;
mod future;
mod lanes;
mod listener;
mod operated;
mod registry;
mod rows;
mod scans;
mod schedule;
mod signals;
mod sql;
mod webhook_rows;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use config::static_headers;
use lanes::{Lanes, waves};
use registry::Registry;
use signals::Pending;
use sql::Queries;
use websub_delivery::attempt::SignatureScheme;
use websub_delivery::client::{self, ClientIdentity, Purpose};
use websub_delivery::net::NetError;
use websub_delivery::setting::ConfigError;
use websub_delivery::{Channel, Judge};

pub use config::{DispatcherConfig, WebhookSignature};
pub use registry::{
    EventMatch, Handler, HandlerError, RegistrationError, ReloadError, WebhookRegistrar,
    WebhookSubscriber,
};
pub use webhook_rows::{WebhookDelivery, WebhookFilter};

pub use cloudevents::WebhookFormat;
pub use websub_delivery::net::NetPolicy;
pub use websub_delivery::{NextStep, RetryPolicy};
pub use websub_outbox::*;

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

/// The dispatcher. Cheap to clone; clones share registrations and state,
/// so one clone can [`run`](Self::run) while others register.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    inner: Arc<DispatcherState>,
}

#[derive(Debug)]
struct DispatcherState {
    pool: PgPool,
    config: DispatcherConfig,
    channel: String,
    queries: Queries,
    client: RwLock<reqwest::Client>,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The headers webhooks are signed under.
    scheme: &'static SignatureScheme,
    /// The key webhook bodies are signed with, decoded once.
    signing_key: Option<Vec<u8>>,
    /// The key `signing_key` replaces, during a rotation.
    previous_key: Option<Vec<u8>>,
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
    /// Where webhook attempts are kept and endpoint health is tallied, once
    /// [`Dispatcher::with_operations`] says.
    operated: std::sync::OnceLock<operated::Operated>,
    /// The backlog as last read by [`Dispatcher::sample_gauges`].
    sampled: Mutex<Option<BacklogSample>>,
    /// The clients of webhook subscribers with a client certificate of
    /// their own, by subscriber, with the certificate each was made for
    /// (one per such subscriber: bounded by the registrations).
    own_clients: Mutex<HashMap<String, (ClientIdentity, reqwest::Client)>>,
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
            &config.trust,
        )
        .map_err(DispatcherError::Client)?;
        let headers = static_headers(&config.webhook_headers)?;
        let (scheme, signing_key, previous_key) = config.signing();
        let waves = waves(&config);
        let hold = config.per_subscriber.saturating_mul(waves);
        let hold_overall = config.concurrency.saturating_mul(waves);
        let handlers = Judge::new(Channel::Handler, config.retry);
        let webhooks = Judge::new(Channel::Webhook, config.retry);
        Ok(Self {
            inner: Arc::new(DispatcherState {
                channel: config.channel(),
                queries: Queries::new(&config.tables, config.query_timeout),
                slots: Arc::new(Semaphore::new(config.concurrency)),
                pool,
                config,
                client: RwLock::new(client),
                headers,
                scheme,
                signing_key,
                previous_key,
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
                operated: std::sync::OnceLock::new(),
                sampled: Mutex::new(None),
                own_clients: Mutex::new(HashMap::new()),
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

    /// Keeps every webhook attempt in `events` (the hub's log, or any other
    /// keeper of endpoint state) and tallies the webhooks' health there: a
    /// webhook whose deliveries exhaust their retries `disable_after` times
    /// in a row is disabled (never, when 0), and its rows are closed as
    /// skipped until an operator enables it. The configuration's
    /// `breaker_open_after` and `resend_exhausted` take effect here.
    /// Without it, a dispatcher keeps no history and disables nothing.
    pub fn with_operations(
        self,
        events: Arc<dyn websub_delivery::state::EndpointStates>,
        disable_after: u32,
    ) -> Self {
        let _ = self.inner.operated.set(operated::Operated::new(
            events,
            disable_after,
            &self.inner.config,
        ));
        self
    }

    /// The webhooks' health, when [`Dispatcher::with_operations`] set it up.
    pub fn endpoints(&self) -> Option<&websub_delivery::Endpoints> {
        self.inner
            .operated
            .get()
            .map(|operated| &operated.endpoints)
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

    /// The backlog as last read (every few seconds while it runs); `None`
    /// until the first read succeeds.
    pub fn last_sample(&self) -> Option<BacklogSample> {
        *self
            .inner
            .sampled
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Says once, at start-up, whether polling scans (and expansions of the
    /// newest events) can read only their window: without an index on
    /// `created_at` each reads the whole outbox.
    /// A warning once the table is large enough for that to cost.
    async fn advise_on_scan_index(self) {
        let config = &self.inner.config;
        let tables = &config.tables;
        let outbox = tables.outbox();
        let found = websub_delivery::state::bounded(
            config.query_timeout,
            &self.inner.pool,
            async |connection| sql::scan_index(connection, tables).await,
        );
        match found.await {
            Ok((true, _)) => {
                debug!(%outbox, "polling scans read the outbox by its created_at index")
            }
            Ok((false, rows)) if rows >= LARGE_OUTBOX => warn!(
                %outbox,
                rows,
                "the outbox has no index on created_at, so every poll (and every pass a NOTIFY \
                 without the event's id starts) reads the whole table; \
                 `websub outbox-ddl --scan-index` prints one"
            ),
            Ok((false, _)) => info!(
                %outbox,
                "the outbox has no index on created_at, so every poll (and every pass a NOTIFY \
                 without the event's id starts) reads the whole table (cheap while it is small); \
                 `websub outbox-ddl --scan-index` prints one"
            ),
            Err(error) => debug!(%outbox, %error, "could not look for a created_at index"),
        }
    }

    /// The retention sweep: at start-up, then every `retention_interval`.
    async fn sweep(self, ttl: Duration, shutdown: CancellationToken) {
        let tables = &self.inner.config.tables;
        loop {
            let limit = self.inner.config.query_timeout;
            let purge =
                websub_delivery::state::bounded(limit, &self.inner.pool, async |connection| {
                    purge_expired(connection, tables, ttl).await
                });
            match purge.await {
                Ok(0) => debug!("retention sweep: nothing expired"),
                Ok(deleted) => info!(deleted, "retention sweep deleted expired outbox events"),
                Err(error) => warn!(%error, "retention sweep failed; retrying at the next one"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.inner.config.retention_interval) => {}
            }
        }
    }
}

/// `websub_outbox_listener_connected{outbox}`: 1 while the feed listens.
pub const OUTBOX_LISTENER_CONNECTED: &str = "websub_outbox_listener_connected";

/// `websub_outbox_backlog{outbox}`: delivery rows of this dispatcher's
/// subscribers due, retrying or in flight.
pub const OUTBOX_BACKLOG: &str = "websub_outbox_backlog";

/// `websub_outbox_oldest_undelivered_seconds{outbox}`: the age of the
/// oldest event with such a row, 0 when there is none.
pub const OUTBOX_OLDEST_UNDELIVERED_SECONDS: &str = "websub_outbox_oldest_undelivered_seconds";

/// What the backlog gauges were last set to, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BacklogSample {
    /// Delivery rows of this dispatcher's subscribers due, retrying or in
    /// flight.
    pub backlog: u64,
    /// The age of the oldest event with such a row, in seconds; 0 when
    /// there is none.
    pub oldest_undelivered_seconds: f64,
    /// When it was read.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// How often the backlog gauges are read from the outbox tables.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

impl Dispatcher {
    /// Keeps the feed's gauges current until `shutdown`: whether it listens
    /// (also set at every change of the listener), and its backlog.
    pub(crate) async fn sample_gauges(self, shutdown: CancellationToken) {
        let outbox = self.inner.config.tables.outbox().to_owned();
        let listening = metrics::gauge!(OUTBOX_LISTENER_CONNECTED, "outbox" => outbox.clone());
        let backlog = metrics::gauge!(OUTBOX_BACKLOG, "outbox" => outbox.clone());
        let oldest = metrics::gauge!(OUTBOX_OLDEST_UNDELIVERED_SECONDS, "outbox" => outbox);
        loop {
            listening.set(if self.is_listening() { 1.0 } else { 0.0 });
            let names = self.registry().names.clone();
            let config = &self.inner.config;
            let sampled = websub_delivery::state::bounded(
                config.query_timeout,
                &self.inner.pool,
                async |connection| {
                    sql::undelivered(connection, &config.tables, &names, config.retry.max_retries)
                        .await
                },
            );
            match sampled.await {
                Ok((rows, age)) => {
                    backlog.set(rows as f64);
                    oldest.set(age);
                    *self
                        .inner
                        .sampled
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(BacklogSample {
                        backlog: rows,
                        oldest_undelivered_seconds: age,
                        at: chrono::Utc::now(),
                    });
                }
                Err(error) => debug!(%error, "sampling the outbox backlog failed"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(SAMPLE_INTERVAL) => {}
            }
        }
    }
}

/// Rows (the planner's estimate) from which an outbox without a `created_at`
/// index earns a warning: reading them all every poll costs a core a
/// noticeable share of its time.
const LARGE_OUTBOX: f64 = 100_000.0;
