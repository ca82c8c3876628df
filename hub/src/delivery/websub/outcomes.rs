//! The WebSub scheduler's outcomes on their way to the event log: written
//! in batches by the delivery core's recorder, after which the lanes they
//! make due (retries, the next record of an ordered line) are told and the
//! endpoints' health tallied. The first outcomes of records held in memory
//! ([`super::held`]) have a recorder of their own: they create their
//! records, and an event whose last record is written is marked expanded.

use std::time::Duration;

use async_trait::async_trait;

use crate::config::DeliveryPolicy;
use crate::delivery::health::Tallied;
use crate::delivery::recorder::{Batching, OutcomeStore};
use crate::storage::events::{Completion, DeliveryOutcomes, Outcome};

use super::{Distributor, lane_of, ordered_lane_of};

/// The event log as the recorder writes to it.
#[derive(Debug)]
pub(super) struct LogOutcomes {
    pub(super) distributor: Distributor,
    /// The outcomes are of records never written before.
    pub(super) unwritten: bool,
}

#[async_trait]
impl OutcomeStore for LogOutcomes {
    type Entry = Completion;

    async fn write(&self, batch: &[Completion]) -> Result<(), String> {
        let inner = &self.distributor.inner;
        let now = inner.clock.now();
        let written = if self.unwritten {
            inner.events.complete_unwritten(batch, now).await
        } else {
            inner.events.complete(batch, now).await
        };
        written.map_err(|error| error.to_string())?;
        if self.unwritten {
            let drained = inner
                .held
                .written(batch.iter().map(|completion| completion.event_id));
            self.distributor.settle(drained).await;
        }
        // Written: a claim may find them now. An ordered line's next record
        // may be due once the one before is done, whatever became of it.
        let mut lines_moved = false;
        for completion in batch {
            let next_attempt_at = match completion.outcome {
                Outcome::Retry {
                    next_attempt_at, ..
                }
                | Outcome::Postponed {
                    next_attempt_at, ..
                } => Some(next_attempt_at),
                _ => None,
            };
            if let Some(due) = next_attempt_at {
                inner.lanes.mark_due(lane_of(&completion.subscriber), due);
            }
            if inner.ordered.has_callback(&completion.subscriber) {
                let line = ordered_lane_of(&completion.subscriber);
                inner.lanes.mark_due(line, next_attempt_at.unwrap_or(now));
                lines_moved = true;
            }
        }
        if lines_moved {
            inner.room.notify_one();
        }
        inner
            .endpoints
            .tally(batch.iter().filter_map(tallied), now)
            .await;
        Ok(())
    }

    fn retry_in(&self, completion: &Completion) -> Option<Duration> {
        match completion.outcome {
            Outcome::Retry {
                next_attempt_at, ..
            }
            | Outcome::Postponed {
                next_attempt_at, ..
            } => Some(
                (next_attempt_at - self.distributor.inner.clock.now())
                    .to_std()
                    .unwrap_or_default(),
            ),
            _ => None,
        }
    }

    fn wake(&self) {
        self.distributor.wake();
    }

    fn given_up(&self, batch: &[Completion]) {
        if self.unwritten {
            // Their events are expanded again, the way of any log.
            for completion in batch {
                self.distributor.inner.held.abandon(completion.event_id);
            }
            self.distributor.expand_soon();
        }
    }
}

/// How WebSub outcomes are written: in a fan-out of tens of thousands of
/// deliveries a second, a batched update on PostgreSQL takes tens of
/// milliseconds, so as many writes run at once as the log takes (the
/// records of different batches never overlap), and each gathers only
/// briefly, keeping the log abreast of the network. A log that takes one
/// write at a time (SQLite) gathers a little longer: each of its commits
/// writes the pages it touched to the WAL again, so fewer, larger ones cost
/// less a record.
pub(super) fn batching(policy: &DeliveryPolicy, events: &dyn DeliveryOutcomes) -> Batching {
    let writers = events.writes_at_once();
    Batching {
        limit: policy.batch_size,
        gathering: Duration::from_millis(if writers == 1 { 10 } else { 2 }),
        writers,
    }
}

/// How the tally counts a WebSub completion, if it counts at all.
fn tallied(completion: &Completion) -> Option<Tallied<'_>> {
    match &completion.outcome {
        Outcome::Delivered => Some(Tallied::Delivered(&completion.subscriber)),
        Outcome::Exhausted { error } => Some(Tallied::Exhausted {
            endpoint: &completion.subscriber,
            error,
        }),
        _ => None,
    }
}
