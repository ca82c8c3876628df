//! One claimed row's attempt: the call of its in-process handler or the
//! POST to its webhook through the delivery core, the verdict under the
//! retry policy, and the writing back of outcomes.

use std::borrow::Cow;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::FutureExt;
use reqwest::header::HeaderValue;
use tokio::time::Instant;
use tracing::warn;

use super::Dispatcher;
use super::config::DispatcherConfig;
use super::operated::Operated;
use super::registry::{Handler, WebhookSubscriber};
use super::signals::Scan;
use crate::rows::{ClaimedRow, RowCompletion, RowOutcome};
use crate::{WebhookFormat, cloudevents};
use websub_delivery::attempt::Attempt;
use websub_delivery::attempt::{self, Attempted, Request};
use websub_delivery::client::{self, ClientIdentity, Purpose};
use websub_delivery::health::{Breaker, Gate, Tried};
use websub_delivery::limit::Reply;
use websub_delivery::recorder::{Batching, OutcomeStore};
use websub_delivery::traces;
use websub_delivery::{Verdict, error_chain};
use websub_outbox::{ENVELOPE_CONTENT_TYPE, Envelope};

impl Dispatcher {
    /// One attempt: the handler or webhook registered now for the row's
    /// (subscriber, event name), and what its answer means for the row. It
    /// is abandoned at `deadline`, before its claim could go stale.
    pub(super) async fn attempt(
        &self,
        row: &ClaimedRow,
        prepared: &Prepared,
        deadline: Instant,
    ) -> (RowOutcome, Option<Attempt>) {
        let inner = &self.inner;
        let registry = self.registry();
        let failures_before = u32::try_from(row.retry_count).unwrap_or(0);
        let recorded = row.created_at.and_utc();
        // The webhook's breaker, when the feed has one: what it let through.
        let mut gate = None;
        // How long the webhook asked the hub to wait before its next attempt.
        let mut retry_after = None;
        let verdict = if inner.config.subscriber_name.as_deref() == Some(row.subscriber.as_str()) {
            let handler = registry
                .handlers
                .get(&row.event_name)
                .or(registry.catch_all.as_ref());
            let Some(handler) = handler else {
                return (RowOutcome::Released, None);
            };
            let attempted = inner.handlers.attempting();
            let answer = self
                .call(handler.as_ref(), &prepared.envelope, deadline)
                .await;
            if let Err(error) = &answer
                && handler.retries_without_limit()
            {
                warn!(%error, event = %row.event_id, "handler failed; the event waits for it");
                return (
                    RowOutcome::Postponed {
                        error: error.clone(),
                        wait: inner.config.retry.max_backoff,
                    },
                    None,
                );
            }
            let verdict = inner
                .handlers
                .judge(attempted, recorded, answer.into(), failures_before);
            (verdict, None)
        } else {
            let subscriber = registry
                .webhooks
                .get(&row.event_name)
                .and_then(|subscribers| subscribers.get(&row.subscriber));
            // Unregistered since the claim: its rows wait, untouched, for it
            // to come back.
            let Some(subscriber) = subscriber else {
                return (RowOutcome::Released, None);
            };
            if let Some(operated) = inner.operated.get() {
                if operated.endpoints.is_disabled(&row.subscriber) {
                    return (RowOutcome::Skipped, None);
                }
                let now = chrono::Utc::now();
                match operated.endpoints.gate(&row.subscriber, now) {
                    // Open: the row waits for the probe, its retries
                    // unspent.
                    Gate::Hold(until) => {
                        inner.webhooks.postponed();
                        let wait = (until - now).to_std().unwrap_or_default();
                        return (RowOutcome::Held { wait }, None);
                    }
                    passed => gate = Some(passed),
                }
            }
            let at = chrono::Utc::now();
            let attempted = inner.webhooks.attempting();
            let answered = self
                .post(
                    &row.subscriber,
                    subscriber,
                    prepared,
                    retry_count_of(row),
                    deadline,
                )
                .await;
            let took = attempted.elapsed();
            self.observe(
                &row.subscriber,
                Reply::of(&answered, took),
                answered.retry_after,
            );
            retry_after = answered.retry_after;
            let history = Attempt {
                at,
                duration_micros: i64::try_from(took.as_micros()).unwrap_or(i64::MAX),
                status: answered.status,
                error: None,
                response: answered.response,
            };
            let verdict =
                inner
                    .webhooks
                    .judge(attempted, recorded, answered.answer, failures_before);
            (verdict, Some(history))
        };
        let (verdict, mut history) = verdict;
        let mut outcome = match verdict {
            // Only a WebSub channel judges a 410 gone.
            Verdict::Delivered | Verdict::Gone => RowOutcome::Delivered,
            Verdict::Retry { error, wait } => RowOutcome::Retry {
                error,
                wait: wait.max(retry_after.unwrap_or_default()),
            },
            Verdict::Exhausted { error } => RowOutcome::Exhausted { error },
            Verdict::Postponed { error, wait } => RowOutcome::Postponed { error, wait },
        };
        if let (Some(gate), Some(operated)) = (gate, inner.operated.get()) {
            let tried = match &outcome {
                RowOutcome::Delivered => Tried::Succeeded,
                RowOutcome::Retry { .. } | RowOutcome::Exhausted { .. } => Tried::Failed,
                _ => Tried::Neither,
            };
            let now = chrono::Utc::now();
            match operated
                .endpoints
                .tried(&row.subscriber, gate == Gate::Probe, tried, now)
            {
                Breaker::Recovered(since) => self.recovered(&row.subscriber, since),
                // Open: the failure waits with the rest, its retries not
                // spent.
                Breaker::Open(until) | Breaker::Opened(until) => {
                    if let RowOutcome::Retry { error, .. } | RowOutcome::Exhausted { error } =
                        outcome
                    {
                        outcome = RowOutcome::Postponed {
                            error,
                            wait: (until - now).to_std().unwrap_or_default(),
                        };
                    }
                }
                Breaker::Closed => {}
            }
        }
        if let Some(history) = &mut history {
            history.error = match &outcome {
                RowOutcome::Retry { error, .. } | RowOutcome::Exhausted { error } => {
                    Some(error.clone())
                }
                _ => None,
            };
        }
        (outcome, history)
    }

    /// `subscriber`'s webhook answered again after failing since `since`:
    /// its waiting rows are due now and, when the feed re-sends them, the
    /// rows that ran out of retries meanwhile start again. In the
    /// background, so that the attempt that found it out is not held up.
    fn recovered(&self, subscriber: &str, since: chrono::DateTime<chrono::Utc>) {
        let dispatcher = self.clone();
        let subscriber = subscriber.to_owned();
        tokio::spawn(async move {
            let inner = &dispatcher.inner;
            let Some(operated) = inner.operated.get() else {
                return;
            };
            let reopen = operated.to_reopen(&subscriber, since).await;
            match inner
                .queries
                .release_subscriber(&inner.pool, &subscriber, &reopen)
                .await
            {
                Ok(released) => {
                    Operated::released(&subscriber, released, reopen.len());
                    dispatcher.request(Scan::None);
                }
                Err(error) => {
                    warn!(%error, subscriber, "releasing the rows of a recovered webhook failed; they follow at their own times")
                }
            }
        });
    }

    pub(super) async fn call(
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

    /// The client of a subscriber with a certificate of its own: made at
    /// its first delivery and again when its certificate changes; those of
    /// subscribers no longer registered go when one is made.
    fn own_client(
        &self,
        name: &str,
        identity: &ClientIdentity,
    ) -> Result<reqwest::Client, websub_delivery::net::NetError> {
        let mut clients = self
            .inner
            .own_clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((made_for, client)) = clients.get(name)
            && made_for == identity
        {
            return Ok(client.clone());
        }
        let config = &self.inner.config;
        let client = client::build(
            Purpose::Deliveries {
                policy: config.network.clone(),
                max_idle_per_host: config.per_subscriber,
            },
            config.delivery_timeout,
            &config.trust.clone().with_identity(Some(identity.clone())),
        )?;
        let registry = self.registry();
        clients.retain(|known, _| registry.names.contains(known));
        clients.insert(name.to_owned(), (identity.clone(), client.clone()));
        Ok(client)
    }

    /// One webhook POST: the envelope, its signature when a secret is
    /// configured, the event id, and the configured headers.
    pub(super) async fn post(
        &self,
        name: &str,
        subscriber: &WebhookSubscriber,
        prepared: &Prepared,
        resend_count: u32,
        deadline: Instant,
    ) -> Attempted {
        let client = match &subscriber.identity {
            None => self
                .inner
                .client
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
            Some(identity) => match self.own_client(name, identity) {
                Ok(client) => client,
                Err(error) => {
                    return Attempted {
                        answer: attempt::Answer::Failed(format!(
                            "no client with its certificate: {error}"
                        )),
                        status: None,
                        response: Bytes::new(),
                        retry_after: None,
                    };
                }
            },
        };
        let (content_type, body, headers) = match subscriber.format {
            WebhookFormat::Envelope => (
                ENVELOPE_CONTENT_TYPE,
                prepared.body.clone(),
                Cow::Borrowed(self.inner.headers.as_slice()),
            ),
            WebhookFormat::CloudEventsStructured => (
                cloudevents::STRUCTURED_CONTENT_TYPE,
                cloudevents::structured(&prepared.envelope),
                Cow::Borrowed(self.inner.headers.as_slice()),
            ),
            WebhookFormat::CloudEventsBinary => {
                let (mut headers, body) = cloudevents::binary(&prepared.envelope);
                headers.extend(self.inner.headers.iter().cloned());
                (cloudevents::DATA_CONTENT_TYPE, body, Cow::Owned(headers))
            }
        };
        let request = Request {
            url: subscriber.url.as_str(),
            scheme: self.inner.scheme,
            content_type: HeaderValue::from_static(content_type),
            event_id: prepared.event_id.clone(),
            body,
            secret: self.inner.signing_key.as_deref(),
            previous_secret: self.inner.previous_key.as_deref(),
            headers: &headers,
            parent: traces::outbox_parent(prepared.envelope.event_id),
            resend_count,
        };
        attempt::post(
            attempt::Carrier::Reqwest(&client),
            request,
            self.inner.config.delivery_timeout,
            Some(deadline),
        )
        .await
    }
}

/// The failed attempts a claimed row has behind it.
fn retry_count_of(row: &ClaimedRow) -> u32 {
    u32::try_from(row.retry_count).unwrap_or(0)
}

/// An event ready to deliver: its envelope and the exact body, built once
/// for all of a batch's rows of that event.
#[derive(Debug)]
pub(super) struct Prepared {
    pub(super) event_id: HeaderValue,
    pub(super) envelope: Envelope,
    pub(super) body: Bytes,
}

impl Prepared {
    pub(super) fn new(row: &ClaimedRow) -> Self {
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

pub(super) fn completion(
    row: &ClaimedRow,
    (outcome, attempt): (RowOutcome, Option<Attempt>),
) -> RowCompletion {
    RowCompletion {
        event_id: row.event_id,
        subscriber: row.subscriber.clone(),
        claimed_at: row.claimed_at,
        outcome,
        attempt,
    }
}

/// How outbox outcomes are written: into the producer's own database,
/// whose commits the producers wait on, so one writer gathers for longer and
/// writes larger batches, costing the producers fewer statements (gathering
/// for 60 ms instead of 20 measured no better).
pub(super) fn batching(config: &DispatcherConfig) -> Batching {
    Batching {
        limit: config.batch_size.max(1) * 4,
        gathering: Duration::from_millis(20),
        writers: 1,
    }
}

/// The producer's deliveries table as the recorder writes to it.
#[derive(Debug)]
pub(super) struct RowOutcomes(pub(super) Dispatcher);

#[async_trait]
impl OutcomeStore for RowOutcomes {
    type Entry = RowCompletion;

    async fn write(&self, batch: &[RowCompletion]) -> Result<(), String> {
        let inner = &self.0.inner;
        inner
            .queries
            .complete(&inner.pool, batch)
            .await
            .map_err(|error| error.to_string())?;
        if let Some(operated) = inner.operated.get() {
            operated.record(batch).await;
        }
        // An ordered subscriber's next row is claimed only once this one's
        // outcome is written: the claim looks for it now.
        let registry = self.0.registry();
        if batch
            .iter()
            .any(|completion| registry.is_ordered(&completion.subscriber))
        {
            self.0.request(Scan::None);
        }
        Ok(())
    }

    fn retry_in(&self, completion: &RowCompletion) -> Option<Duration> {
        match completion.outcome {
            RowOutcome::Retry { wait, .. }
            | RowOutcome::Postponed { wait, .. }
            | RowOutcome::Held { wait } => Some(wait),
            _ => None,
        }
    }

    fn wake(&self) {
        self.0.request(Scan::None);
    }
}
