//! The PostgreSQL event log: events and delivery records in a database that
//! several hub replicas share.
//!
//! It owns the `websub_events`, `websub_deliveries` and `websub_attempts`
//! tables (with their partitions) and their migrations
//! (`migrations/postgres/hub`, embedded at build time), recorded in their
//! own table, `websub_hub_migrations`, so that the subscription store's
//! migrator (`websub_store_migrations`) can run on the same database without
//! either one taking the other's history for missing migrations.
//!
//! The behaviour is the [`EventLog`](super::EventLog) contract. What this backend adds:
//!
//! - **Claims never overlap across replicas.** A claim is one `UPDATE` whose
//!   due rows come from a `FOR UPDATE SKIP LOCKED` subquery: a row another
//!   claimer has locked is skipped rather than waited for, and a row another
//!   claimer has just committed a claim on fails the re-checked predicate.
//! - **Claims name their holder.** Every claim records the replica that
//!   makes it (`claimed_by`, see [`PostgresEventLog::with_replica`]), so
//!   that a dead replica's claims are handed back within seconds
//!   ([`crate::storage::replicas`]) rather than after the visibility timeout.
//! - **Every call is a fixed number of round trips**, whatever the batch:
//!   subscribers and completions travel as array parameters (`unnest`), so no
//!   statement comes near PostgreSQL's limit of 65 535 bind parameters.
//! - **Plans that do not depend on statistics.** Claims and completions run
//!   through two SQL functions the migration defines, which rule out the
//!   plans a planner with stale statistics would pick right after a large
//!   expansion (sorting or hashing the whole backlog on every call).
//! - **A statement-level foreign key.** Delivery records reference their
//!   event with `ON DELETE CASCADE` semantics, enforced by triggers that check
//!   once per statement rather than once per row; see the migration for why
//!   and for the one condition (delete events at READ COMMITTED, as
//!   [`LogUpkeep::purge_before`] does).
//! - **Retention drops partitions.** Events, their records and their
//!   attempts are partitioned by event id, which is time (UUIDv7); upkeep
//!   makes partitions ahead of the clock and retention drops the old ones
//!   whole (`partitions`, migration `0016_partitions.sql`), deleting rows
//!   only where a partition holds newer events too.

use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

mod changes;
mod delivery_path;
mod operate;
mod partitions;
mod rows;
mod statements;

use super::shared::SqlEventLog;
use crate::storage::dialect::bound;

super::sessions::admin_sessions_of!(PostgresEventLog, |log| log.pool.acquire().await?);
super::denials::deny_list_of!(PostgresEventLog, |log| log.pool.acquire().await?);
super::signing::subscription_signing_of!(PostgresEventLog, |log| log.pool.acquire().await?);

use statements::{
    ATTEMPTS, CLAIM, DELIVER_SINCE, EVENT, EVENT_EXISTS, EXPAND_AGAIN, EXPAND_FIRST, INSERT_EVENT,
    INSERT_EVENT_ONCE, MARK_EXPANDED, MIGRATIONS_TABLE, PURGE, PURGE_WEBHOOK_ATTEMPTS,
    READ_COMMITTED, UNEXPANDED_FREE,
};

use super::is_unique_violation;
use super::{
    Attempt, Claimed, Completion, DeliveryOutcomes, DeliveryQueue, EventIntake, EventLogError,
    Exhaustion, ExpansionClaim, LogUpkeep, LoggedEvent, NewEvent, OrderedSubscription, Owed,
    Recorded, WebhookAttempt,
};
use async_trait::async_trait;

/// Connections [`PostgresEventLog::connect`] keeps open while idle: what a
/// dispatcher uses at once in a fan-out (the expander, the claim loop and its
/// outcome writers), each of which would otherwise start a server process
/// (and plan the log's functions afresh) in the middle of the fan-out.
pub const WARM_CONNECTIONS: u32 = 6;

/// Subscribers per `INSERT` in [`DeliveryQueue::expand`]. The array is one
/// parameter, so this bounds statement memory, not parameter count.
const EXPAND_CHUNK: usize = 10_000;

/// Attempts of [`EventIntake::record_once`] at an id a purge keeps deleting.
const RECORD_ONCE_ROUNDS: usize = 3;

/// Events per `DELETE` in [`LogUpkeep::purge_before`]: each one cascades to its
/// delivery rows, so a chunk stays a short transaction even for events that
/// fanned out widely.
const PURGE_CHUNK: i64 = 500;

/// The event log in a PostgreSQL database.
///
/// Cloning is cheap and shares the pool.
#[derive(Debug, Clone)]
pub struct PostgresEventLog {
    pool: PgPool,
    /// The replica its claims are recorded as held by (`claimed_by`), so
    /// that they can be handed back at once when it dies; see
    /// [`crate::storage::replicas`].
    replica: Uuid,
}

impl PostgresEventLog {
    /// Connects a pool to `url` and brings the schema up to date.
    ///
    /// The pool's sessions run with `synchronous_commit = off`: a claim or an
    /// outcome lost in a database crash only means a delivery is made again
    /// after the visibility timeout (delivery is at least once anyway), and
    /// an expansion lost leaves its event unexpanded, to be expanded again.
    /// Waiting for a WAL flush on each of them was most of a fan-out's time.
    /// Recording an event, which the hub acknowledges, still waits for it.
    ///
    /// The pool keeps [`WARM_CONNECTIONS`] open even when idle, so that a
    /// fan-out after a quiet spell does not wait for new server processes.
    pub async fn connect(url: &str) -> Result<Self, EventLogError> {
        let options =
            crate::storage::postgres_session(url)?.options([("synchronous_commit", "off")]);
        let pool = PgPoolOptions::new()
            .min_connections(WARM_CONNECTIONS)
            .connect_with(options)
            .await?;
        let log = Self::from_pool(pool);
        log.migrate().await?;
        Ok(log)
    }

    /// An event log on an existing pool, for a caller that runs
    /// [`migrate`](Self::migrate) itself (or knows the schema is current).
    /// Its claims are held by a replica id of its own (see
    /// [`with_replica`](Self::with_replica)).
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            pool,
            replica: Uuid::now_v7(),
        }
    }

    /// The same log, its claims held by `replica`: the id this process
    /// registers and beats under ([`crate::storage::replicas::Replicas`]).
    #[must_use]
    pub fn with_replica(mut self, replica: Uuid) -> Self {
        self.replica = replica;
        self
    }

    /// The replica its claims are held by.
    pub fn replica(&self) -> Uuid {
        self.replica
    }

    /// Applies the event log's pending migrations. Safe to run from several
    /// replicas at once: the migrator takes a database-wide advisory lock.
    pub async fn migrate(&self) -> Result<(), EventLogError> {
        migrator().run(&self.pool).await?;
        Ok(())
    }

    /// The pool the event log runs on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// The event log's migrations, embedded from `migrations/postgres/hub`.
pub fn migrator() -> Migrator {
    websub_store::migrations::migrator(
        include!(concat!(env!("OUT_DIR"), "/postgres_hub.rs")),
        MIGRATIONS_TABLE,
    )
}

/// How [`expand_in`] inserts records on the path where it marks the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Insert {
    /// Without ON CONFLICT: no record can exist unless parts were written.
    Unchecked,
    /// With ON CONFLICT DO NOTHING.
    SkipExisting,
}

/// The body of [`DeliveryQueue::expand`], on its transaction.
async fn expand_in(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    subscribers: &[String],
    now: DateTime<Utc>,
    mode: Insert,
) -> Result<u64, EventLogError> {
    // The UPDATE also locks the event row until commit: a concurrent expand
    // of the same event waits here, then takes the other path and creates
    // nothing that exists, and a purge skips the event or waits. On the other
    // path the insert's foreign-key trigger takes the lock (and fails the
    // statement if a purge got there first).
    let first = sqlx::query(MARK_EXPANDED)
        .bind(event_id)
        .bind(now)
        .execute(&mut **tx)
        .await?
        .rows_affected()
        == 1;
    let insert = if first && mode == Insert::Unchecked {
        EXPAND_FIRST
    } else if first {
        EXPAND_AGAIN
    } else {
        let exists: bool = sqlx::query_scalar(EVENT_EXISTS)
            .bind(event_id)
            .fetch_one(&mut **tx)
            .await?;
        if !exists {
            return Err(EventLogError::UnknownEvent(event_id));
        }
        EXPAND_AGAIN
    };
    let subscribers = super::sorted_unique(subscribers.iter().map(String::as_str));
    let mut created = 0;
    for chunk in subscribers.chunks(EXPAND_CHUNK) {
        created += sqlx::query(insert)
            .bind(event_id)
            .bind(now)
            .bind(chunk)
            .execute(&mut **tx)
            .await?
            .rows_affected();
    }
    Ok(created)
}

#[async_trait]
impl EventIntake for PostgresEventLog {
    async fn record(
        &self,
        event: NewEvent,
        now: DateTime<Utc>,
    ) -> Result<LoggedEvent, EventLogError> {
        let event = LoggedEvent {
            id: Uuid::now_v7(),
            topic: event.topic,
            content_type: event.content_type,
            body: event.body,
            created_at: websub_store::to_micros(now),
            original_id: None,
            trace_context: event.trace_context,
        };
        // Durable before the hub says "accepted", whatever the session's
        // synchronous_commit (see `connect`).
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET LOCAL synchronous_commit = on")
            .execute(&mut *tx)
            .await?;
        sqlx::query(INSERT_EVENT)
            .bind(event.id)
            .bind(&event.topic)
            .bind(&event.content_type)
            .bind(event.body.as_ref())
            .bind(event.created_at)
            .bind(event.trace_context.as_deref())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(event)
    }

    async fn record_once(
        &self,
        id: Uuid,
        event: NewEvent,
        now: DateTime<Utc>,
    ) -> Result<Recorded, EventLogError> {
        let event = LoggedEvent {
            id,
            topic: event.topic,
            content_type: event.content_type,
            body: event.body,
            created_at: websub_store::to_micros(now),
            original_id: None,
            trace_context: event.trace_context,
        };
        // An event found there can be purged before it is read back; the
        // next round then records it again.
        for _ in 0..RECORD_ONCE_ROUNDS {
            let mut tx = self.pool.begin_with(READ_COMMITTED).await?;
            sqlx::query("SET LOCAL synchronous_commit = on")
                .execute(&mut *tx)
                .await?;
            let inserted = sqlx::query(INSERT_EVENT_ONCE)
                .bind(event.id)
                .bind(&event.topic)
                .bind(&event.content_type)
                .bind(event.body.as_ref())
                .bind(event.created_at)
                .bind(event.trace_context.as_deref())
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            if inserted {
                tx.commit().await?;
                return Ok(Recorded {
                    event,
                    created: true,
                });
            }
            let stored = sqlx::query(EVENT).bind(id).fetch_optional(&mut *tx).await?;
            tx.commit().await?;
            if let Some(row) = stored {
                return Ok(Recorded {
                    event: PostgresEventLog::event_of(&row)?,
                    created: false,
                });
            }
        }
        Err(EventLogError::Invalid(format!(
            "event {id} kept being purged while it was recorded"
        )))
    }

    async fn unexpanded(&self, limit: usize) -> Result<Vec<LoggedEvent>, EventLogError> {
        sqlx::query(UNEXPANDED_FREE)
            .bind(bound(limit))
            .bind(self.replica)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(PostgresEventLog::event_of)
            .collect()
    }

    async fn event(&self, id: Uuid) -> Result<Option<LoggedEvent>, EventLogError> {
        self.logged_event(id).await
    }

    async fn has_records(&self, event_id: Uuid) -> Result<bool, EventLogError> {
        self.any_records(event_id).await
    }

    async fn latest(&self, topic: &str) -> Result<Option<LoggedEvent>, EventLogError> {
        self.latest_event(topic).await
    }
}

#[async_trait]
impl DeliveryQueue for PostgresEventLog {
    async fn expand(
        &self,
        event_id: Uuid,
        subscribers: &[String],
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        let mut tx = self.pool.begin_with(READ_COMMITTED).await?;
        match expand_in(&mut tx, event_id, subscribers, now, Insert::Unchecked).await {
            Ok(created) => {
                tx.commit().await?;
                Ok(created)
            }
            // Parts written before a crash: the event is unmarked, yet some
            // of its records exist. Rare; expand again, skipping those.
            Err(EventLogError::Database(error)) if is_unique_violation(&error) => {
                drop(tx);
                let mut tx = self.pool.begin_with(READ_COMMITTED).await?;
                let created =
                    expand_in(&mut tx, event_id, subscribers, now, Insert::SkipExisting).await?;
                tx.commit().await?;
                Ok(created)
            }
            Err(error) => Err(error),
        }
    }

    async fn expand_claimed(
        &self,
        event_id: Uuid,
        subscribers: &[&str],
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, EventLogError> {
        delivery_path::expand_claimed(self, event_id, subscribers, now).await
    }

    /// Yes: each expansion is one replica's ([`DeliveryQueue::take_expansion`]).
    fn holds_records(&self) -> bool {
        true
    }

    async fn take_expansion(&self, event_id: Uuid) -> Result<ExpansionClaim, EventLogError> {
        delivery_path::take_expansion(self, event_id).await
    }

    async fn expand_waiting(
        &self,
        event_id: Uuid,
        subscribers: &[&str],
        due: DateTime<Utc>,
        ordered: bool,
    ) -> Result<u64, EventLogError> {
        delivery_path::expand_waiting(self, event_id, subscribers, due, ordered).await
    }

    async fn claim_lanes(
        &self,
        lanes: &[(&str, usize)],
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<Claimed>, EventLogError> {
        delivery_path::claim_lanes(self, lanes, now, visibility).await
    }

    async fn claim_ordered(
        &self,
        lanes: &[&str],
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<Claimed>, EventLogError> {
        delivery_path::claim_ordered(self, lanes, now, visibility).await
    }

    async fn set_ordered(
        &self,
        topic: &str,
        callback: &str,
        ordered: bool,
        now: DateTime<Utc>,
    ) -> Result<(), EventLogError> {
        self.keep_ordered(topic, callback, ordered, now).await
    }

    async fn ordered_subscriptions(
        &self,
        limit: usize,
    ) -> Result<Vec<OrderedSubscription>, EventLogError> {
        self.ordered(limit).await
    }

    async fn due_lanes(&self, limit: usize) -> Result<Vec<(String, DateTime<Utc>)>, EventLogError> {
        self.lanes_due(limit).await
    }

    async fn release_claims(&self) -> Result<u64, EventLogError> {
        // Replicas share this log: a claim found at start may be a live
        // replica's. A dead one's are handed back by the replicas'
        // heartbeat (crate::storage::replicas), the rest by the visibility timeout.
        Ok(0)
    }

    async fn drop_since(
        &self,
        topic: &str,
        subscriber: &str,
        since: DateTime<Utc>,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        self.drop_records_since(topic, subscriber, since, reason, now)
            .await
    }

    async fn release_endpoint(
        &self,
        subscriber: &str,
        failing_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        self.release_failing(subscriber, failing_since, now).await
    }

    async fn claim(
        &self,
        limit: usize,
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<Claimed>, EventLogError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        sqlx::query(CLAIM)
            .bind(now)
            .bind(super::stale_bound(now, visibility))
            .bind(bound(limit))
            .bind(self.replica)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(PostgresEventLog::claimed_of)
            .collect()
    }

    async fn deliver_since(
        &self,
        owed: &[Owed<'_>],
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        if owed.is_empty() {
            return Ok(0);
        }
        let topics: Vec<&str> = owed.iter().map(|owed| owed.topic).collect();
        let subscribers: Vec<&str> = owed.iter().map(|owed| owed.subscriber).collect();
        let since: Vec<DateTime<Utc>> = owed.iter().map(|owed| owed.since).collect();
        Ok(sqlx::query(DELIVER_SINCE)
            .bind(topics)
            .bind(subscribers)
            .bind(since)
            .bind(now)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }
}

#[async_trait]
impl DeliveryOutcomes for PostgresEventLog {
    async fn complete(
        &self,
        completions: &[Completion],
        now: DateTime<Utc>,
    ) -> Result<(), EventLogError> {
        delivery_path::complete(self, completions, now).await
    }

    async fn complete_unwritten(
        &self,
        completions: &[Completion],
        now: DateTime<Utc>,
    ) -> Result<(), EventLogError> {
        delivery_path::complete_unwritten(self, completions, now).await
    }

    async fn attempts(
        &self,
        event_id: Uuid,
        subscriber: &str,
    ) -> Result<Vec<Attempt>, EventLogError> {
        self.attempts_by(ATTEMPTS, event_id, subscriber).await
    }

    /// Each write its own connection and transaction: they overlap on the
    /// server.
    fn writes_at_once(&self) -> usize {
        4
    }
}

super::shared::endpoints::endpoint_states_of!(PostgresEventLog);

#[async_trait]
impl LogUpkeep for PostgresEventLog {
    async fn unapplied_migrations(
        &self,
        limit: std::time::Duration,
    ) -> Result<Vec<i64>, EventLogError> {
        super::unapplied(&migrator(), &self.pool, limit).await
    }

    async fn purge_before(&self, cutoff: DateTime<Utc>) -> Result<u64, EventLogError> {
        // Whole partitions first; rows by age then, where a partition is
        // not all old (the DEFAULT one, the one from before partitioning).
        let mut deleted = partitions::drop_before(self, cutoff).await?;
        loop {
            // The cascade to delivery records must see rows whose insert
            // committed while this delete waited for the event row; see the
            // migration.
            let mut tx = self.pool.begin_with(READ_COMMITTED).await?;
            let chunk = sqlx::query(PURGE)
                .bind(cutoff)
                .bind(PURGE_CHUNK)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            deleted += chunk;
            if chunk == 0 {
                sqlx::query(PURGE_WEBHOOK_ATTEMPTS)
                    .bind(cutoff)
                    .execute(&self.pool)
                    .await?;
                return Ok(deleted);
            }
        }
    }

    async fn partition_ahead(
        &self,
        span: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        partitions::partition_ahead(self, span, now).await
    }
}

#[async_trait]
impl SqlEventLog for PostgresEventLog {
    type Db = Postgres;
    type Writer<'a> = sqlx::pool::PoolConnection<Postgres>;

    const DUE_LANES: &'static str = statements::DUE_LANES;
    const RELEASE_ENDPOINT: &'static str = statements::RELEASE_ENDPOINT;
    const FAILED: &'static str = statements::FAILED;
    const RETRY_FAILED: &'static str = statements::RETRY_FAILED;
    const HEALTH: &'static str = statements::HEALTH;

    fn listing() -> &'static str {
        &operate::LISTING
    }

    fn activity_buckets() -> &'static str {
        &operate::ACTIVITY_BUCKETS
    }

    async fn redeliver_copy(
        &self,
        event_id: Uuid,
        subscribers: &[&str],
        now: DateTime<Utc>,
    ) -> Result<Option<Uuid>, EventLogError> {
        operate::redeliver(&self.pool, event_id, subscribers, now).await
    }

    async fn replay_since(
        &self,
        topic: &str,
        subscriber: &str,
        since: DateTime<Utc>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<super::Replayed, EventLogError> {
        operate::replay(&self.pool, topic, subscriber, since, limit, now).await
    }

    fn change_claim() -> &'static str {
        &changes::CLAIM
    }

    async fn append_rows(
        connection: &mut sqlx::postgres::PgConnection,
        changes: &[super::NewChange],
    ) -> Result<(), EventLogError> {
        changes::append_rows(connection, changes).await
    }

    async fn tally_failures(
        &self,
        channel: &str,
        exhausted: &[Exhaustion<'_>],
        delivered: &[&str],
        disable_after: u32,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, EventLogError> {
        operate::tally_endpoints(
            &self.pool,
            channel,
            exhausted,
            delivered,
            disable_after,
            now,
        )
        .await
    }

    async fn write_webhook_attempts(
        &self,
        attempts: &[WebhookAttempt<'_>],
    ) -> Result<(), EventLogError> {
        operate::keep_webhook_attempts(&self.pool, attempts).await
    }

    fn reads(&self) -> &PgPool {
        &self.pool
    }

    async fn writer(&self) -> Result<Self::Writer<'_>, EventLogError> {
        Ok(self.pool.acquire().await?)
    }
}
