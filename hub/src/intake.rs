//! Content intake: publish pings (the hub fetches each topic and records its
//! content) and fat pings (the publisher sends the content). Whatever is
//! accepted is recorded in the durable event log before anyone is told so;
//! the dispatcher takes it from there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};
use url::Url;
use websub_store::SubscriptionStore;

use crate::clock::Clock;
use crate::delivery::attempt::status_error;
use crate::delivery::error_chain;
use crate::dispatch::Distributor;
use crate::events::{EventLog, EventLogError, LoggedEvent, NewEvent};
use crate::net::NetPolicy;

/// The Content-Type recorded when a topic answers without one.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// How many times a failing topic fetch is tried.
const FETCH_ATTEMPTS: u32 = 3;

/// Accepts content for distribution. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Intake {
    inner: Arc<IntakeState>,
}

#[derive(Debug)]
struct IntakeState {
    events: Arc<dyn EventLog>,
    store: Arc<dyn SubscriptionStore>,
    dispatcher: Distributor,
    client: reqwest::Client,
    net: NetPolicy,
    clock: Arc<dyn Clock>,
    max_content_bytes: usize,
    validators: Mutex<HashMap<String, Validators>>,
    tracker: TaskTracker,
}

/// What a topic answered last time, for a conditional fetch.
#[derive(Debug, Clone, Default)]
struct Validators {
    etag: Option<String>,
    last_modified: Option<String>,
}

/// What a topic fetch came to.
#[derive(Debug)]
#[non_exhaustive]
pub enum Fetched {
    /// New content, recorded.
    Recorded(LoggedEvent),
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
}

impl Intake {
    /// Intake recording into `events` and waking `dispatcher`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        events: Arc<dyn EventLog>,
        store: Arc<dyn SubscriptionStore>,
        dispatcher: Distributor,
        client: reqwest::Client,
        net: NetPolicy,
        clock: Arc<dyn Clock>,
        max_content_bytes: usize,
    ) -> Self {
        Self {
            inner: Arc::new(IntakeState {
                events,
                store,
                dispatcher,
                client,
                net,
                clock,
                max_content_bytes,
                validators: Mutex::new(HashMap::new()),
                tracker: TaskTracker::new(),
            }),
        }
    }

    /// The fetches in flight, for draining at shutdown.
    pub fn tracker(&self) -> &TaskTracker {
        &self.inner.tracker
    }

    /// Records content the publisher sent itself (a fat ping). Returns once
    /// the event is durable.
    pub async fn record(
        &self,
        topic: String,
        content_type: String,
        body: Bytes,
    ) -> Result<LoggedEvent, IntakeError> {
        if body.len() > self.inner.max_content_bytes {
            return Err(IntakeError::TooLarge {
                limit: self.inner.max_content_bytes,
            });
        }
        let event = self
            .inner
            .events
            .record(
                NewEvent {
                    topic,
                    content_type,
                    body,
                },
                self.inner.clock.now(),
            )
            .await?;
        metrics::counter!("websub_events_recorded_total").increment(1);
        self.inner.dispatcher.wake();
        Ok(event)
    }

    /// Fetches each pinged topic in the background and records what is new.
    pub fn ping(&self, topics: Vec<String>) {
        for topic in topics {
            let intake = self.clone();
            let span = info_span!("fetch", topic = %topic);
            self.inner.tracker.spawn(
                async move {
                    match intake.fetch_with_retries(&topic).await {
                        Ok(Fetched::Recorded(event)) => {
                            info!(event = %event.id, bytes = event.body.len(), "topic content recorded");
                        }
                        Ok(Fetched::NotModified) => info!("topic not modified; nothing to distribute"),
                        Ok(Fetched::NoSubscribers) => info!("no subscribers; topic not fetched"),
                        Err(error) => warn!(%error, "publish ping dropped"),
                    }
                }
                .instrument(span),
            );
        }
    }

    async fn fetch_with_retries(&self, topic: &str) -> Result<Fetched, IntakeError> {
        let mut attempt = 1;
        loop {
            match self.fetch(topic).await {
                Err(IntakeError::Fetch { reason, .. }) if attempt < FETCH_ATTEMPTS => {
                    info!(%reason, attempt, "topic fetch failed; retrying");
                    tokio::time::sleep(Duration::from_secs(u64::from(attempt))).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Fetches a topic once (conditionally, when it sent validators before)
    /// and records its content when it changed.
    pub async fn fetch(&self, topic: &str) -> Result<Fetched, IntakeError> {
        if self.inner.store.list_by_topic(topic).await?.is_empty() {
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

        let known = self.validators(topic);
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
        let event = self.record(topic.to_owned(), content_type, body).await?;
        self.remember(topic, fresh);
        Ok(Fetched::Recorded(event))
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

    fn validators(&self, topic: &str) -> Validators {
        self.inner
            .validators
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(topic)
            .cloned()
            .unwrap_or_default()
    }

    fn remember(&self, topic: &str, validators: Validators) {
        let mut known = self
            .inner
            .validators
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if validators.etag.is_none() && validators.last_modified.is_none() {
            known.remove(topic);
        } else {
            known.insert(topic.to_owned(), validators);
        }
    }
}

enum ReadError {
    TooLarge,
    Failed(String),
}
