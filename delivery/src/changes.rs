//! Endpoint state changes as the delivery core records them: each change
//! an endpoint's health goes through ([`EndpointState`]) is counted in
//! `websub_endpoint_changes_total{channel, to}` and kept in the history
//! ([`crate::history::EndpointChanges`]), from where the optional operator
//! webhook ([`super::operator`]) sends it.
//!
//! Changes found on the attempt path (a breaker that opens, a callback that
//! answers again) never wait for the database: they go into a bounded
//! queue ([`CHANGE_QUEUE`]) that one writer task empties in batches. A full
//! queue (the database far behind) drops the change, counted in
//! `websub_endpoint_changes_dropped_total` and logged, rather than slow a
//! delivery. Changes an operator makes (disable, enable) and the hub's own
//! decisions off the attempt path (a long outage) are written before the
//! call returns.
//!
//! A `failing` change is recorded in stages as failures accumulate, not at
//! each one: see [`failing_stage`].

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::warn;

use crate::history::{EndpointState, NewChange};
use crate::state::EndpointStates;

/// `websub_endpoint_changes_total{channel, to}`: endpoint state changes,
/// by channel and the state changed to (`failing`, `open`, `recovered`,
/// `disabled`, `enabled`).
pub const ENDPOINT_CHANGES_TOTAL: &str = "websub_endpoint_changes_total";

/// `websub_endpoint_changes_dropped_total{channel}`: changes counted but
/// not kept, the queue to the history being full (or its writes failing).
pub const ENDPOINT_CHANGES_DROPPED_TOTAL: &str = "websub_endpoint_changes_dropped_total";

/// Changes waiting to be written at most, per set of endpoints.
pub const CHANGE_QUEUE: usize = 1024;

/// Changes written per round trip at most.
const WRITE_BATCH: usize = 256;

/// Attempts at writing one batch before it is dropped: the database may be
/// away for a moment (a failover), not for long with changes to keep.
const WRITE_ATTEMPTS: u32 = 3;

/// The pause between them.
const WRITE_RETRY_WAIT: Duration = Duration::from_secs(1);

/// Whether `failures` failed attempts in a row are the stage at which a
/// `failing` change is recorded, for a breaker that opens at `open_after`:
/// half way to opening (rounded up), when that lies before it. With the
/// default of 5, an endpoint is recorded failing at 3 failures and open at
/// 5; a blip of a failure or two, common on a large hub, records nothing.
/// Without a breaker (`open_after` 0), the first exhausted delivery is the
/// stage.
pub fn failing_stage(failures: u32, open_after: u32) -> bool {
    match open_after {
        0 => failures == 1,
        _ => {
            let stage = open_after.div_ceil(2);
            stage < open_after && failures == stage
        }
    }
}

/// Whether `failures` in a row have reached [`failing_stage`], so that an
/// answer now is a recovery worth recording.
pub fn was_failing(failures: u32, open_after: u32) -> bool {
    match open_after {
        0 => failures >= 1,
        _ => failures >= open_after.div_ceil(2).min(open_after),
    }
}

/// Where one set of endpoints records its changes. Cheap to clone; clones
/// share the queue.
#[derive(Debug, Clone)]
pub struct ChangeSink {
    inner: Arc<SinkState>,
}

#[derive(Debug)]
struct SinkState {
    events: Arc<dyn EndpointStates>,
    /// The queue to the writer, which starts with the first change queued
    /// (so a sink made outside a runtime, or never used, costs no task).
    queue: OnceLock<mpsc::Sender<NewChange>>,
}

impl ChangeSink {
    /// A sink writing to `events`' history.
    pub fn new(events: Arc<dyn EndpointStates>) -> Self {
        Self {
            inner: Arc::new(SinkState {
                events,
                queue: OnceLock::new(),
            }),
        }
    }

    /// Counts `change` and queues it for the history without waiting: a
    /// full queue drops it (counted and logged).
    pub fn record(&self, change: NewChange) {
        counted(&change);
        let queue = self.inner.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::channel(CHANGE_QUEUE);
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(write(self.inner.events.clone(), receiver));
                }
                // No runtime to write from: every change is dropped, and
                // said so below.
                Err(_) => drop(receiver),
            }
            sender
        });
        if let Err(refused) = queue.try_send(change) {
            let change = match refused {
                mpsc::error::TrySendError::Full(change)
                | mpsc::error::TrySendError::Closed(change) => change,
            };
            dropped(
                change.channel,
                1,
                "the queue of endpoint changes is full: this one is counted but not kept",
            );
            warn!(
                channel = change.channel,
                endpoint = change.endpoint,
                to = change.to.as_str(),
                "endpoint change not kept"
            );
        }
    }

    /// Counts `change` and writes it to the history before returning; a
    /// failure to write is logged and counted, not returned: the change
    /// itself has been made.
    pub async fn record_now(&self, change: NewChange) {
        counted(&change);
        if let Err(error) = self
            .inner
            .events
            .changes()
            .append_changes(std::slice::from_ref(&change))
            .await
        {
            warn!(%error, channel = change.channel, endpoint = change.endpoint,
                to = change.to.as_str(), "keeping an endpoint change failed");
            metrics::counter!(ENDPOINT_CHANGES_DROPPED_TOTAL, "channel" => change.channel)
                .increment(1);
        }
    }
}

fn counted(change: &NewChange) {
    metrics::counter!(ENDPOINT_CHANGES_TOTAL,
        "channel" => change.channel, "to" => change.to.as_str())
    .increment(1);
}

fn dropped(channel: &'static str, count: usize, why: &str) {
    metrics::counter!(ENDPOINT_CHANGES_DROPPED_TOTAL, "channel" => channel)
        .increment(u64::try_from(count).unwrap_or(u64::MAX));
    warn!(channel, count, "{why}");
}

/// Writes what the queue brings, in batches, until every sender is gone.
async fn write(events: Arc<dyn EndpointStates>, mut queue: mpsc::Receiver<NewChange>) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while queue.recv_many(&mut batch, WRITE_BATCH).await > 0 {
        let mut attempt = 1;
        loop {
            match events.changes().append_changes(&batch).await {
                Ok(()) => break,
                Err(error) if attempt < WRITE_ATTEMPTS => {
                    warn!(%error, attempt, "keeping endpoint changes failed; trying again");
                    attempt += 1;
                    tokio::time::sleep(WRITE_RETRY_WAIT).await;
                }
                Err(error) => {
                    warn!(%error, "keeping endpoint changes failed; they are counted, not kept");
                    if let Some(first) = batch.first() {
                        dropped(first.channel, batch.len(), "endpoint changes not kept");
                    }
                    break;
                }
            }
        }
        batch.clear();
    }
}

/// A change of `channel`'s `endpoint` to `to` at `at`, made by `source`.
pub(crate) fn change(
    channel: &'static str,
    endpoint: &str,
    to: EndpointState,
    at: chrono::DateTime<chrono::Utc>,
    source: &'static str,
) -> NewChange {
    NewChange {
        channel,
        endpoint: endpoint.to_owned(),
        to,
        at,
        failures: None,
        since: None,
        reason: None,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_is_recorded_half_way_to_opening() {
        let stages = |open_after: u32| -> Vec<u32> {
            (1..=open_after.max(12))
                .filter(|failures| failing_stage(*failures, open_after))
                .collect()
        };
        assert_eq!(stages(5), vec![3], "the default breaker");
        assert_eq!(stages(10), vec![5]);
        assert_eq!(stages(3), vec![2]);
        assert_eq!(stages(2), vec![1], "half way is the first failure");
        assert_eq!(stages(1), Vec::<u32>::new(), "opens at once");
        assert_eq!(stages(0), vec![1], "no breaker: the first exhaustion");
        assert!(!was_failing(2, 5) && was_failing(3, 5) && was_failing(1, 1));
        for open_after in 0..50 {
            assert!(
                stages(open_after)
                    .iter()
                    .all(|stage| open_after == 0 || *stage <= open_after),
                "no failing stage after the breaker opens ({open_after})"
            );
        }
    }
}
