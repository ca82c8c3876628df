//! Assembling and running a hub: opens the stores a configuration names,
//! wires the parts together, serves HTTP on a listener it is given, and on
//! shutdown stops taking requests, then drains verifications, fetches and
//! deliveries in flight before returning. It installs no signal handlers and
//! binds no ports: the binary does that.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use websub_store::SubscriptionStore;

use crate::clock::{Clock, SystemClock};
use crate::config::HubConfig;
use crate::config::descriptors;
use crate::delivery::client::{self, Purpose, Trust};
use crate::delivery::net::NetPolicy;
use crate::delivery::operator::OperatorWebhook;
use crate::delivery::pool::{HostClients, IdleLimits};
use crate::delivery::websub::Distributor;
use crate::intake::feed::{Feed, FeedHandle, Feeds, SubscribedTopics};
use crate::intake::lease::Reaper;
use crate::intake::publish::Intake;
use crate::intake::quota::{QuotaConfig, QuotaEnforcer};
use crate::intake::verify::{CatchUp, Subscriptions, Verifier};
use crate::storage::backlog::Backlog;
use crate::storage::events::{self, EventLog, EventLogError};
use crate::web::api::{self, ApiState};
use crate::web::auth::{KeyRings, UserTokens};

/// How long shutdown waits for work in flight before giving up on it. What
/// is cut short is not lost: unrecorded deliveries are claimed again after
/// the visibility timeout.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A hub, assembled and ready to run.
#[derive(Debug)]
pub struct Hub {
    config: HubConfig,
    store: Arc<dyn SubscriptionStore>,
    events: Arc<dyn EventLog>,
    subscriptions: Subscriptions,
    intake: Intake,
    dispatcher: Distributor,
    reaper: Reaper,
    clock: Arc<dyn Clock>,
    keys: KeyRings,
    user_tokens: Option<UserTokens>,
    feed_reload: Arc<Notify>,
    /// What the outbox feeds follow of the subscriptions.
    subscribed_topics: SubscribedTopics,
    /// The outbox feeds started, for the operator API.
    feeds: Feeds,
    metrics: Option<PrometheusHandle>,
    /// The roots every client trusts, for the feeds' webhooks.
    trust: Trust,
    /// The sender of endpoint changes to the operator webhook, when one is
    /// configured.
    operator_webhook: Option<OperatorWebhook>,
    /// This process in the registry of replicas (PostgreSQL): beats while
    /// it runs.
    replicas: Option<crate::storage::replicas::Replicas>,
}

/// Asks a running hub's outbox feeds to read their webhooks files again
/// (`websubd` does on SIGHUP). Cheap to clone.
#[derive(Debug, Clone)]
pub struct FeedReloader(Arc<Notify>);

impl FeedReloader {
    /// Reloads every feed's webhooks file; a file that cannot be applied
    /// changes nothing (and is logged).
    pub fn reload(&self) {
        self.0.notify_one();
    }
}

/// Why a hub could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::text::ConfigError),
    /// The subscription store could not be opened.
    #[error("opening the subscription store failed: {0}")]
    Store(#[from] websub_store::StoreError),
    /// The event log could not be opened.
    #[error("opening the event log failed: {0}")]
    Events(#[from] EventLogError),
    /// The backlog could not be opened.
    #[error("opening the backlog failed: {0}")]
    Backlog(#[from] crate::storage::backlog::BacklogError),
    /// The registry of replicas could not be opened.
    #[error("registering the replica failed: {0}")]
    Replicas(#[from] crate::storage::replicas::ReplicaError),
    /// The HTTP clients could not be built.
    #[error("building the HTTP clients failed: {0}")]
    Net(#[from] crate::delivery::net::NetError),
    /// The authentication settings cannot work.
    #[error("authentication settings: {0}")]
    Auth(#[from] crate::web::auth::AuthError),
    /// The quota settings cannot work.
    #[error("quota settings: {0}")]
    Quota(#[from] crate::intake::quota::QuotaError),
    /// An outbox feed could not start.
    #[error("outbox feed: {0}")]
    Feed(#[from] crate::intake::feed::FeedError),
    /// Serving HTTP failed.
    #[error("serving HTTP failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Opens what `config` names, serves on `listener` until `shutdown`
/// resolves, then drains and returns.
pub async fn serve(
    listener: TcpListener,
    config: HubConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    Hub::open(config).await?.run(listener, shutdown).await
}

/// Opens the subscription store a `--store` / `--database-url` value names.
pub async fn open_store(url: &str) -> Result<Arc<dyn SubscriptionStore>, websub_store::StoreError> {
    use websub_store::{memory, postgres, redis, sqlite};
    Ok(if url == "memory" {
        Arc::new(memory::MemoryStore::new())
    } else if url.starts_with("sqlite:") {
        Arc::new(sqlite::SqliteStore::connect(url).await?)
    } else if ["redis://", "rediss://", "redis+cluster://"]
        .iter()
        .any(|scheme| url.starts_with(scheme))
    {
        Arc::new(redis::RedisStore::connect(url).await?)
    } else {
        Arc::new(postgres::PostgresStore::connect(url).await?)
    })
}

impl Hub {
    /// Validates `config`, fits its deliveries under the file-descriptor
    /// limit ([`descriptors`]), opens its event log and subscription store (running
    /// migrations), and assembles the hub on the system clock.
    pub async fn open(mut config: HubConfig) -> Result<Self, ServeError> {
        config.validate()?;
        config.delivery = descriptors::fit(config.delivery, descriptors::raise_limit());
        let replicas = if config.database_url.starts_with("sqlite:") {
            None
        } else {
            Some(crate::storage::replicas::Replicas::connect(&config.database_url).await?)
        };
        let (events, backlog) = match &replicas {
            Some(replicas) => (
                events::connect_as(&config.database_url, replicas.id()).await?,
                crate::storage::backlog::connect_as(&config.database_url, replicas.id()).await?,
            ),
            None => (
                events::connect(&config.database_url).await?,
                crate::storage::backlog::connect(&config.database_url).await?,
            ),
        };
        // Registered (the event log's migrations made the table) before any
        // worker claims; the dead replicas' claims are taken over in `run`,
        // once this one has its seat.
        if let Some(replicas) = &replicas {
            replicas.register().await?;
        }
        // Before any worker claims: what a killed predecessor held is due
        // at once (on SQLite; a dead replica's are taken over above).
        match backlog.release_claims().await {
            Ok(0) => {}
            Ok(released) => {
                tracing::info!(
                    released,
                    "took over the verifications and fetches of the process before"
                );
            }
            Err(error) => {
                tracing::warn!(%error, "taking over the verifications and fetches of the process before failed");
            }
        }
        let store_url = config
            .store
            .clone()
            .unwrap_or_else(|| config.database_url.clone());
        let store = open_store(&store_url).await?;
        let hub = Self::assemble(config, store, events, backlog, Arc::new(SystemClock))?;
        Ok(match replicas {
            Some(replicas) => hub.with_replicas(replicas),
            None => hub,
        })
    }

    /// Assembles a hub from parts already open (tests inject their own store,
    /// log, backlog and clock here).
    pub fn assemble(
        config: HubConfig,
        store: Arc<dyn SubscriptionStore>,
        events: Arc<dyn EventLog>,
        backlog: Arc<dyn Backlog>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ServeError> {
        let policy = NetPolicy {
            allow_private_network: config.allow_private_network,
        };
        let trust = config.trust()?;
        let callback_clients = HostClients::new(
            &policy,
            config.delivery.timeout,
            &trust,
            IdleLimits::of_budget(config.delivery.idle_connections, config.delivery.per_host),
        )?;
        let dispatcher = Distributor::new(
            events.clone(),
            store.clone(),
            callback_clients.clone(),
            config.public_url.to_string(),
            config.delivery,
            config.poll_interval,
            clock.clone(),
        );
        let verifier = Verifier::new(callback_clients, config.verification);
        let subscriptions = Subscriptions::new(
            store.clone(),
            backlog.clone(),
            verifier,
            policy.clone(),
            config.lease,
            config.verification,
            clock.clone(),
        );
        let cache = dispatcher.clone();
        let subscribed_topics = SubscribedTopics::new(store.clone());
        let feeds = subscribed_topics.clone();
        subscriptions.on_change(crate::intake::verify::ChangeListener::new(move |topic| {
            cache.forget_topic(topic);
            feeds.changed(topic);
        }));
        let woken = dispatcher.clone();
        let unsubscribed = dispatcher.clone();
        subscriptions.catch_up_with(
            CatchUp::new(events.clone(), move || woken.wake()).on_unsubscribe(
                move |topic, callback, since| unsubscribed.set_unsubscribed(topic, callback, since),
            ),
        );
        let intake = Intake::new(
            events.clone(),
            store.clone(),
            backlog,
            dispatcher.clone(),
            client::build(
                Purpose::TopicFetches {
                    policy: policy.clone(),
                },
                config.delivery.timeout,
                &trust,
            )?,
            config.delivery.timeout,
            policy,
            clock.clone(),
            config.max_content_bytes,
        );
        let reaper = Reaper::new(store.clone(), clock.clone(), config.reaper_interval);
        let keys = KeyRings::of(&config)?;
        let user_tokens = config
            .user_token_key
            .as_deref()
            .map(|key| UserTokens::new(key, &config.user_token_header))
            .transpose()?;
        let operator_webhook = match config.operator_webhook_key()? {
            None => None,
            Some((url, key)) => Some(OperatorWebhook::new(
                url.to_string(),
                (key, config.operator_webhook_previous_key()?),
                config.public_url.to_string(),
                client::build(Purpose::OperatorService, config.delivery.timeout, &trust)?,
                config.delivery.timeout,
                config.delivery.retry,
                events.clone(),
                clock.clone(),
            )),
        };
        subscriptions.deny_with(crate::intake::deny::Denials::new(events.clone()));
        if let Some(base_url) = &config.quota_url {
            subscriptions.enforce_quota(QuotaEnforcer::new(QuotaConfig {
                base_url: Some(base_url.clone()),
                timeout: config.quota_timeout,
                internal_api_key: config.quota_key().map(str::to_owned),
                internal_api_key_header: config.internal_api_key_header.clone(),
                quota_type: config.quota_type.clone(),
                trust: trust.clone(),
            })?);
        }
        Ok(Self {
            config,
            store,
            events,
            subscriptions,
            intake,
            dispatcher,
            reaper,
            clock,
            keys,
            user_tokens,
            feed_reload: Arc::new(Notify::new()),
            subscribed_topics,
            feeds: Feeds::new(),
            metrics: None,
            trust,
            operator_webhook,
            replicas: None,
        })
    }

    /// Beats as `replicas` while running, taking over dead replicas'
    /// claims, and deregisters on shutdown. Its id must be the one the
    /// event log and backlog claim as ([`crate::storage::events::connect_as`]).
    pub fn with_replicas(mut self, replicas: crate::storage::replicas::Replicas) -> Self {
        self.replicas = Some(replicas);
        self
    }

    /// Serves `/metrics` from this handle (the binary installs the recorder;
    /// the library installs nothing global).
    pub fn with_metrics(mut self, handle: PrometheusHandle) -> Self {
        crate::telemetry::describe();
        self.metrics = Some(handle);
        self
    }

    /// A handle that reloads the outbox feeds' webhooks files.
    pub fn feed_reloader(&self) -> FeedReloader {
        FeedReloader(self.feed_reload.clone())
    }

    /// The subscription store.
    pub fn store(&self) -> &Arc<dyn SubscriptionStore> {
        &self.store
    }

    /// The event log.
    pub fn events(&self) -> &Arc<dyn EventLog> {
        &self.events
    }

    /// The subscription workflow.
    pub fn subscriptions(&self) -> &Subscriptions {
        &self.subscriptions
    }

    /// Content intake.
    pub fn intake(&self) -> &Intake {
        &self.intake
    }

    /// The dispatcher.
    pub fn dispatcher(&self) -> &Distributor {
        &self.dispatcher
    }

    /// The HTTP routes, for serving or for driving with `tower::ServiceExt`.
    pub fn router(&self) -> axum::Router {
        let state = ApiState {
            subscriptions: self.subscriptions.clone(),
            intake: self.intake.clone(),
            store: self.store.clone(),
            events: self.events.clone(),
            dispatcher: self.dispatcher.clone(),
            clock: self.clock.clone(),
            public_url: Arc::from(self.config.public_url.as_str()),
            keys: self.keys.clone(),
            user_tokens: self.user_tokens.clone(),
            max_form_bytes: self.config.max_form_bytes,
            max_content_bytes: self.config.max_content_bytes,
            metrics: self.metrics.clone(),
            retention: self.config.retention,
            feeds: self.feeds.clone(),
        };
        api::layers(
            api::router(state.clone())
                .merge(crate::web::admin::router(state.clone()))
                .merge(crate::web::portal::router(state)),
        )
    }

    /// Runs the hub on `listener` until `shutdown` resolves, then drains.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        // Before anything is recorded, so that the first events have their
        // partition; the upkeep task keeps it so from then on.
        make_room(self.events.as_ref(), self.config.retention).await;
        // Before any worker claims: the claims of replicas that died
        // before go out at once, those of this process's predecessor at the
        // same address (a seat) included, however recent its last beat.
        if let Some(replicas) = &self.replicas {
            if let Some(seat) = crate::storage::replicas::seat_of(listener.local_addr()?)
                && let Err(error) = replicas.sit(&seat).await
            {
                warn!(%error, seat, "recording this replica's seat failed; a predecessor's claims follow once its heartbeat is old");
            }
            match replicas
                .take_over(crate::storage::replicas::DEAD_AFTER)
                .await
            {
                Ok(taken_over) => {
                    crate::storage::replicas::report(&taken_over);
                }
                Err(error) => {
                    warn!(%error, "taking over the claims of dead replicas failed");
                }
            }
        }
        let stop = CancellationToken::new();
        let background = CancellationToken::new();
        // Beats until the drain is over: claims being drained are this
        // replica's, not a dead one's.
        let beating = CancellationToken::new();
        let heartbeat = self.replicas.clone().map(|replicas| {
            let woken = self.dispatcher.clone();
            tokio::spawn(crate::storage::replicas::keep_beating(
                replicas,
                move || woken.wake(),
                beating.clone(),
            ))
        });
        let dispatcher = tokio::spawn(self.dispatcher.clone().run(background.clone()));
        let reaper = tokio::spawn(self.reaper.clone().run(background.clone()));
        // The backlog's workers stop claiming when serving stops; what they
        // claimed finishes in the drain, and the rest resumes at the next
        // start.
        let intake_stop = CancellationToken::new();
        let verifiers = tokio::spawn(
            self.subscriptions
                .clone()
                .run_verifiers(intake_stop.clone()),
        );
        let fetchers = tokio::spawn(self.intake.clone().run_fetchers(intake_stop.clone()));
        let gauges = tokio::spawn(crate::telemetry::sample(
            self.events.clone(),
            self.intake.backlog().clone(),
            background.clone(),
        ));
        let upkeep = self
            .metrics
            .clone()
            .map(|handle| tokio::spawn(crate::telemetry::upkeep(handle, background.clone())));
        // Its own task, off every delivery's path: a dead operator webhook
        // holds up nothing but its own changes.
        let operator_webhook = self
            .operator_webhook
            .clone()
            .map(|sender| tokio::spawn(sender.run(background.clone())));
        let backlog_sweep = tokio::spawn(sweep_backlog(
            self.intake.backlog().clone(),
            background.clone(),
        ));
        let retention = tokio::spawn(keep_the_log(
            self.events.clone(),
            self.config.retention,
            background.clone(),
        ));
        // Feeds record into the event log the dispatcher delivers from, so
        // they stop before it does.
        let feeds_stop = CancellationToken::new();
        let mut feeds = Vec::with_capacity(self.config.feeds.len());
        for feed in &self.config.feeds {
            let dispatcher = self.dispatcher.clone();
            let mut feed = feed.clone();
            // A feed's webhooks follow the hub's network policy unless the
            // feed says otherwise.
            feed.allow_private_network
                .get_or_insert(self.config.allow_private_network);
            // And they trust what the hub trusts.
            feed.trust = self.trust.clone();
            let started = Feed::start(
                feed,
                self.events.clone(),
                Arc::new(move || dispatcher.wake()),
                self.subscribed_topics.clone(),
                &self.config.public_url,
                feeds_stop.clone(),
            )
            .await;
            match started {
                Ok(handle) => {
                    self.feeds.add(handle.dispatcher().clone());
                    feeds.push(handle);
                }
                Err(error) => {
                    feeds_stop.cancel();
                    background.cancel();
                    beating.cancel();
                    return Err(error.into());
                }
            }
        }
        let feeds = tokio::spawn(reload_feeds(
            feeds,
            self.feed_reload.clone(),
            feeds_stop.clone(),
        ));

        info!(address = %listener.local_addr()?, hub = %self.config.public_url, "websub hub serving");
        let stop_serving = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            stop_serving.cancel();
        });
        // Requests in flight at shutdown have as long to finish as the
        // drain after them.
        crate::web::connections::serve(
            listener,
            self.router(),
            crate::web::connections::Limits::from(&self.config),
            stop.clone(),
            DRAIN_TIMEOUT,
        )
        .await;

        info!("shutting down: draining work in flight");
        let drain = async {
            intake_stop.cancel();
            let _ = verifiers.await;
            let _ = fetchers.await;
            self.subscriptions.tracker().close();
            self.intake.tracker().close();
            self.subscriptions.tracker().wait().await;
            self.intake.tracker().wait().await;
            feeds_stop.cancel();
            if let Ok(feeds) = feeds.await {
                for feed in feeds {
                    feed.stopped().await;
                }
            }
            background.cancel();
            let _ = dispatcher.await;
            let _ = reaper.await;
            let _ = backlog_sweep.await;
            let _ = gauges.await;
            if let Some(upkeep) = upkeep {
                let _ = upkeep.await;
            }
            let _ = retention.await;
            if let Some(operator_webhook) = operator_webhook {
                let _ = operator_webhook.await;
            }
        };
        if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
            warn!("work still in flight after {DRAIN_TIMEOUT:?}; it resumes at the next start");
        }
        beating.cancel();
        if let Some(heartbeat) = heartbeat {
            let _ = heartbeat.await;
        }
        if let Some(replicas) = &self.replicas {
            match replicas.deregister().await {
                Ok(0) => {}
                Ok(released) => info!(released, "handed back the claims the drain left"),
                Err(error) => warn!(%error, "leaving the registry of replicas failed"),
            }
        }
        Ok(())
    }
}

/// Reloads the feeds' webhooks files whenever asked, until `stop`; then
/// hands the feeds back to be waited for.
async fn reload_feeds(
    feeds: Vec<FeedHandle>,
    asked: Arc<Notify>,
    stop: CancellationToken,
) -> Vec<FeedHandle> {
    loop {
        tokio::select! {
            () = stop.cancelled() => return feeds,
            () = asked.notified() => {
                for feed in &feeds {
                    // A failure is logged by the feed, which keeps its
                    // webhooks as they were.
                    let _ = feed.reload();
                }
            }
        }
    }
}

/// Deletes events older than `ttl` every hour until cancelled.
/// How long fetches and verifications that failed for good stay readable.
const FAILED_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Deletes, hourly, the backlog's rows that failed for good longer ago than
/// [`FAILED_KEPT`], until `stop`.
async fn sweep_backlog(backlog: Arc<dyn Backlog>, stop: CancellationToken) {
    let mut every_hour = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = every_hour.tick() => {}
        }
        let cutoff = chrono::Utc::now()
            - chrono::Duration::from_std(FAILED_KEPT).unwrap_or(chrono::Duration::MAX);
        match backlog.purge_failed_before(cutoff).await {
            Ok(deleted) => info!(deleted, "failed fetches and verifications swept"),
            Err(error) => warn!(%error, "backlog sweep failed"),
        }
    }
}

/// Makes the event log's partitions for the spans ahead
/// ([`LogUpkeep::partition_ahead`]).
///
/// [`LogUpkeep::partition_ahead`]: crate::storage::events::LogUpkeep::partition_ahead
async fn make_room(events: &dyn EventLog, retention: Option<Duration>) {
    let span = crate::storage::events::partition_span(retention);
    match events.partition_ahead(span, chrono::Utc::now()).await {
        Ok(0) => {}
        Ok(added) => info!(added, "event log partitions made ahead"),
        Err(error) => warn!(%error, "making event log partitions ahead failed"),
    }
}

/// Keeps the event log bounded until `stop`: under a retention, what is
/// older than it purged at once and at every sweep; after each sweep's
/// wait, partitions made ahead (the first were made before serving).
async fn keep_the_log(
    events: Arc<dyn EventLog>,
    retention: Option<Duration>,
    stop: CancellationToken,
) {
    // Hourly for the default of days; a tenth of a short retention, so that
    // what is kept never exceeds it by much.
    let every = retention.map_or(Duration::from_secs(3600), |ttl| {
        (ttl / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600))
    });
    let mut sweeps = tokio::time::interval(every);
    sweeps.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once.
    sweeps.tick().await;
    loop {
        if let Some(ttl) = retention {
            let cutoff = chrono::Utc::now()
                - chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
            match events.purge_before(cutoff).await {
                Ok(deleted) => info!(deleted, "retention sweep"),
                Err(error) => warn!(%error, "retention sweep failed"),
            }
            match events.changes().purge_changes_before(cutoff).await {
                Ok(deleted) => info!(deleted, "retention sweep of endpoint changes"),
                Err(error) => warn!(%error, "retention sweep of endpoint changes failed"),
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            _ = sweeps.tick() => {}
        }
        make_room(events.as_ref(), retention).await;
    }
}
