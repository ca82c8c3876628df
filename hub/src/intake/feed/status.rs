//! What an operator sees of the running outbox feeds: a registry the hub
//! fills as each feed starts, read by the operator API. Each entry is the
//! feed's own dispatcher, so what it shows is what the dispatcher last saw
//! (its listener's state now, its backlog as last sampled), never a copy
//! that could drift.

use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};

use crate::delivery::outbox::{Dispatcher, WebhookDelivery, WebhookFilter};

/// The running feeds. Cheap to clone; clones share the registry.
#[derive(Debug, Clone, Default)]
pub struct Feeds(Arc<RwLock<Vec<Dispatcher>>>);

/// One feed's state, as [`Feeds::statuses`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedStatus {
    /// The outbox table, as configured (`schema.table`); it names the feed,
    /// as in the `outbox` label of the feed's gauges.
    pub outbox_table: String,
    /// The deliveries table, as configured.
    pub deliveries_table: String,
    /// The `NOTIFY` channel it listens on.
    pub channel: String,
    /// Whether its listener is connected right now (when it is not, the feed
    /// goes on by polling).
    pub listener_connected: bool,
    /// Delivery rows due, retrying or in flight, as last sampled; `None`
    /// until the first sample.
    pub backlog: Option<u64>,
    /// The age of the oldest event with such a row, in seconds, as last
    /// sampled (0 when there is none).
    pub oldest_undelivered_seconds: Option<f64>,
    /// When the backlog was last sampled.
    pub sampled_at: Option<DateTime<Utc>>,
}

impl Feeds {
    /// No feeds yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a started feed's dispatcher.
    pub fn add(&self, dispatcher: Dispatcher) {
        self.0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(dispatcher);
    }

    /// Sends webhook `subscriber`'s events recorded at or after `since` (or
    /// the one event `event_id`) again, in every feed: at most `limit` rows
    /// each (see [`Dispatcher::resend`]). Returns how many rows were
    /// re-opened.
    pub async fn resend(
        &self,
        subscriber: &str,
        since: Option<DateTime<Utc>>,
        event_id: Option<uuid::Uuid>,
        limit: usize,
    ) -> Result<u64, sqlx::Error> {
        let mut reopened = 0;
        for dispatcher in self.dispatchers() {
            reopened += dispatcher
                .resend(subscriber, since, event_id, limit)
                .await?;
        }
        Ok(reopened)
    }

    /// The webhook rows matching `filter` over every feed, newest event
    /// first, at most `limit`.
    pub async fn webhook_deliveries(
        &self,
        filter: WebhookFilter<'_>,
        limit: usize,
    ) -> Result<Vec<WebhookDelivery>, sqlx::Error> {
        let mut listed = Vec::new();
        for dispatcher in self.dispatchers() {
            listed.extend(dispatcher.webhook_deliveries(filter, limit).await?);
        }
        listed.sort_by_key(|row| std::cmp::Reverse(row.created_at));
        listed.truncate(limit);
        Ok(listed)
    }

    fn dispatchers(&self) -> Vec<Dispatcher> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Every feed's state, in the order they started.
    pub fn statuses(&self) -> Vec<FeedStatus> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .map(|dispatcher| {
                let tables = &dispatcher.config().tables;
                let sample = dispatcher.last_sample();
                FeedStatus {
                    outbox_table: tables.outbox().to_owned(),
                    deliveries_table: tables.deliveries().to_owned(),
                    channel: dispatcher.channel().to_owned(),
                    listener_connected: dispatcher.is_listening(),
                    backlog: sample.map(|sample| sample.backlog),
                    oldest_undelivered_seconds: sample
                        .map(|sample| sample.oldest_undelivered_seconds),
                    sampled_at: sample.map(|sample| sample.at),
                }
            })
            .collect()
    }
}
