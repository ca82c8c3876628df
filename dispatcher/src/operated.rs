//! What an outbox dispatcher run by the hub adds for operators, through the
//! delivery core: each webhook attempt kept in the hub's log (the rows
//! themselves are the producer's), the webhooks' health tallied there, and,
//! when the feed asks for it (beyond the messaging contract), a breaker per
//! webhook and the re-sending of what ran out of retries while it failed.
//!
//! Which rows wait on an open breaker and which ran out of retries is told
//! by the hub's own records, never by a mark in the producer's table: a
//! held row keeps its next attempt (it is postponed, its retries unspent),
//! and the rows to re-open after a recovery are those the hub's attempt
//! history shows were attempted since the webhook began failing.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tracing::{info, warn};

use super::config::DispatcherConfig;
use crate::rows::{RowCompletion, RowOutcome};
use websub_delivery::health::{BreakerPolicy, Tallied};
use websub_delivery::state::{EndpointStates, WebhookAttempt};
use websub_delivery::{Channel, Endpoints};

/// The most exhausted rows one recovery re-opens: a webhook down long
/// enough to exhaust more than this many has an operator's attention (and
/// `websub endpoints` to replay them).
pub(super) const RESEND_LIMIT: usize = 10_000;

/// The hub's log, for one dispatcher's webhooks.
#[derive(Debug)]
pub(super) struct Operated {
    events: Arc<dyn EndpointStates>,
    pub(super) endpoints: Endpoints,
    /// Whether a recovery re-opens the rows exhausted while failing.
    resend_exhausted: bool,
    /// The longest an attempt takes: the first failure of an outage is
    /// counted when it ends, and it began up to this much earlier.
    attempt_time: std::time::Duration,
}

impl Operated {
    pub(super) fn new(
        events: Arc<dyn EndpointStates>,
        disable_after: u32,
        config: &DispatcherConfig,
    ) -> Self {
        // Never disabled for a long outage: the contract keeps every row.
        let breaker = BreakerPolicy {
            open_after: config.breaker_open_after,
            disable_after: std::time::Duration::ZERO,
        };
        Self {
            endpoints: Endpoints::with_breakers(
                events.clone(),
                Channel::Webhook,
                disable_after,
                breaker,
            ),
            events,
            resend_exhausted: config.resend_exhausted,
            attempt_time: config.delivery_timeout,
        }
    }

    /// The events whose rows for `subscriber` are to be re-opened, now
    /// that it answered again after failing since `since`: none unless the
    /// feed re-sends exhausted rows.
    pub(super) async fn to_reopen(
        &self,
        subscriber: &str,
        since: DateTime<Utc>,
    ) -> Vec<uuid::Uuid> {
        if !self.resend_exhausted {
            return Vec::new();
        }
        // The history keeps when each attempt began; the breaker, when the
        // first failure ended.
        let since = since
            - chrono::Duration::from_std(self.attempt_time).unwrap_or(chrono::Duration::zero());
        match self
            .events
            .webhook_events_attempted_since(subscriber, since, RESEND_LIMIT)
            .await
        {
            Ok(events) => events,
            Err(error) => {
                warn!(%error, subscriber, "reading what a recovered webhook missed failed; its exhausted rows stay as they are");
                Vec::new()
            }
        }
    }

    /// Says what a recovery released.
    pub(super) fn released(subscriber: &str, released: u64, reopened: usize) {
        info!(
            subscriber,
            released, reopened, "sending what waited for a recovered webhook"
        );
    }

    /// Keeps a written batch's attempts and counts its outcomes. Neither
    /// holds up delivery: a failure is logged, and the rows stay recorded in
    /// the producer's database.
    pub(super) async fn record(&self, batch: &[RowCompletion]) {
        let kept: Vec<WebhookAttempt<'_>> = batch
            .iter()
            .filter_map(|completion| {
                Some(WebhookAttempt {
                    event_id: completion.event_id,
                    subscriber: &completion.subscriber,
                    attempt: completion.attempt.as_ref()?,
                })
            })
            .collect();
        if let Err(error) = self.events.keep_webhook_attempts(&kept).await {
            warn!(%error, attempts = kept.len(), "keeping webhook attempts failed");
        }
        let now = chrono::Utc::now();
        let tallied = batch
            .iter()
            .filter_map(|completion| match &completion.outcome {
                RowOutcome::Delivered if completion.attempt.is_some() => {
                    Some(Tallied::Delivered(&completion.subscriber))
                }
                RowOutcome::Exhausted { error } if completion.attempt.is_some() => {
                    Some(Tallied::Exhausted {
                        endpoint: &completion.subscriber,
                        error,
                    })
                }
                _ => None,
            });
        self.endpoints.tally(tallied, now).await;
    }
}
