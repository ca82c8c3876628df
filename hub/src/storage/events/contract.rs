//! The event log's contract: [`EventLog`], the union of nine traits by
//! concern, each of which a component may take alone, and what goes with
//! them (the span of a partition, the two-step first outcome a backend may
//! reuse).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    Activity, ActivityWindow, AdminSessions, Attempt, Claimed, Completion, DeliveryFilter,
    DeliveryHealth, DeliveryRecord, DeliverySummary, DenyList, EndpointStates, EventLogError,
    FailedDelivery, FailedFilter, LoggedEvent, NewEvent, OrderedSubscription, Outcome, Recorded,
    Replayed, SubscriptionSigning, Undelivered,
};

/// Where the hub records events and delivery outcomes: nine parts by
/// concern, each a trait of its own, so that a component names only the
/// part it uses and a backend is written and checked part by part:
/// - [`EventIntake`]: events recorded and read back;
/// - [`DeliveryQueue`]: records written as events expand, claimed per lane
///   or per ordered line, released, dropped;
/// - [`DeliveryOutcomes`]: outcomes and the history of attempts;
/// - [`EndpointStates`]: failures per endpoint, disabling, changes;
/// - [`DeliveryOperations`]: listing, lookups, retries, redelivery, replay;
/// - [`LogUpkeep`]: retention and migrations;
/// - [`AdminSessions`]: the admin page's sessions, kept beside the log;
/// - [`DenyList`]: the operator's deny list, kept beside the log;
/// - [`SubscriptionSigning`]: how subscriptions' deliveries are signed,
///   where their subscribers asked for more than the default.
///
/// A type with all nine is an `EventLog`. Every method is safe to call concurrently, from several processes sharing
/// one database where the backend allows it. Times are passed in (never
/// read from the clock inside) so callers control them in tests.
///
/// Events come in two ways. Content the hub accepted itself (a publish, a
/// fat ping) is [`record`](EventIntake::record)ed under an id the log assigns:
/// each call is a new event. Content that already has an identity of its
/// own (an outbox event, by its envelope's `event_id`) is
/// [`record_once`](EventIntake::record_once)d under that id: a caller that
/// cannot tell whether its first call committed (a timeout, a database
/// outage, a process that died before it could mark its work done) calls
/// again, and the event is recorded, expanded and delivered once however
/// often it is handed over.
pub trait EventLog:
    EventIntake
    + DeliveryQueue
    + DeliveryOutcomes
    + EndpointStates
    + DeliveryOperations
    + LogUpkeep
    + AdminSessions
    + DenyList
    + SubscriptionSigning
{
}

impl<T> EventLog for T where
    T: EventIntake
        + DeliveryQueue
        + DeliveryOutcomes
        + EndpointStates
        + DeliveryOperations
        + LogUpkeep
        + AdminSessions
        + DenyList
        + SubscriptionSigning
        + ?Sized
{
}

/// The log's events: each recorded durably (once, under an id of its own,
/// where it has one) and read back.
#[async_trait]
pub trait EventIntake: Send + Sync + std::fmt::Debug {
    /// Records an event durably under a fresh UUIDv7; it is expanded later by
    /// [`DeliveryQueue::expand`]. Returns the stored event.
    async fn record(
        &self,
        event: NewEvent,
        now: DateTime<Utc>,
    ) -> Result<LoggedEvent, EventLogError>;

    /// Records an event durably under `id`, unless an event with that id is
    /// in the log already: then nothing is written and the stored event is
    /// returned as it is (its topic, content and `created_at` are the first
    /// recording's, whatever `event` says), with
    /// [`created`](Recorded::created) false. Concurrent calls with one id
    /// store it once, and every one of them returns it. An event purged by
    /// retention is no longer there, so a call after the purge records it
    /// again.
    async fn record_once(
        &self,
        id: Uuid,
        event: NewEvent,
        now: DateTime<Utc>,
    ) -> Result<Recorded, EventLogError>;

    /// Events recorded but not yet expanded (a crash between the two), oldest
    /// first, at most `limit`; on a log replicas share, those no other live
    /// replica is expanding ([`DeliveryQueue::take_expansion`]).
    async fn unexpanded(&self, limit: usize) -> Result<Vec<LoggedEvent>, EventLogError>;

    /// One event by id.
    async fn event(&self, id: Uuid) -> Result<Option<LoggedEvent>, EventLogError>;

    /// Whether the event has any delivery record: an expansion that finds
    /// some is taking up one a process began and did not finish.
    async fn has_records(&self, event_id: Uuid) -> Result<bool, EventLogError>;

    /// The topic's most recently recorded event, if any.
    async fn latest(&self, topic: &str) -> Result<Option<LoggedEvent>, EventLogError>;
}

/// The delivery queue: an event's records written as it is expanded,
/// claimed per lane (or one at a time per ordered line), released and
/// dropped.
#[async_trait]
pub trait DeliveryQueue: Send + Sync + std::fmt::Debug {
    /// Writes one delivery record per subscriber (due at `now`) and marks the
    /// event expanded, in one transaction. Idempotent: records that exist are
    /// left as they are. Set-based, in chunks: 100 000 subscribers take a
    /// handful of statements. Returns how many records were created; an
    /// event not in the log is [`EventLogError::UnknownEvent`].
    ///
    /// With no subscribers it only marks the event: the way to finish an
    /// expansion written in parts ([`DeliveryQueue::expand_claimed`]).
    async fn expand(
        &self,
        event_id: Uuid,
        subscribers: &[String],
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError>;

    /// Writes delivery records for some of an event's subscribers, claimed
    /// for their first attempt by the caller: due at `now`, with
    /// `processing_since = now`, so that the caller delivers them without a
    /// claim and no other claimer takes them until the visibility timeout.
    /// The event stays unexpanded until [`DeliveryQueue::expand`] marks it (with
    /// no further subscribers, once every part is in); after a crash it is
    /// expanded again.
    ///
    /// Returns the subscribers whose records this call created, in no
    /// particular order; only those are the caller's to deliver. A record
    /// that exists (an earlier expansion's, another replica's expanding the
    /// same event, or one left by a process that crashed mid-expansion) is
    /// left exactly as it is and not returned: it stays with whoever claimed
    /// it, or goes through [`DeliveryQueue::claim`]. So replicas expanding one
    /// event at once share its records without delivering any twice, and a
    /// record claimed by a process that died is delivered once its claim is
    /// older than the visibility timeout. An event not in the log is
    /// [`EventLogError::UnknownEvent`].
    async fn expand_claimed(
        &self,
        event_id: Uuid,
        subscribers: &[&str],
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, EventLogError>;

    /// Writes delivery records for some of an event's subscribers, due at
    /// `due` and not claimed: the records a busy lane cannot take now,
    /// which [`DeliveryQueue::claim_lanes`] hands out as it can; or (`ordered`)
    /// the records of subscriptions that asked for ordered delivery, each
    /// carrying the event's recording time, its place in its callback's
    /// line, and belonging to that line's lane (the callback, whole), which
    /// [`DeliveryQueue::claim_ordered`] hands out one at a time. Like
    /// [`DeliveryQueue::expand_claimed`], it leaves the event unexpanded and an
    /// existing record as it is. Returns how many records it created; an
    /// event not in the log is [`EventLogError::UnknownEvent`].
    async fn expand_waiting(
        &self,
        event_id: Uuid,
        subscribers: &[&str],
        due: DateTime<Utc>,
        ordered: bool,
    ) -> Result<u64, EventLogError>;

    /// Claims, for each ordered lane (a callback) asked for, the head of its
    /// line: of its records not processed and not exhausted, the first in
    /// recording order, if it is due and not claimed (or its claim is older
    /// than `visibility`). A line whose head is in flight or not yet due
    /// gives nothing: one record in flight, strictly in order, whatever the
    /// number of claimers. An exhausted record leaves the line.
    async fn claim_ordered(
        &self,
        lanes: &[&str],
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<Claimed>, EventLogError>;

    /// Asks for ordered delivery to the subscription of `callback` to
    /// `topic` (`ordered`), or takes the request back. A request applies to
    /// the subscription created at or before `now` and to its renewals; a
    /// subscription created later (after an unsubscribe) starts unordered.
    async fn set_ordered(
        &self,
        topic: &str,
        callback: &str,
        ordered: bool,
        now: DateTime<Utc>,
    ) -> Result<(), EventLogError>;

    /// The requests for ordered delivery, at most `limit`.
    async fn ordered_subscriptions(
        &self,
        limit: usize,
    ) -> Result<Vec<OrderedSubscription>, EventLogError>;

    /// Claims, for each `(lane, count)` asked for, up to `count` due records
    /// of that lane (see `crate::delivery::websub::lane_of`), most overdue first,
    /// as [`DeliveryQueue::claim`] does for the whole log: concurrent claimers
    /// never receive the same record, and a claim older than `visibility`
    /// is taken over.
    async fn claim_lanes(
        &self,
        lanes: &[(&str, usize)],
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<Claimed>, EventLogError>;

    /// The lanes holding records not yet processed and not exhausted, each
    /// with its earliest `next_attempt_at` (records in flight included), at
    /// most `limit` lanes in lane order. A scheduler finds here the work it
    /// did not write itself: retries come due, records of a process that
    /// died, records another replica left.
    async fn due_lanes(&self, limit: usize) -> Result<Vec<(String, DateTime<Utc>)>, EventLogError>;

    /// Hands back every claim in the log at once: for a log only one
    /// process can use (SQLite), whose claims at start-up can only be its
    /// dead predecessor's. Returns how many records were released.
    async fn release_claims(&self) -> Result<u64, EventLogError>;

    /// `subscriber` answered its unsubscribe verification from `topic` at
    /// `since`: its records of the topic's events recorded since then that
    /// are not processed yet (in flight included: a late outcome is
    /// ignored) are closed as dropped, with `reason`. Returns how many.
    async fn drop_since(
        &self,
        topic: &str,
        subscriber: &str,
        since: DateTime<Utc>,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError>;

    /// An endpoint (a subscriber) that was failing since `failing_since`
    /// answered again: its records waiting for a later attempt are due at
    /// `now`, and those that ran out of retries with an attempt since
    /// `failing_since` are due at `now` with their retries counted afresh.
    /// Records in flight are left to their attempts. Returns how many
    /// records were released.
    async fn release_endpoint(
        &self,
        subscriber: &str,
        failing_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError>;

    /// Claims up to `limit` due records: unprocessed, `next_attempt_at <=
    /// now`, and not claimed since `now - visibility` (a claim older than
    /// that belongs to a dead process). Sets `processing_since = now`.
    /// Concurrent claimers never receive the same record. The most overdue
    /// records come first.
    async fn claim(
        &self,
        limit: usize,
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<Claimed>, EventLogError>;

    /// Whether an expansion may hold its records in memory until their
    /// first outcome ([`DeliveryOutcomes::complete_unwritten`]): nothing but
    /// the expanding process writes the event's records meanwhile, because
    /// one process uses the log (SQLite) or because
    /// [`DeliveryQueue::take_expansion`] gives each expansion to one
    /// replica (PostgreSQL).
    fn holds_records(&self) -> bool {
        false
    }

    /// Takes the expansion of the unexpanded event `event_id` for this
    /// process, unless another live replica has it: then this one leaves
    /// the event alone ([`EventIntake::unexpanded`] leaves it out too). The
    /// expansion passes to another replica once its holder is gone (its
    /// registration removed at shutdown or by a takeover). Where one
    /// process uses the log, always taken. One round trip, which also tells
    /// whether any record of the event is written yet.
    async fn take_expansion(&self, event_id: Uuid) -> Result<ExpansionClaim, EventLogError>;

    /// Writes a delivery record, due at `now`, for each subscription of
    /// `owed` and every event of its topic recorded at or after its
    /// `since`: the events a subscription verified at `since` but saved
    /// later could otherwise miss. One round trip for them all; records
    /// that exist are left as they are. Returns how many were created.
    async fn deliver_since(
        &self,
        owed: &[Owed<'_>],
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError>;
}

/// A subscription saved after its verification request, owed the events
/// of its topic recorded since that request ([`DeliveryQueue::deliver_since`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owed<'a> {
    /// The subscription's topic.
    pub topic: &'a str,
    /// Its callback.
    pub subscriber: &'a str,
    /// When its verification request was sent.
    pub since: DateTime<Utc>,
}

/// An event's expansion, as [`DeliveryQueue::take_expansion`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpansionClaim {
    /// This process's to make. `afresh`: no record of the event is written
    /// yet (an expansion taken up after a crash finds some).
    Taken {
        /// No record of the event is written yet.
        afresh: bool,
    },
    /// Another live replica's: left to it.
    Elsewhere,
}

/// Outcomes and the history of attempts: each delivery's outcome written,
/// every failed or retried attempt kept, for WebSub records and outbox
/// webhooks alike.
#[async_trait]
pub trait DeliveryOutcomes: DeliveryQueue {
    /// Records outcomes in one round trip: `Delivered` and `Dropped` set
    /// `processed_at = now`; `Retry` increments `retry_count` and sets
    /// `next_attempt_at`; `Exhausted` increments `retry_count` and clears
    /// `next_attempt_at`. Every failure or drop keeps its reason in
    /// `last_error` (a later `Delivered` leaves the previous failure there
    /// for inspection), and every outcome clears `processing_since`. An
    /// outcome for a record already processed is ignored, so a late answer
    /// from a claim that was taken over cannot reopen it.
    async fn complete(
        &self,
        completions: &[Completion],
        now: DateTime<Utc>,
    ) -> Result<(), EventLogError>;

    /// Records the first outcomes of records nobody wrote: on a log that
    /// allows it ([`DeliveryQueue::holds_records`]) a scheduler may hold an
    /// expansion's records in memory and write each only with its first
    /// outcome. Each record is created as [`DeliveryQueue::expand_claimed`]
    /// and completed as [`DeliveryOutcomes::complete`] would; one that exists (an
    /// operator's resend meanwhile) is completed as `complete` does. An
    /// outcome of an event purged meanwhile is left out.
    async fn complete_unwritten(
        &self,
        completions: &[Completion],
        now: DateTime<Utc>,
    ) -> Result<(), EventLogError> {
        write_then_complete(self, completions, now).await
    }

    /// The attempts of one delivery, oldest first.
    async fn attempts(
        &self,
        event_id: Uuid,
        subscriber: &str,
    ) -> Result<Vec<Attempt>, EventLogError>;

    /// How many writes the log makes progress on at once: a writer beyond
    /// them only waits, with a batch that could have grown meanwhile.
    fn writes_at_once(&self) -> usize;
}

/// What operators and subscribers read and do: deliveries listed and
/// looked up, failures retried, events redelivered and replayed, health and
/// rates.
#[async_trait]
pub trait DeliveryOperations: Send + Sync + std::fmt::Debug {
    /// Every delivery record of an event.
    async fn deliveries(&self, event_id: Uuid) -> Result<Vec<DeliveryRecord>, EventLogError>;

    /// One delivery record, if the event has one for `subscriber`.
    async fn delivery(
        &self,
        event_id: Uuid,
        subscriber: &str,
    ) -> Result<Option<DeliveryRecord>, EventLogError>;

    /// The records still to be delivered (due, retrying or in flight; not
    /// exhausted), and when the oldest of their events was recorded.
    async fn undelivered(&self) -> Result<Undelivered, EventLogError>;

    /// Delivery health of `subscriber` over the topic's `window` most recent
    /// events: bounded work however long the log grows.
    async fn health(
        &self,
        topic: &str,
        subscriber: &str,
        window: usize,
    ) -> Result<DeliveryHealth, EventLogError>;

    /// Exhausted records matching `filter`, newest event first, at most
    /// `limit`.
    async fn failed(
        &self,
        filter: FailedFilter<'_>,
        limit: usize,
    ) -> Result<Vec<FailedDelivery>, EventLogError>;

    /// Makes the exhausted records matching `filter` due again at `now` with
    /// a fresh retry budget; their last error stays until an attempt
    /// replaces it. Returns how many were re-opened.
    async fn retry_failed(
        &self,
        filter: FailedFilter<'_>,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError>;

    /// Delivery records matching `filter`, newest event first, at most
    /// `limit`.
    async fn list(
        &self,
        filter: DeliveryFilter<'_>,
        limit: usize,
    ) -> Result<Vec<DeliverySummary>, EventLogError>;

    /// Sends event `event_id` again to `subscribers`: records a redelivery
    /// (a copy of the event naming it as its original, recorded at `now`,
    /// never expanded) with a record due at `now` for each subscriber. The
    /// original's records stay as they are, so each record is the history of
    /// one round. A redelivery of a redelivery names the first original.
    /// Returns the redelivery's id; `None` when the event is not in the log.
    async fn redeliver(
        &self,
        event_id: Uuid,
        subscribers: &[&str],
        now: DateTime<Utc>,
    ) -> Result<Option<Uuid>, EventLogError>;

    /// Sends the events of `topic` recorded at or after `since` again to
    /// `subscriber`, oldest first, at most `limit` of them: a redelivery of
    /// each (see [`DeliveryOperations::redeliver`]). Redeliveries themselves are not
    /// replayed; their originals are.
    async fn replay(
        &self,
        topic: &str,
        subscriber: &str,
        since: DateTime<Utc>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Replayed, EventLogError>;

    /// How many attempts at or after `since` were answered 2xx, counting
    /// only events recorded at or after `since`: the recent delivery rate,
    /// read through the events' time index in work bounded by the window
    /// (an older event's late delivery is not counted).
    async fn delivered_since(&self, since: DateTime<Utc>) -> Result<u64, EventLogError>;

    /// The attempts of WebSub deliveries made in `window` (at or after its
    /// start, before its end), counting only events recorded in it, as
    /// [`DeliveryOperations::delivered_since`] does: per bucket, how many
    /// were answered 2xx and how many failed, and the durations at the 50th
    /// and 99th percentiles (nearest rank, so the 99th is never below the
    /// median); and the endpoints with the most of each, at most
    /// `window.endpoints` of each. Every bucket is returned, empty ones
    /// included. One aggregated read per part, bounded by the window
    /// through the events' time index; outbox webhooks are not in it.
    async fn activity(&self, window: ActivityWindow) -> Result<Activity, EventLogError>;
}

/// Upkeep: retention and the schema's migrations.
#[async_trait]
pub trait LogUpkeep: Send + Sync + std::fmt::Debug {
    /// The versions of this build's migrations that the database has not
    /// applied (none on a ready log); a query, so also a sign of life. One
    /// that gets no answer within `limit` fails as timed out, and its
    /// connection is closed rather than kept (see
    /// [`bounded`](websub_delivery::state::bounded)): a readiness probe
    /// that asks every few seconds of a database gone silent must not use
    /// up its pool.
    async fn unapplied_migrations(
        &self,
        limit: std::time::Duration,
    ) -> Result<Vec<i64>, EventLogError>;

    /// Deletes events created before `cutoff` with their delivery records.
    /// Returns how many events were deleted.
    async fn purge_before(&self, cutoff: DateTime<Utc>) -> Result<u64, EventLogError>;

    /// Makes room for the events of the next spans of time, where the
    /// backend keeps them in partitions by time (PostgreSQL: one partition
    /// of the log, its records and their attempts per `span`, up to a few
    /// spans past `now`), so that [`LogUpkeep::purge_before`] drops whole
    /// partitions instead of deleting rows. Elsewhere it does nothing.
    /// Returns how many spans it added.
    async fn partition_ahead(
        &self,
        span: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        let _ = (span, now);
        Ok(0)
    }
}

/// The time one partition of the log covers (see
/// [`LogUpkeep::partition_ahead`]): a quarter of the retention, between a
/// second and a day; a day when everything is kept. Each partition made
/// or dropped locks its table for a moment and makes every connection plan
/// its statements afresh, so they are few; a quarter bounds what is kept
/// past the retention to a quarter of it more.
pub fn partition_span(retention: Option<std::time::Duration>) -> std::time::Duration {
    const DAY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
    retention.map_or(DAY, |ttl| {
        std::time::Duration::from_secs((ttl / 4).as_secs())
            .clamp(std::time::Duration::from_secs(1), DAY)
    })
}

/// [`DeliveryOutcomes::complete_unwritten`] as the logs write it: the
/// deliveries (nearly all first outcomes) in one insert each of closed
/// records (`insert_delivered`), the rest with [`write_then_complete`].
pub(crate) async fn complete_unwritten_split<'c, L, F, Fut>(
    log: &L,
    completions: &'c [Completion],
    now: DateTime<Utc>,
    insert_delivered: F,
) -> Result<(), EventLogError>
where
    L: DeliveryOutcomes + ?Sized,
    F: FnOnce(Vec<&'c Completion>) -> Fut,
    Fut: std::future::Future<Output = Result<(), EventLogError>>,
{
    let (delivered, others): (Vec<&Completion>, Vec<&Completion>) = completions
        .iter()
        .partition(|completion| completion.outcome == Outcome::Delivered);
    if !delivered.is_empty() {
        insert_delivered(delivered).await?;
    }
    if !others.is_empty() {
        let others: Vec<Completion> = others.into_iter().cloned().collect();
        write_then_complete(log, &others, now).await?;
    }
    Ok(())
}

/// [`DeliveryOutcomes::complete_unwritten`] in two steps: the records created
/// claimed by this process, then completed. Created waiting, a record would
/// be due in between, and the claim loop could send it a second time
/// beside the attempt whose outcome this is.
pub(crate) async fn write_then_complete<L: DeliveryOutcomes + ?Sized>(
    log: &L,
    completions: &[Completion],
    now: DateTime<Utc>,
) -> Result<(), EventLogError> {
    let mut by_event: std::collections::HashMap<Uuid, Vec<&str>> = std::collections::HashMap::new();
    for completion in completions {
        by_event
            .entry(completion.event_id)
            .or_default()
            .push(&completion.subscriber);
    }
    for (event_id, subscribers) in by_event {
        match log.expand_claimed(event_id, &subscribers, now).await {
            Ok(_) | Err(EventLogError::UnknownEvent(_)) => {}
            Err(error) => return Err(error),
        }
    }
    log.complete(completions, now).await
}
