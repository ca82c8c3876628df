//! Content intake: publish pings (the hub fetches each topic and records its
//! content) and fat pings (the publisher sends the content). Whatever is
//! accepted is durable before anyone is told so: a fat ping's content in the
//! event log, a publish ping's topics in the backlog, from which fetchers
//! claim them, fetch (conditionally, with the validators the topic sent
//! last), retry a failed fetch with backoff, and record the content in the
//! event log. A fetch that cannot be honoured (content over the size limit,
//! a topic still failing after its retries) stays in the backlog as failed,
//! for operators to see. The dispatcher takes it from the event log.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};
use url::Url;
use websub_store::SubscriptionStore;

use crate::clock::Clock;
use crate::delivery::attempt::status_error;
use crate::delivery::error_chain;
use crate::delivery::net::NetPolicy;
use crate::delivery::websub::Distributor;
use crate::storage::backlog::worker::{self, Job};
use crate::storage::backlog::{Backlog, BacklogError, ClaimedFetch, FetchResult, Validators};
use crate::storage::events::{EventIntake, EventLogError, LoggedEvent, NewEvent};
use crate::telemetry::traces;

/// The Content-Type recorded when a topic answers without one.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// How many times a failing topic fetch is tried.
const FETCH_ATTEMPTS: u32 = 3;

/// The wait before a failed fetch's first retry; the next waits twice as
/// long.
const FETCH_RETRY_WAIT: Duration = Duration::from_secs(2);

/// Topic fetches in flight at once.
const FETCH_CONCURRENCY: usize = 32;

/// Topic fetches by outcome: `recorded`, `not_modified`, `no_subscribers`,
/// `retried`, `failed` (given up, kept in the backlog).
pub const FETCHES_TOTAL: &str = "websub_topic_fetches_total";

/// `websub_events_recorded_total`: events recorded from publishes.
pub const EVENTS_RECORDED_TOTAL: &str = "websub_events_recorded_total";

/// Accepts content for distribution. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Intake {
    inner: Arc<IntakeState>,
}

#[derive(Debug)]
struct IntakeState {
    events: Arc<dyn EventIntake>,
    store: Arc<dyn SubscriptionStore>,
    backlog: Arc<dyn Backlog>,
    dispatcher: Distributor,
    client: reqwest::Client,
    /// The fetch timeout, of which a fetch's claim outlives twice.
    timeout: Duration,
    net: NetPolicy,
    clock: Arc<dyn Clock>,
    max_content_bytes: usize,
    /// Told when a ping is written, so that a fetcher claims it at once.
    written: Arc<Notify>,
    tracker: TaskTracker,
}

/// What a topic fetch came to.
#[derive(Debug)]
#[non_exhaustive]
pub enum Fetched {
    /// New content, recorded, and what the topic sent to validate it.
    Recorded(LoggedEvent, Validators),
    /// The topic answered 304: nothing new to distribute.
    NotModified,
    /// Nobody subscribes to the topic: nothing fetched.
    NoSubscribers,
}

/// Why content was not accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IntakeError {
    /// The topic could not be fetched.
    #[error("fetching {topic} failed: {reason}")]
    Fetch {
        /// The topic.
        topic: String,
        /// Status or transport error.
        reason: String,
    },
    /// The content is larger than the hub accepts.
    #[error("the content is larger than {limit} bytes")]
    TooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// The event log failed; nothing was recorded.
    #[error(transparent)]
    Events(#[from] EventLogError),
    /// The subscription store failed.
    #[error(transparent)]
    Store(#[from] websub_store::StoreError),
    /// The backlog failed; the ping was not accepted.
    #[error(transparent)]
    Backlog(#[from] BacklogError),
}

impl Intake {
    /// Intake recording into `events` and waking `dispatcher`, its pings
    /// waiting in `backlog`, fetching with `client` (whose timeout is
    /// `timeout`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        events: Arc<dyn EventIntake>,
        store: Arc<dyn SubscriptionStore>,
        backlog: Arc<dyn Backlog>,
        dispatcher: Distributor,
        client: reqwest::Client,
        timeout: Duration,
        net: NetPolicy,
        clock: Arc<dyn Clock>,
        max_content_bytes: usize,
    ) -> Self {
        Self {
            inner: Arc::new(IntakeState {
                events,
                store,
                backlog,
                dispatcher,
                client,
                timeout,
                net,
                clock,
                max_content_bytes,
                written: Arc::new(Notify::new()),
                tracker: TaskTracker::new(),
            }),
        }
    }

    /// The backlog the pings wait in.
    pub fn backlog(&self) -> &Arc<dyn Backlog> {
        &self.inner.backlog
    }

    /// The fetches in flight, for draining at shutdown, once the fetchers
    /// have stopped.
    pub fn tracker(&self) -> &TaskTracker {
        &self.inner.tracker
    }

    /// Records content the publisher sent itself (a fat ping) or the hub
    /// fetched, its intake traced in `span` (see `crate::telemetry::traces`).
    /// Returns once the event is durable.
    pub async fn record(
        &self,
        topic: String,
        content_type: String,
        body: Bytes,
        span: Option<traces::Intake>,
    ) -> Result<LoggedEvent, IntakeError> {
        if body.len() > self.inner.max_content_bytes {
            let error = IntakeError::TooLarge {
                limit: self.inner.max_content_bytes,
            };
            if let Some(span) = span {
                span.failed(&error);
            }
            return Err(error);
        }
        let recorded = self
            .inner
            .events
            .record(
                NewEvent {
                    topic,
                    content_type,
                    body,
                    trace_context: span.as_ref().map(traces::Intake::kept),
                },
                self.inner.clock.now(),
            )
            .await;
        if let Some(span) = span {
            match &recorded {
                Ok(event) => span.recorded(event.id, event.body.len()),
                Err(error) => span.failed(error),
            }
        }
        let event = recorded?;
        metrics::counter!(EVENTS_RECORDED_TOTAL).increment(1);
        self.inner.dispatcher.wake();
        Ok(event)
    }

    /// Writes a fetch of each pinged topic that someone subscribes to (or
    /// is being verified for) to the backlog; returns once it is durable.
    /// Fetchers take it from there. A topic nobody is subscribed to has
    /// nothing to deliver and is not written: pings cannot grow the backlog
    /// past one row per subscribed topic.
    ///
    /// The ping's intake is traced in `span`, whose context the fetches keep.
    pub async fn ping(
        &self,
        topics: &[String],
        span: Option<traces::Intake>,
    ) -> Result<(), IntakeError> {
        let kept = span.as_ref().map(traces::Intake::kept);
        let pinged = self.request_fetches(topics, kept.as_deref()).await;
        if let Some(span) = span {
            match &pinged {
                Ok(()) => span.accepted(),
                Err(error) => span.failed(error),
            }
        }
        pinged
    }

    async fn request_fetches(
        &self,
        topics: &[String],
        kept: Option<&str>,
    ) -> Result<(), IntakeError> {
        let mut wanted = Vec::with_capacity(topics.len());
        for topic in topics {
            if self.has_audience(topic).await? {
                wanted.push(topic.clone());
            } else {
                info!(topic, "no subscribers; ping not recorded");
                metrics::counter!(FETCHES_TOTAL, "outcome" => "no_subscribers").increment(1);
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        self.inner
            .backlog
            .request_fetches(&wanted, self.inner.clock.now(), kept)
            .await?;
        self.inner.written.notify_one();
        Ok(())
    }

    /// Whether content of `topic` would reach anyone: a subscription, or a
    /// subscribe being verified (which receives it once saved).
    async fn has_audience(&self, topic: &str) -> Result<bool, IntakeError> {
        Ok(self.inner.store.has_subscriptions(topic).await?
            || self.inner.backlog.subscribing(topic).await?)
    }

    /// Claims and fetches pinged topics until `stop`; the fetches in flight
    /// then go on in [`Intake::tracker`].
    pub async fn run_fetchers(self, stop: CancellationToken) {
        let written = self.inner.written.clone();
        let tracker = self.inner.tracker.clone();
        worker::work(
            Arc::new(Fetchers(self)),
            FETCH_CONCURRENCY,
            written,
            tracker,
            stop,
        )
        .await;
    }

    async fn fetch_claimed(&self, claimed: ClaimedFetch) {
        let span = info_span!("fetch", topic = %claimed.topic, attempt = claimed.attempts + 1);
        let outcome = self
            .fetch(
                &claimed.topic,
                &claimed.validators,
                claimed.trace_context.as_deref(),
            )
            .instrument(span.clone())
            .await;
        let _entered = span.enter();
        let (result, label) = match outcome {
            Ok(Fetched::Recorded(event, validators)) => {
                info!(event = %event.id, bytes = event.body.len(), "topic content recorded");
                (
                    FetchResult::Done {
                        validators: Some(validators),
                    },
                    "recorded",
                )
            }
            Ok(Fetched::NotModified) => {
                info!("topic not modified; nothing to distribute");
                (FetchResult::Done { validators: None }, "not_modified")
            }
            Ok(Fetched::NoSubscribers) => {
                info!("no subscribers; topic not fetched");
                (FetchResult::Done { validators: None }, "no_subscribers")
            }
            Err(error @ IntakeError::TooLarge { .. }) => {
                warn!(%error, "topic fetch failed for good");
                (
                    FetchResult::Failed {
                        error: error.to_string(),
                    },
                    "failed",
                )
            }
            Err(error) => {
                let failures = claimed.attempts + 1;
                if failures < FETCH_ATTEMPTS {
                    let wait = FETCH_RETRY_WAIT * 2u32.pow(failures - 1);
                    info!(%error, ?wait, "topic fetch failed; to be tried again");
                    let at = self.inner.clock.now()
                        + chrono::TimeDelta::from_std(wait).unwrap_or(chrono::TimeDelta::MAX);
                    (
                        FetchResult::Retry {
                            at,
                            error: error.to_string(),
                        },
                        "retried",
                    )
                } else {
                    warn!(%error, attempts = failures, "topic fetch failed for good");
                    (
                        FetchResult::Failed {
                            error: error.to_string(),
                        },
                        "failed",
                    )
                }
            }
        };
        metrics::counter!(FETCHES_TOTAL, "outcome" => label).increment(1);
        if let Err(error) = self
            .inner
            .backlog
            .finish_fetch(&claimed, result, self.inner.clock.now())
            .await
        {
            // The claim expires and the topic is fetched again.
            warn!(%error, "recording a fetch's outcome failed; it will be fetched again");
        }
    }

    /// Fetches a topic once (conditionally, when it sent validators before:
    /// `known`) and records its content when it changed. A topic nobody
    /// subscribes to is not fetched, unless a subscribe to it is waiting
    /// for its verification: that subscription receives what this fetch
    /// records once it is saved. The content's intake continues the trace
    /// of the ping that asked for it (`kept`).
    pub async fn fetch(
        &self,
        topic: &str,
        known: &Validators,
        kept: Option<&str>,
    ) -> Result<Fetched, IntakeError> {
        if !self.has_audience(topic).await? {
            return Ok(Fetched::NoSubscribers);
        }
        let fetch_error = |reason: String| IntakeError::Fetch {
            topic: topic.to_owned(),
            reason,
        };
        let url = Url::parse(topic).map_err(|error| fetch_error(error.to_string()))?;
        self.inner
            .net
            .check_url(&url)
            .await
            .map_err(|error| fetch_error(error.to_string()))?;

        let mut request = self.inner.client.get(url);
        if let Some(etag) = &known.etag {
            request = request.header(http::header::IF_NONE_MATCH, etag);
        }
        if let Some(last_modified) = &known.last_modified {
            request = request.header(http::header::IF_MODIFIED_SINCE, last_modified);
        }
        let response = request
            .send()
            .await
            .map_err(|error| fetch_error(error_chain(&error)))?;
        let status = response.status();
        if status == http::StatusCode::NOT_MODIFIED {
            return Ok(Fetched::NotModified);
        }
        if !status.is_success() {
            return Err(fetch_error(status_error(status)));
        }
        let header = |name: http::HeaderName| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let content_type =
            header(http::header::CONTENT_TYPE).unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned());
        let fresh = Validators {
            etag: header(http::header::ETAG),
            last_modified: header(http::header::LAST_MODIFIED),
        };
        let body = self
            .read_bounded(response)
            .await
            .map_err(|reason| match reason {
                ReadError::TooLarge => IntakeError::TooLarge {
                    limit: self.inner.max_content_bytes,
                },
                ReadError::Failed(reason) => fetch_error(reason),
            })?;
        let span = traces::Intake::continuing(kept, "fetch", topic);
        let event = self
            .record(topic.to_owned(), content_type, body, span)
            .await?;
        Ok(Fetched::Recorded(event, fresh))
    }

    async fn read_bounded(&self, response: reqwest::Response) -> Result<Bytes, ReadError> {
        let limit = self.inner.max_content_bytes;
        if response
            .content_length()
            .is_some_and(|length| length > limit as u64)
        {
            return Err(ReadError::TooLarge);
        }
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|error| ReadError::Failed(error_chain(&error)))?;
            if body.len() + chunk.len() > limit {
                return Err(ReadError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(body))
    }
}

enum ReadError {
    TooLarge,
    Failed(String),
}

struct Fetchers(Intake);

#[async_trait]
impl Job for Fetchers {
    type Item = ClaimedFetch;

    fn name(&self) -> &'static str {
        "topic fetch"
    }

    async fn claim(&self, limit: usize) -> Result<Vec<ClaimedFetch>, BacklogError> {
        let inner = &self.0.inner;
        // A claim outlives the fetch (its timeout) and the recording.
        let visibility = inner.timeout * 2 + Duration::from_secs(5);
        inner
            .backlog
            .claim_fetches(limit, inner.clock.now(), visibility)
            .await
    }

    async fn run(&self, claimed: ClaimedFetch) {
        self.0.fetch_claimed(claimed).await;
    }
}
