//! The operator webhook: every endpoint change kept in the history
//! ([`super::changes`]) is POSTed, as JSON and signed the Standard Webhooks
//! way (`webhook-id`, `webhook-timestamp`, `webhook-signature`), to one URL
//! the operator configures (`--operator-webhook`).
//!
//! It is an endpoint like any other, on a channel of its own
//! ([`Channel::Operator`]): one small task claims the changes not yet sent
//! from the history (so a change recorded before a restart is sent after
//! it, and replicas sharing PostgreSQL never send one twice at once),
//! attempts each through the delivery core (the attempt, the retry policy,
//! the judge and its metrics), and keeps a breaker of its own: after
//! [`DEFAULT_OPEN_AFTER`] failed attempts in a row the changes wait,
//! their retries unspent, while one probes the webhook now and then. Its
//! own changes (failing, open, recovered) are recorded and sent like any
//! other's. Nothing of this runs on a delivery's path: a dead operator
//! webhook costs callbacks nothing.
//!
//! Its backlog is bounded: of the changes not yet sent, at most
//! [`MAX_UNSENT`] are kept for it, and none older than [`MAX_UNSENT_AGE`];
//! the rest are marked dropped, counted in
//! `websub_operator_webhook_deliveries_total{outcome="dropped"}` and
//! logged. Delivery is at least once, in order while the webhook answers;
//! a change retried may arrive after later ones, which its `id` and `at`
//! order.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::HeaderValue;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::attempt::{self, Request, STANDARD_WEBHOOKS_SCHEME};
use super::health::{Breaker, BreakerPolicy, DEFAULT_OPEN_AFTER, Gate, Tried};
use super::{Channel, Endpoints, Judge, RetryPolicy, Verdict};
use crate::clock::Clock;
use crate::history::{EndpointChange, EndpointState, Sent};
use crate::state::EndpointStates;

/// `websub_operator_webhook_deliveries_total{outcome}`: endpoint changes
/// sent to the operator webhook, by outcome: `delivered`, `retried`,
/// `held` (its breaker is open: waiting, no retry spent), `failed` (out of
/// retries) and `dropped` (past the backlog's bound or age).
pub const OPERATOR_WEBHOOK_DELIVERIES_TOTAL: &str = "websub_operator_webhook_deliveries_total";

/// The most changes kept waiting for the operator webhook; the oldest
/// beyond it are dropped.
pub const MAX_UNSENT: usize = 10_000;

/// The oldest a change waiting for the operator webhook may be; older ones
/// are dropped (a webhook configured after a long time without one does
/// not receive the history of the months before).
pub const MAX_UNSENT_AGE: Duration = Duration::from_secs(86_400);

/// Changes claimed at a time.
const CLAIM: usize = 16;

/// How often the sender looks for changes when it found none.
const POLL: Duration = Duration::from_secs(1);

/// How often the backlog's bound is applied.
const SHED_EVERY: Duration = Duration::from_secs(30);

/// The body of one POST: the change as the history keeps it, and the hub
/// it comes from.
#[derive(Debug, Serialize)]
pub struct ChangeBody<'a> {
    /// Always `endpoint.changed`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The change's place in the history: later changes have higher ids.
    pub id: i64,
    /// The hub's public URL.
    pub hub: &'a str,
    /// `websub`, `webhook` or `operator`.
    pub channel: &'a str,
    /// The callback URL, or the webhook's name or URL.
    pub endpoint: &'a str,
    /// What it became.
    pub to: EndpointState,
    /// When.
    pub at: DateTime<Utc>,
    /// Failures in a row so far, when the change counts them.
    pub failures: Option<u32>,
    /// Failing (or open) since.
    pub since: Option<DateTime<Utc>>,
    /// The last error, or why it was disabled.
    pub reason: Option<&'a str>,
    /// What made the change: `breaker`, `tally`, `outage` or `operator`.
    pub source: Option<&'a str>,
}

impl<'a> ChangeBody<'a> {
    /// The body of `change`, from the hub at `hub`.
    pub fn of(change: &'a EndpointChange, hub: &'a str) -> Self {
        Self {
            kind: "endpoint.changed",
            id: change.id,
            hub,
            channel: &change.channel,
            endpoint: &change.endpoint,
            to: change.to,
            at: change.at,
            failures: change.failures,
            since: change.since,
            reason: change.reason.as_deref(),
            source: change.source.as_deref(),
        }
    }
}

/// The `webhook-id` of a change: stable across its retries, so a receiver
/// can de-duplicate.
pub fn message_id(change: &EndpointChange) -> String {
    format!("endpoint-change-{}", change.id)
}

/// The operator webhook's sender. Cheap to clone.
#[derive(Debug, Clone)]
pub struct OperatorWebhook {
    inner: Arc<Sender>,
}

#[derive(Debug)]
struct Sender {
    url: String,
    key: Vec<u8>,
    /// The key `key` replaces, during a rotation: each request is signed
    /// with both.
    previous_key: Option<Vec<u8>>,
    hub: String,
    client: reqwest::Client,
    timeout: Duration,
    events: Arc<dyn EndpointStates>,
    endpoints: Endpoints,
    judge: Judge,
    clock: Arc<dyn Clock>,
}

impl OperatorWebhook {
    /// A sender of `events`' changes to `url`, signed with the Standard
    /// Webhooks key of `keys` (and with the key it replaces, the second,
    /// during a rotation), from the hub at `hub`, through `client` with
    /// `timeout` per attempt and `retry` after failures.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        url: String,
        (key, previous_key): (Vec<u8>, Option<Vec<u8>>),
        hub: String,
        client: reqwest::Client,
        timeout: Duration,
        retry: RetryPolicy,
        events: Arc<dyn EndpointStates>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        // Never disabled: a webhook back from any outage gets what waited.
        let breaker = BreakerPolicy {
            open_after: DEFAULT_OPEN_AFTER,
            disable_after: Duration::ZERO,
        };
        Self {
            inner: Arc::new(Sender {
                endpoints: Endpoints::with_breakers(events.clone(), Channel::Operator, 0, breaker),
                judge: Judge::new(Channel::Operator, retry),
                url,
                key,
                previous_key,
                hub,
                client,
                timeout,
                events,
                clock,
            }),
        }
    }

    /// The webhook's health (its breaker).
    pub fn endpoints(&self) -> &Endpoints {
        &self.inner.endpoints
    }

    /// Sends changes until `shutdown`; an attempt under way is finished
    /// first.
    pub async fn run(self, shutdown: CancellationToken) {
        let sender = &self.inner;
        let mut shed_at: Option<tokio::time::Instant> = None;
        info!(url = %sender.url, "sending endpoint changes to the operator webhook");
        while !shutdown.is_cancelled() {
            if shed_at.is_none_or(|at| at.elapsed() >= SHED_EVERY) {
                sender.shed().await;
                shed_at = Some(tokio::time::Instant::now());
            }
            let now = sender.clock.now();
            let gate = sender.endpoints.gate(&sender.url, now);
            if let Gate::Hold(until) = gate {
                let wait = (until - now).to_std().unwrap_or_default().max(POLL / 10);
                if sleep_or_stop(wait, &shutdown).await {
                    break;
                }
                continue;
            }
            let probe = gate == Gate::Probe;
            let limit = if probe { 1 } else { CLAIM };
            // Long enough for every claimed change's attempt, one after
            // the other, and then some: a claim that runs out is another
            // replica's to take.
            let claim_for = sender.timeout * u32::try_from(limit + 1).unwrap_or(u32::MAX);
            let until = now + chrono::Duration::from_std(claim_for).unwrap_or_default();
            let claimed = match sender
                .events
                .changes()
                .claim_unsent(now, until, limit)
                .await
            {
                Ok(claimed) => claimed,
                Err(error) => {
                    warn!(%error, "claiming endpoint changes for the operator webhook failed");
                    Vec::new()
                }
            };
            if claimed.is_empty() {
                if probe {
                    sender
                        .endpoints
                        .tried(&sender.url, true, Tried::Neither, now);
                }
                if sleep_or_stop(POLL, &shutdown).await {
                    break;
                }
                continue;
            }
            let mut settled = Vec::with_capacity(claimed.len());
            let mut claimed = claimed.into_iter();
            let mut probing = probe;
            for change in claimed.by_ref() {
                let (sent, breaker) = sender.send(&change, probing).await;
                probing = false;
                settled.push((change.id, sent));
                if matches!(breaker, Breaker::Open(_) | Breaker::Opened(_))
                    || shutdown.is_cancelled()
                {
                    break;
                }
            }
            // What this round did not attempt goes back, due as it was.
            settled.extend(claimed.map(|change| (change.id, Sent::Released)));
            if let Err(error) = sender.events.changes().settle_sent(&settled).await {
                warn!(%error, "recording what the operator webhook was sent failed; the changes are sent again when their claims run out");
            }
        }
    }
}

/// Sleeps `wait`, or less if `shutdown` comes first; whether it came.
async fn sleep_or_stop(wait: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}

fn count(outcome: &'static str, by: u64) {
    metrics::counter!(OPERATOR_WEBHOOK_DELIVERIES_TOTAL, "outcome" => outcome).increment(by);
}

impl Sender {
    /// Drops what the backlog holds beyond its bounds.
    async fn shed(&self) {
        let oldest = self.clock.now()
            - chrono::Duration::from_std(MAX_UNSENT_AGE).unwrap_or(chrono::Duration::MAX);
        match self.events.changes().shed_unsent(MAX_UNSENT, oldest).await {
            Ok(0) => {}
            Ok(dropped) => {
                count("dropped", dropped);
                warn!(
                    dropped,
                    max = MAX_UNSENT,
                    "endpoint changes dropped unsent: more were waiting for the operator \
                     webhook than are kept, or for longer"
                );
            }
            Err(error) => warn!(%error, "bounding the operator webhook's backlog failed"),
        }
    }

    /// One attempt of `change` (the probe of an open breaker when `probe`):
    /// what to record of it, and what the breaker made of it.
    async fn send(&self, change: &EndpointChange, probe: bool) -> (Sent, Breaker) {
        let body = match serde_json::to_vec(&ChangeBody::of(change, &self.hub)) {
            Ok(body) => Bytes::from(body),
            Err(error) => {
                return (
                    Sent::Failed {
                        error: format!("the change could not be written as JSON: {error}"),
                    },
                    Breaker::Closed,
                );
            }
        };
        let id = message_id(change);
        let request = Request {
            url: &self.url,
            scheme: &STANDARD_WEBHOOKS_SCHEME,
            content_type: HeaderValue::from_static("application/json"),
            event_id: HeaderValue::from_str(&id)
                .unwrap_or_else(|_| HeaderValue::from_static("endpoint-change")),
            body,
            secret: Some(&self.key),
            previous_secret: self.previous_key.as_deref(),
            headers: &[],
            parent: None,
            resend_count: 0,
        };
        let in_flight = self.judge.attempting();
        let attempted = attempt::post(
            attempt::Carrier::Reqwest(&self.client),
            request,
            self.timeout,
            None,
        )
        .await;
        let retry_after = attempted.retry_after.unwrap_or_default();
        let verdict = self.judge.judge(
            in_flight,
            change.at,
            attempted.answer,
            change.webhook_retries,
        );
        let (tried, error) = match &verdict {
            Verdict::Delivered | Verdict::Gone => (Tried::Succeeded, None),
            Verdict::Retry { error, .. } | Verdict::Exhausted { error } => {
                (Tried::Failed, Some(error.as_str()))
            }
            Verdict::Postponed { .. } => (Tried::Neither, None),
        };
        let now = self.clock.now();
        let breaker = self
            .endpoints
            .tried_because(&self.url, probe, tried, error, now);
        let held = match breaker {
            Breaker::Open(until) | Breaker::Opened(until) => Some(until),
            Breaker::Closed | Breaker::Recovered(_) => None,
        };
        let after = |wait: Duration| now + chrono::Duration::from_std(wait).unwrap_or_default();
        let sent = match verdict {
            Verdict::Delivered | Verdict::Gone => {
                count("delivered", 1);
                Sent::Delivered(now)
            }
            Verdict::Retry { error, .. } | Verdict::Exhausted { error } if held.is_some() => {
                count("held", 1);
                Sent::Retry {
                    error,
                    next_attempt_at: held.unwrap_or(now),
                    counted: false,
                }
            }
            Verdict::Retry { error, wait } => {
                count("retried", 1);
                Sent::Retry {
                    error,
                    next_attempt_at: after(wait.max(retry_after)),
                    counted: true,
                }
            }
            Verdict::Exhausted { error } => {
                count("failed", 1);
                warn!(id = change.id, %error, "the operator webhook did not take an endpoint change; no retries left");
                Sent::Failed { error }
            }
            Verdict::Postponed { error, wait } => Sent::Retry {
                error,
                next_attempt_at: after(wait),
                counted: false,
            },
        };
        (sent, breaker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::WebhookState;

    #[test]
    fn the_body_names_the_change_and_its_hub() {
        let change = EndpointChange {
            id: 42,
            channel: "websub".to_owned(),
            endpoint: "http://subscriber.example/cb".to_owned(),
            to: EndpointState::Open,
            at: DateTime::from_timestamp(1_800_000_000, 0).expect("time"),
            failures: Some(5),
            since: DateTime::from_timestamp(1_799_999_990, 0),
            reason: Some("HTTP 503 Service Unavailable".to_owned()),
            source: Some("breaker".to_owned()),
            webhook_state: WebhookState::Pending,
            webhook_retries: 0,
            webhook_error: None,
            delivered_at: None,
        };
        let body =
            serde_json::to_value(ChangeBody::of(&change, "https://hub.example/")).expect("json");
        assert_eq!(
            body,
            serde_json::json!({
                "type": "endpoint.changed",
                "id": 42,
                "hub": "https://hub.example/",
                "channel": "websub",
                "endpoint": "http://subscriber.example/cb",
                "to": "open",
                "at": "2027-01-15T08:00:00Z",
                "failures": 5,
                "since": "2027-01-15T07:59:50Z",
                "reason": "HTTP 503 Service Unavailable",
                "source": "breaker",
            })
        );
        assert_eq!(message_id(&change), "endpoint-change-42");
    }
}
