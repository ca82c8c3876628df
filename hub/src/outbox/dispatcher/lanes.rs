//! What each subscriber holds claimed in this dispatcher (its lane), and
//! how much a dispatcher and a subscriber may hold: the concurrency times
//! the waves that fit in the patience (see the schedule module's terms). A
//! webhook subscriber with its own `max_in_flight` holds that times the
//! waves; an ordered one holds one row, its head.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::Dispatcher;
use super::config::DispatcherConfig;
use super::registry::{Delivery, Registry};

/// The rows this dispatcher holds claimed.
#[derive(Debug, Default)]
pub(super) struct Lanes {
    pub(super) by_subscriber: HashMap<String, Lane>,
    /// In all.
    pub(super) held: usize,
}

/// The rows one subscriber holds claimed in this dispatcher.
#[derive(Debug)]
pub(super) struct Lane {
    /// Claimed and not done: attempting, or waiting for a turn.
    pub(super) held: usize,
    /// One permit per attempt the subscriber may have in flight.
    pub(super) turns: Arc<Semaphore>,
    /// The most rows it may hold, as of when the lane opened.
    pub(super) hold: usize,
}

/// How much one subscriber may have under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    /// Attempts in flight at once.
    pub(super) turns: usize,
    /// Rows held claimed.
    pub(super) hold: usize,
    /// Only its head is claimed, by a claim of its own.
    pub(super) ordered: bool,
}

impl Dispatcher {
    pub(super) fn lanes(&self) -> std::sync::MutexGuard<'_, Lanes> {
        self.inner
            .lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What `subscriber` may have under way, as `registry` has it: the
    /// dispatcher's `per_subscriber` unless its registrations say otherwise.
    pub(super) fn limits(&self, registry: &Registry, subscriber: &str) -> Limits {
        match registry.delivery.get(subscriber) {
            Some(delivery) if delivery.ordered => Limits {
                turns: 1,
                hold: 1,
                ordered: true,
            },
            Some(Delivery {
                max_in_flight: Some(limit),
                ..
            }) => Limits {
                turns: *limit,
                hold: limit.saturating_mul(waves(&self.inner.config)),
                ordered: false,
            },
            _ => Limits {
                turns: self.inner.config.per_subscriber,
                hold: self.inner.hold,
                ordered: false,
            },
        }
    }

    /// Counts one more row held for `subscriber`, within `limits` if its
    /// lane opens now; returns its turns. A lane keeps the limits it opened
    /// with until it is empty.
    pub(super) fn hold(&self, subscriber: &str, limits: Limits) -> Arc<Semaphore> {
        let mut lanes = self.lanes();
        lanes.held += 1;
        let lane = lanes
            .by_subscriber
            .entry(subscriber.to_owned())
            .or_insert_with(|| Lane {
                held: 0,
                turns: Arc::new(Semaphore::new(limits.turns)),
                hold: limits.hold,
            });
        lane.held += 1;
        lane.turns.clone()
    }

    /// One row of `subscriber` is done. Once half the room of the
    /// subscriber, or of the dispatcher, is free, the run loop may claim
    /// again: refilling in halves rather than one row at a time keeps claims
    /// few, and what is still held covers the attempts in the meantime.
    pub(super) fn finished(&self, subscriber: &str) {
        let refill_at = |hold: usize| hold - (hold / 2).max(1);
        let mut lanes = self.lanes();
        lanes.held = lanes.held.saturating_sub(1);
        let mut refill = lanes.held == refill_at(self.inner.hold_overall);
        if let Some(lane) = lanes.by_subscriber.get_mut(subscriber) {
            lane.held = lane.held.saturating_sub(1);
            refill |= lane.held == refill_at(lane.hold);
            if lane.held == 0 {
                lanes.by_subscriber.remove(subscriber);
            }
        }
        drop(lanes);
        if refill {
            self.inner.room.notify_one();
        }
    }
}

/// How many waves of attempts rows are claimed for: as many (at most four)
/// as fit, each taking up to the delivery timeout, before a waiting row's
/// claim must be handed back. Holding more than one wave means the next
/// attempts are ready the moment a slot frees, without a claim in between.
pub(super) fn waves(config: &DispatcherConfig) -> usize {
    let waves = patience(config).as_nanos() / config.delivery_timeout.as_nanos().max(1);
    usize::try_from(waves.clamp(1, 4)).unwrap_or(1)
}

/// How long after its claim a row may still be attempting, or waiting for
/// its turn: three quarters of the visibility timeout, so that the claim
/// never goes stale meanwhile.
pub(super) fn patience(config: &DispatcherConfig) -> Duration {
    config.visibility_timeout * 3 / 4
}
