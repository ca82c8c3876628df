//! Outbox feeds: the hub as a consumer of producers' outbox tables.
//!
//! A feed runs an outbox [`Dispatcher`] on a producer's database. Its
//! in-process subscriber is the [`WebSubBridge`], which turns an event into
//! a hub event — the envelope as content, `application/json`, under the
//! envelope's id, on a topic rendered from a [`TopicTemplate`] — recorded in
//! the hub's own [`EventLog`]; the WebSub scheduler then delivers it to the
//! topic's WebSub subscribers, signed and with `Link` headers, like any
//! published content. The bridge takes only the events whose topic has
//! WebSub subscribers ([`SubscribedTopics`]; see `wanted.rs` for how it
//! keeps up with them), unless the feed lists the event names it forwards.
//! The same feed can also deliver to webhooks listed in a file
//! ([`WebhooksFile`]), which it watches and reloads on change. The running
//! feeds are listed in [`Feeds`], for the operator API.
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

mod bridge;
mod config;
mod status;
mod topic;
mod wanted;
mod webhooks_file;

pub use bridge::WebSubBridge;
use config::reason_of;
pub use config::{DEFAULT_SUBSCRIBER, FeedConfig};
pub use status::{FeedStatus, Feeds};
pub use topic::{DEFAULT_TOPIC_TEMPLATE, TopicTemplate};
use wanted::Wanted;
pub use wanted::{BEFORE_FIRST_SUBSCRIPTION, SubscribedTopics, TOPICS_REFRESH};
pub use webhooks_file::{WebhookEntry, WebhooksFile};

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use url::Url;

use crate::storage::events::EventLog;

use crate::config::text::{ConfigError, invalid};
use crate::delivery::outbox::{Dispatcher, DispatcherError, RegistrationError, ReloadError};

/// How often a feed looks at its webhooks file for changes.
pub const WEBHOOKS_FILE_CHECK: Duration = Duration::from_secs(1);

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
    /// recording into `events` and calling `wake`, for the events whose
    /// topic has a subscription in `topics` unless `config` lists event
    /// names — and the webhooks file's subscribers, then runs the
    /// dispatcher, follows the subscriptions and watches the file until
    /// `shutdown`.
    ///
    /// The feed runs on a thread and single-threaded runtime of its own: a
    /// feed's work is a stream of small steps (a notification, a statement,
    /// a POST) whose latency suffers from hopping between worker threads,
    /// and it is kept apart from the hub's own deliveries, which cannot
    /// starve it, nor it them. The bridge records, and the subscriptions are
    /// read, on the calling runtime, where the event log's and the store's
    /// connections live.
    pub async fn start(
        config: FeedConfig,
        events: Arc<dyn EventLog>,
        wake: Arc<dyn Fn() + Send + Sync>,
        topics: SubscribedTopics,
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
                    let set_up = Self::set_up(
                        config,
                        events,
                        wake,
                        topics,
                        &public_url,
                        hub_runtime.clone(),
                    )
                    .await;
                    let (state, wanted) = match set_up {
                        Ok(set_up) => set_up,
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
                    let follower =
                        wanted.map(|wanted| hub_runtime.spawn(wanted.run(shutdown.clone())));
                    state.dispatcher.clone().run(shutdown).await;
                    if let Some(watcher) = watcher {
                        let _ = watcher.await;
                    }
                    if let Some(follower) = follower {
                        let _ = follower.await;
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

    /// Everything [`Feed::start`] does before running; also returns what
    /// follows the subscribed topics, unless the feed lists its events.
    async fn set_up(
        config: FeedConfig,
        events: Arc<dyn EventLog>,
        wake: Arc<dyn Fn() + Send + Sync>,
        topics: SubscribedTopics,
        public_url: &Url,
        hub_runtime: tokio::runtime::Handle,
    ) -> Result<(Arc<FeedState>, Option<Wanted>), FeedError> {
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
        let dispatcher = Dispatcher::new(pool, dispatcher_config)?.with_operations(
            events.clone(),
            // The seed's contract: every row to its own retry limit, nothing
            // skipped, unless the feed asks to disable failing webhooks.
            config.disable_endpoint_after.unwrap_or(0),
        );
        let bridge = WebSubBridge::new(events, wake, public_url.clone(), template.clone())
            .recording_on(hub_runtime.clone());
        let wanted = match &config.events {
            Some(names) => {
                for name in names {
                    dispatcher.register_handler(name, bridge.clone())?;
                }
                None
            }
            None => {
                dispatcher.register_catch_all_handler(bridge)?;
                // Restricted before the dispatcher first runs, so it never
                // takes an event nobody subscribes to. A store that cannot
                // be read now leaves the list empty until it can: the
                // events passed over meanwhile are taken then (see
                // `wanted.rs`).
                let mut wanted =
                    Wanted::new(&topics, template, public_url.clone(), dispatcher.clone());
                wanted.publish();
                let read = hub_runtime
                    .spawn(async move {
                        let read = wanted.refresh().await;
                        (wanted, read)
                    })
                    .await;
                let wanted = match read {
                    Ok((wanted, read)) => {
                        if let Err(error) = read {
                            warn!(%error, "the subscribed topics could not be read; the feed takes their events once they can");
                        }
                        wanted
                    }
                    Err(error) => {
                        return Err(FeedError::Thread(std::io::Error::other(format!(
                            "reading the subscribed topics stopped abnormally: {error}"
                        ))));
                    }
                };
                Some(wanted)
            }
        };
        let state = Arc::new(FeedState {
            dispatcher: dispatcher.clone(),
            webhooks_file: config.webhooks_file.clone(),
            seen: Mutex::new(None),
        });
        state.reload()?;
        info!(tables = %tables, channel = dispatcher.channel(), "outbox feed started");
        Ok((state, wanted))
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
