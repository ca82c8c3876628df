//! What each subscriber holds claimed in this dispatcher (its lane), and
//! how much a dispatcher and a subscriber may hold: the concurrency times
//! the waves that fit in the patience (see the schedule module's terms). A
//! webhook subscriber with its own `max_in_flight` holds that times the
//! waves; an ordered one holds one row, its head.
//!
//! A lane's turns follow the in-flight limit the WebSub lanes use
//! ([`Limit`]): it adapts to how the webhook answers, between the feed's
//! `per_subscriber_min` and the subscriber's cap, and a `Retry-After` on a
//! `429` or `503` pauses the lane. The semaphore of turns is grown when the
//! limit grows; when it shrinks, free turns are forgotten at once and busy
//! ones as they come back. A lane paused, or with its limit down, outlives
//! its last row, so that the subscriber's next row does not start afresh.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Dispatcher;
use super::config::DispatcherConfig;
use super::registry::{Delivery, Registry};
use websub_delivery::limit::{Limit, Reply};

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
    /// The most rows it may hold, as of when it last held none.
    pub(super) hold: usize,
    limit: Limit,
    /// Turns the semaphore was given in all: the limit when it last moved.
    issued: usize,
    /// Turns to forget as they come back, after a cut found them busy.
    owed: usize,
}

impl Lane {
    /// Whether the lane outlives its last row (see
    /// [`Limit::is_worth_keeping`]). Such lanes are few, one per subscriber
    /// in trouble at most.
    fn worth_keeping_idle(&self) -> bool {
        self.limit.is_worth_keeping(Instant::now())
    }

    /// Whether it holds any row.
    pub(super) fn is_busy(&self) -> bool {
        self.held > 0
    }
}

/// How much one subscriber may have under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    /// Attempts in flight at once at least, however the webhook answers.
    pub(super) floor: usize,
    /// Attempts in flight at once at most.
    pub(super) cap: usize,
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
                floor: 1,
                cap: 1,
                hold: 1,
                ordered: true,
            },
            Some(Delivery {
                max_in_flight: Some(limit),
                ..
            }) => Limits {
                floor: self.inner.config.per_subscriber_min.min(*limit),
                cap: *limit,
                hold: limit.saturating_mul(waves(&self.inner.config)),
                ordered: false,
            },
            _ => Limits {
                floor: self.inner.config.per_subscriber_min,
                cap: self.inner.config.per_subscriber,
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
            .or_insert_with(|| {
                let limit = Limit::new(limits.floor, limits.cap);
                Lane {
                    held: 0,
                    turns: Arc::new(Semaphore::new(limit.current())),
                    hold: limits.hold,
                    issued: limit.current(),
                    limit,
                    owed: 0,
                }
            });
        if lane.held == 0 {
            lane.hold = limits.hold;
        }
        lane.held += 1;
        lane.turns.clone()
    }

    /// How long `subscriber`'s lane is still paused by a `Retry-After`.
    pub(super) fn paused_for(&self, subscriber: &str) -> Option<Duration> {
        let now = Instant::now();
        self.lanes()
            .by_subscriber
            .get(subscriber)
            .and_then(|lane| lane.limit.paused_for(now))
    }

    /// What an attempt of `subscriber`'s webhook said of its load (`reply`)
    /// and how long it asked the hub to wait (`retry_after`): the lane's
    /// limit follows, its turns with it, and a wait pauses the lane.
    pub(super) fn observe(
        &self,
        subscriber: &str,
        reply: Option<Reply>,
        retry_after: Option<Duration>,
    ) {
        let now = Instant::now();
        let mut lanes = self.lanes();
        let Some(lane) = lanes.by_subscriber.get_mut(subscriber) else {
            return;
        };
        if let Some(wait) = retry_after {
            lane.limit.pause(wait, now);
        }
        let Some(reply) = reply else {
            return;
        };
        lane.limit.observe(reply, now);
        let limit = lane.limit.current();
        if limit > lane.issued {
            let mut more = limit - lane.issued;
            let repaid = more.min(lane.owed);
            lane.owed -= repaid;
            more -= repaid;
            lane.turns.add_permits(more);
        } else if limit < lane.issued {
            let fewer = lane.issued - limit;
            lane.owed += fewer - lane.turns.forget_permits(fewer);
        }
        lane.issued = limit;
    }

    /// `subscriber`'s attempt gives back its `turn`: kept by the lane, or
    /// forgotten when a cut is still owed.
    pub(super) fn give_back(&self, subscriber: &str, turn: OwnedSemaphorePermit) {
        let mut lanes = self.lanes();
        if let Some(lane) = lanes.by_subscriber.get_mut(subscriber)
            && lane.owed > 0
        {
            lane.owed -= 1;
            turn.forget();
        }
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
            if lane.held == 0 && !lane.worth_keeping_idle() {
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
