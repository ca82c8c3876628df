//! What an outbox dispatcher run by the hub adds for operators, through the
//! delivery core: each webhook attempt kept in the hub's log (the rows
//! themselves are the producer's), and the webhooks' health tallied there.

use std::sync::Arc;

use tracing::warn;

use super::super::sql::{RowCompletion, RowOutcome};
use crate::delivery::health::Tallied;
use crate::delivery::{Channel, Endpoints};
use crate::events::{EventLog, WebhookAttempt};

/// The hub's log, for one dispatcher's webhooks.
#[derive(Debug)]
pub(super) struct Operated {
    events: Arc<dyn EventLog>,
    pub(super) endpoints: Endpoints,
}

impl Operated {
    pub(super) fn new(events: Arc<dyn EventLog>, disable_after: u32) -> Self {
        Self {
            endpoints: Endpoints::new(events.clone(), Channel::Webhook, disable_after),
            events,
        }
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
