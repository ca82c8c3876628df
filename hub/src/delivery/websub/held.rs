//! Records held in memory instead of written, on a log where nothing but
//! the expanding process writes an event's records meanwhile
//! ([`DeliveryQueue::holds_records`]: SQLite, used by one process, and
//! PostgreSQL, where each expansion is one replica's): an expansion hands the
//! records its lanes have room for straight to their attempts and holds
//! the others here, per lane, for the lanes to take as they free room. A
//! record is written once, with its first outcome
//! ([`DeliveryOutcomes::complete_unwritten`]), where a record written to wait,
//! claimed and completed takes three writes.
//!
//! Durable all the same: the event stays unexpanded in the log until every
//! record of it is written, so a process that dies holding records expands
//! the event again at start, and the records it had written are left as
//! they are (an expansion that finds records goes the way of any log).
//!
//! The scheduler's side is here too: handing held records to their lanes’
//! claims, writing those held too long, and marking an event expanded once
//! its last record is written.
//!
//! Bounded: past [`MOST_HELD`] records, or [`MOST_DRAINING`] events at
//! once, an expansion writes its records to wait, as on any log; a record
//! held longer than [`LONGEST_HELD`] is written to wait too, so that a slow
//! or dead host never keeps its event unexpanded for long.
//!
//! [`DeliveryQueue::holds_records`]: crate::storage::events::DeliveryQueue::holds_records
//! [`DeliveryOutcomes::complete_unwritten`]: crate::storage::events::DeliveryOutcomes::complete_unwritten

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::warn;
use uuid::Uuid;
use websub_store::Subscription;

use super::cache::Outgoing;
use super::lanes::{Ask, Job};
use super::{Distributor, Pipeline, lease_expired};

/// The most records held at once, over all lanes: a few MB, the
/// subscriptions themselves being shared with the expansion's pages.
pub(super) const MOST_HELD: usize = 50_000;

/// The most events with records held or in flight unwritten at once.
pub(super) const MOST_DRAINING: usize = 256;

/// How long a record is held before it is written to wait in the log.
pub(super) const LONGEST_HELD: Duration = Duration::from_secs(2);

/// A record held for its lane.
pub(super) type HeldRecord = (Arc<Outgoing>, Arc<Subscription>);

/// The held records and the events they keep unexpanded.
#[derive(Debug, Default)]
pub(super) struct Held {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    lanes: HashMap<Arc<str>, VecDeque<(HeldRecord, Instant)>>,
    held: usize,
    events: HashMap<Uuid, Draining>,
}

/// An event with records not yet written.
#[derive(Debug, Default)]
struct Draining {
    /// Held, or on their way to an attempt or to the log.
    unwritten: usize,
    /// Every page of its subscribers was read: once `unwritten` reaches
    /// nought, the event is marked expanded.
    listed: bool,
    /// Its listing failed: once `unwritten` reaches nought it is let go,
    /// unmarked, and expanded again the way of any log.
    failed: bool,
}

/// What became of an event when its last unwritten record was written.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Drained {
    /// Every record is in the log: mark it expanded.
    Expanded(Uuid),
    /// Let go unmarked, to be expanded again.
    Abandoned(Uuid),
}

impl Held {
    /// Starts holding records for `event`; `false` when too many events
    /// are draining already (its records are written).
    pub(super) fn begin(&self, event: Uuid) -> bool {
        let mut state = self.lock();
        if state.events.len() >= MOST_DRAINING {
            return false;
        }
        state.events.entry(event).or_default();
        true
    }

    /// Whether `event` has records unwritten: the expander leaves it alone.
    pub(super) fn is_draining(&self, event: Uuid) -> bool {
        self.lock().events.contains_key(&event)
    }

    /// How many events are draining.
    pub(super) fn draining(&self) -> usize {
        self.lock().events.len()
    }

    /// `count` records of `event` went straight to their attempts, unwritten.
    pub(super) fn sent(&self, event: Uuid, count: usize) {
        if let Some(draining) = self.lock().events.get_mut(&event) {
            draining.unwritten += count;
        }
    }

    /// Holds `record` for `lane`; `false` when [`MOST_HELD`] are held
    /// (the record is written to wait).
    pub(super) fn hold(&self, lane: &str, record: HeldRecord) -> bool {
        let mut state = self.lock();
        if state.held >= MOST_HELD {
            return false;
        }
        let Some(draining) = state.events.get_mut(&record.0.event.id) else {
            return false;
        };
        draining.unwritten += 1;
        state.held += 1;
        let queue = match state.lanes.get_mut(lane) {
            Some(queue) => queue,
            None => state.lanes.entry(Arc::from(lane)).or_default(),
        };
        queue.push_back((record, Instant::now()));
        true
    }

    /// Up to `count` records held for `lane`, oldest first.
    pub(super) fn take(&self, lane: &str, count: usize) -> Vec<HeldRecord> {
        let mut state = self.lock();
        let Some(queue) = state.lanes.get_mut(lane) else {
            return Vec::new();
        };
        let taken: Vec<HeldRecord> = queue
            .drain(..count.min(queue.len()))
            .map(|(record, _)| record)
            .collect();
        if queue.is_empty() {
            state.lanes.remove(lane);
        }
        state.held -= taken.len();
        taken
    }

    /// The records held since before `now - LONGEST_HELD`, taken out to be
    /// written to wait.
    pub(super) fn overdue(&self, now: Instant) -> Vec<HeldRecord> {
        let Some(cutoff) = now.checked_sub(LONGEST_HELD) else {
            return Vec::new();
        };
        let mut state = self.lock();
        let mut overdue = Vec::new();
        state.lanes.retain(|_, queue| {
            while queue.front().is_some_and(|(_, since)| *since < cutoff) {
                if let Some((record, _)) = queue.pop_front() {
                    overdue.push(record);
                }
            }
            !queue.is_empty()
        });
        state.held -= overdue.len();
        overdue
    }

    /// Every page of `event`'s subscribers was read (`listed`), or reading
    /// them failed: what became of it if nothing of it is unwritten.
    pub(super) fn listed(&self, event: Uuid, listed: bool) -> Option<Drained> {
        let mut state = self.lock();
        let draining = state.events.get_mut(&event)?;
        draining.listed = listed;
        draining.failed = !listed;
        Self::settle(&mut state, event)
    }

    /// Records of `events` (one entry per record) are in the log now: the
    /// events this leaves with nothing unwritten.
    pub(super) fn written(&self, events: impl IntoIterator<Item = Uuid>) -> Vec<Drained> {
        let mut state = self.lock();
        let mut touched = Vec::new();
        for event in events {
            if let Some(draining) = state.events.get_mut(&event) {
                draining.unwritten = draining.unwritten.saturating_sub(1);
                if draining.unwritten == 0 {
                    touched.push(event);
                }
            }
        }
        touched
            .into_iter()
            .filter_map(|event| Self::settle(&mut state, event))
            .collect()
    }

    /// Lets go of `event` at once, whatever is unwritten (a failed write).
    pub(super) fn abandon(&self, event: Uuid) {
        self.lock().events.remove(&event);
    }

    fn settle(state: &mut State, event: Uuid) -> Option<Drained> {
        let draining = state.events.get(&event)?;
        if draining.unwritten > 0 || !(draining.listed || draining.failed) {
            return None;
        }
        let listed = draining.listed;
        state.events.remove(&event);
        Some(if listed {
            Drained::Expanded(event)
        } else {
            Drained::Abandoned(event)
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Distributor {
    /// Hands the lanes of `asks` the records held for them, as many as each
    /// asked for; returns the asks with what is left to claim from the log.
    pub(super) async fn take_held(&self, asks: Vec<Ask>, pipeline: &Pipeline) -> Vec<Ask> {
        let mut left = Vec::with_capacity(asks.len());
        let mut handed = Vec::new();
        for mut ask in asks {
            let taken = self.inner.held.take(&ask.lane, ask.count);
            if !taken.is_empty() {
                self.inner.lanes.handed(&mut ask, taken.len());
                handed.push((ask.lane.clone(), taken));
            }
            if ask.count > 0 {
                left.push(ask);
            }
        }
        let now = self.inner.clock.now();
        for (lane, taken) in handed {
            for (outgoing, subscription) in taken {
                if subscription.is_expired(now) {
                    pipeline.record(lease_expired(&outgoing, &subscription), true);
                    continue;
                }
                let Ok(permit) = pipeline.pending.clone().acquire_owned().await else {
                    return left;
                };
                let job = Job::new(permit, (outgoing, subscription), 0, true);
                self.enqueue(pipeline, &lane, job);
            }
        }
        left
    }

    /// Writes `records`, held too long, to wait in the log for their lanes.
    pub(super) async fn write_held(&self, records: Vec<HeldRecord>) {
        let mut by_event: HashMap<Uuid, (Arc<Outgoing>, Vec<Arc<Subscription>>)> = HashMap::new();
        for (outgoing, subscription) in records {
            by_event
                .entry(outgoing.event.id)
                .or_insert_with(|| (outgoing, Vec::new()))
                .1
                .push(subscription);
        }
        let now = self.inner.clock.now();
        for (id, (outgoing, subscriptions)) in by_event {
            match self
                .write_waiting(&outgoing, &subscriptions, now, false)
                .await
            {
                Ok(_) => {
                    let drained = self
                        .inner
                        .held
                        .written(std::iter::repeat_n(id, subscriptions.len()));
                    self.settle(drained).await;
                }
                Err(error) => {
                    warn!(%error, event = %id, "writing held records failed; the event is expanded again");
                    self.inner.held.abandon(id);
                    self.expand_soon();
                }
            }
        }
    }

    /// Marks expanded the events whose held records are all written; has
    /// those let go expanded again.
    pub(super) async fn settle(&self, drained: Vec<Drained>) {
        for drained in drained {
            match drained {
                Drained::Expanded(id) => {
                    let now = self.inner.clock.now();
                    if let Err(error) = self.inner.events.expand(id, &[], now).await {
                        warn!(%error, event = %id, "marking an event expanded failed; it is expanded again");
                        self.expand_soon();
                    }
                }
                Drained::Abandoned(_) => self.expand_soon(),
            }
        }
    }

    /// Whether expansions hold records in memory.
    pub(super) fn holds_records(&self) -> bool {
        self.inner.events.holds_records()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::events::LoggedEvent;

    fn record(event: &Arc<Outgoing>, callback: &str) -> HeldRecord {
        let topic = event.event.topic.clone();
        (event.clone(), Arc::new(Subscription::new(topic, callback)))
    }

    fn event() -> Arc<Outgoing> {
        Arc::new(Outgoing::new(
            LoggedEvent {
                id: Uuid::now_v7(),
                topic: "https://pub.example/feed".to_owned(),
                content_type: "text/plain".to_owned(),
                body: bytes::Bytes::from_static(b"hello"),
                created_at: chrono::Utc::now(),
                original_id: None,
                trace_context: None,
            },
            "https://hub.example/",
        ))
    }

    #[test]
    fn an_event_is_expanded_once_listed_and_every_record_written() {
        let held = Held::default();
        let event = event();
        let id = event.event.id;
        assert!(held.begin(id));
        held.sent(id, 1);
        assert!(held.hold("a.example", record(&event, "https://a.example/1")));
        assert!(held.hold("a.example", record(&event, "https://a.example/2")));
        assert!(held.is_draining(id));
        // Written before the listing ends: not yet.
        assert_eq!(held.written([id]), vec![]);
        assert_eq!(held.listed(id, true), None);
        let taken = held.take("a.example", 5);
        assert_eq!(taken.len(), 2, "every record held for the lane");
        assert!(held.take("a.example", 5).is_empty());
        assert_eq!(held.written([id]), vec![]);
        assert_eq!(held.written([id]), vec![Drained::Expanded(id)]);
        assert!(!held.is_draining(id));
        assert_eq!(held.draining(), 0);
    }

    #[test]
    fn an_event_whose_listing_failed_is_let_go_once_its_records_are_written() {
        let held = Held::default();
        let event = event();
        let id = event.event.id;
        assert!(held.begin(id));
        assert!(held.hold("a.example", record(&event, "https://a.example/1")));
        assert_eq!(held.listed(id, false), None, "a record is still held");
        assert_eq!(held.take("a.example", 1).len(), 1);
        assert_eq!(held.written([id]), vec![Drained::Abandoned(id)]);
        let quiet = self::event();
        assert!(held.begin(quiet.event.id));
        assert_eq!(
            held.listed(quiet.event.id, true),
            Some(Drained::Expanded(quiet.event.id)),
            "nothing unwritten: expanded at once"
        );
    }

    #[test]
    fn records_held_too_long_are_taken_out_oldest_first() {
        let held = Held::default();
        let event = event();
        assert!(held.begin(event.event.id));
        for lane in ["a.example", "b.example"] {
            assert!(held.hold(lane, record(&event, &format!("https://{lane}/x"))));
        }
        assert!(held.overdue(Instant::now()).is_empty());
        let later = Instant::now() + LONGEST_HELD + Duration::from_millis(1);
        assert_eq!(held.overdue(later).len(), 2);
        assert!(held.take("a.example", 1).is_empty());
        assert!(held.is_draining(event.event.id), "still to be written");
    }

    #[test]
    fn holding_is_bounded() {
        let held = Held::default();
        let event = event();
        assert!(!held.hold("a.example", record(&event, "https://a.example/0")));
        assert!(held.begin(event.event.id));
        let one = record(&event, "https://a.example/1");
        for _ in 0..MOST_HELD {
            assert!(held.hold("a.example", one.clone()));
        }
        assert!(
            !held.hold("a.example", one),
            "past the bound: written instead"
        );
        for _ in 1..MOST_DRAINING {
            assert!(held.begin(Uuid::now_v7()));
        }
        assert!(!held.begin(Uuid::now_v7()));
    }
}
