//! The SQLite event log: events and delivery records in one local file, the
//! embedded default.
//!
//! It owns the `websub_events` and `websub_deliveries` tables and their
//! migrations (`migrations/sqlite/hub`, embedded at build time), recorded in
//! their own table, `websub_hub_migrations`, so the subscription store can
//! share the file. The tables are the PostgreSQL backend's wherever the
//! dialects allow: ids are 16-byte BLOBs, timestamps INTEGER microseconds
//! since the Unix epoch.
//!
//! The behaviour is the [`EventLog`](super::EventLog) contract. What this backend adds:
//!
//! - **Durability.** The file is in WAL mode with `synchronous = NORMAL`: a
//!   committed transaction is written to the WAL file (the operating
//!   system's page cache) before the commit returns, so it survives the
//!   process being killed at any point. The WAL is only flushed to the disk
//!   at checkpoints, though, so a power loss or an operating-system crash can
//!   roll back the transactions committed since the last one (it never
//!   corrupts the file). That trade saves two disk flushes per claim and
//!   completion batch; deployments that must not lose an accepted event to a
//!   power cut should use PostgreSQL (or `synchronous = FULL` via
//!   [`SqliteEventLog::from_pool`]).
//! - **One writer.** Every write in every process queues for the file's write
//!   lock, waiting up to [`BUSY_TIMEOUT`]. Claims therefore cannot overlap:
//!   each one holds the lock from choosing its rows to marking them. Within
//!   one process every write to the file (the log's, the backlog's and the
//!   subscription store's) goes through one connection, queueing for it on
//!   an async lock ([`websub_store::sqlite::Writer`]): a waiting write starts
//!   the moment the previous one commits, where SQLite's busy handler would
//!   have it sleep in steps of up to 100 ms and stall deliveries.
//! - **A transaction, one round trip.** sqlx runs SQLite on a thread of its
//!   own, and each statement, `BEGIN` and `COMMIT` is a round trip to it:
//!   two thread switches, and tens of microseconds on a busy machine. The
//!   writes of the delivery path (claims, outcomes) therefore go as one
//!   script, `BEGIN IMMEDIATE; …; COMMIT`, in one round trip
//!   (`SqliteEventLog::run_script`).
//! - **JSON parameters.** SQLite has no array type and allows at most 32 766
//!   bind parameters per statement, so batches (subscribers to expand,
//!   completions) travel as one JSON array parameter read with `json_each`:
//!   one statement, prepared once, whatever the batch size.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::{Connection, Sqlite};
use uuid::Uuid;
use websub_store::sqlite::Writer;

use crate::storage::dialect::{Dialect as _, bound};

mod changes;
mod delivery_path;
mod operate;
mod retention;
mod rows;
mod statements;
mod writer;

use super::shared::SqlEventLog;

super::sessions::admin_sessions_of!(SqliteEventLog, |log| log.writer().await?);
super::denials::deny_list_of!(SqliteEventLog, |log| log.writer().await?);
super::signing::subscription_signing_of!(SqliteEventLog, |log| log.writer().await?);

use statements::{
    ANY_SINCE, ATTEMPTS, CLAIM, DELIVER_SINCE, EVENT, EVENT_EXISTS, EXPAND, INSERT_EVENT,
    INSERT_EVENT_ONCE, MARK_EXPANDED, MIGRATIONS_TABLE, RELEASE_CLAIMS, UNEXPANDED,
};

use super::{
    Attempt, Claimed, Completion, DeliveryOutcomes, DeliveryQueue, EventIntake, EventLogError,
    ExpansionClaim, LogUpkeep, LoggedEvent, NewEvent, OrderedSubscription, Owed, Recorded,
};

/// The file is opened the way the subscription store opens it (the two share
/// it by default): these are the store's pool size and busy timeout.
pub use websub_store::sqlite::{BUSY_TIMEOUT, POOL_SIZE};

/// Subscribers per `INSERT` in [`DeliveryQueue::expand`]: one JSON parameter each,
/// so this bounds the size of one statement's argument, not a variable count.
const EXPAND_CHUNK: usize = 10_000;

/// The event log in a SQLite database file.
///
/// Cloning is cheap and shares the pool.
#[derive(Debug, Clone)]
pub struct SqliteEventLog {
    pool: SqlitePool,
    /// The connection every write to the file goes through; see the
    /// module doc.
    writer: Arc<Writer>,
}

impl SqliteEventLog {
    /// Opens the database at `url_or_path` (a `sqlite:` URL or a plain file
    /// path), creating the file if it is missing, and brings the schema up to
    /// date.
    ///
    /// Every connection runs in WAL mode with `synchronous = NORMAL` (see the
    /// module doc) and foreign keys on, and waits up to [`BUSY_TIMEOUT`] for
    /// the write lock; the pool holds at most [`POOL_SIZE`] connections.
    pub async fn connect(url_or_path: &str) -> Result<Self, EventLogError> {
        let options = websub_store::sqlite::connect_options(url_or_path)?;
        let log = Self::from_pool(websub_store::sqlite::open_pool(options).await?);
        log.migrate().await?;
        Ok(log)
    }

    /// An event log on an existing pool, for a caller that runs
    /// [`migrate`](Self::migrate) itself (or knows the schema is current).
    /// The pool's options are the caller's; foreign keys must be on, or
    /// purging leaves delivery rows behind.
    pub fn from_pool(pool: SqlitePool) -> Self {
        Self {
            writer: Writer::of(&pool),
            pool,
        }
    }

    /// Applies the event log's pending migrations.
    ///
    /// sqlx's SQLite migrator takes no lock of its own, so two processes
    /// opening a new file at once would both try to create the tables. The
    /// whole run is therefore one `BEGIN IMMEDIATE` transaction: the second
    /// process waits for the first, then finds nothing left to apply.
    pub async fn migrate(&self) -> Result<(), EventLogError> {
        websub_store::sqlite::migrate_locked(&self.pool, &migrator()).await?;
        Ok(())
    }

    /// The pool the event log runs on.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// The event log's migrations, embedded from `migrations/sqlite/hub`.
pub fn migrator() -> Migrator {
    websub_store::migrations::migrator(
        include!(concat!(env!("OUT_DIR"), "/sqlite_hub.rs")),
        MIGRATIONS_TABLE,
    )
}

/// The body of [`DeliveryQueue::expand`], on a transaction holding the write lock.
async fn expand_in(
    tx: &mut SqliteConnection,
    event_id: Uuid,
    subscribers: &[String],
    now: i64,
) -> Result<u64, EventLogError> {
    // First, so that a missing event is reported even when there is no
    // subscriber (with subscribers, the foreign key would refuse the rows).
    let marked = sqlx::query(MARK_EXPANDED)
        .bind(event_id)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if marked == 0 {
        return Err(EventLogError::UnknownEvent(event_id));
    }
    let subscribers = super::sorted_unique(subscribers.iter().map(String::as_str));
    let mut created = 0;
    for chunk in subscribers.chunks(EXPAND_CHUNK) {
        let chunk = serde_json::to_string(chunk)
            .map_err(|error| EventLogError::Invalid(error.to_string()))?;
        created += sqlx::query(EXPAND)
            .bind(event_id)
            .bind(now)
            .bind(chunk)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    Ok(created)
}

/// `subscribers` in JSON arrays of at most [`EXPAND_CHUNK`], one statement's
/// parameter each.
fn json_chunks(subscribers: &[&str]) -> Result<Vec<String>, EventLogError> {
    subscribers
        .chunks(EXPAND_CHUNK)
        .map(serde_json::to_string)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| EventLogError::Invalid(error.to_string()))
}

/// An expansion's records need their event: a missing one is
/// [`EventLogError::UnknownEvent`] rather than a foreign-key failure.
async fn event_must_exist(pool: &SqlitePool, event_id: Uuid) -> Result<(), EventLogError> {
    let exists: bool = sqlx::query_scalar(EVENT_EXISTS)
        .bind(event_id)
        .fetch_one(pool)
        .await?;
    if exists {
        Ok(())
    } else {
        Err(EventLogError::UnknownEvent(event_id))
    }
}

#[async_trait]
impl EventIntake for SqliteEventLog {
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
        let mut writer = self.writer().await?;
        sqlx::query(INSERT_EVENT)
            .bind(event.id)
            .bind(&event.topic)
            .bind(&event.content_type)
            .bind(event.body.as_ref())
            .bind(event.created_at.timestamp_micros())
            .bind(event.trace_context.as_deref())
            .execute(&mut *writer)
            .await?;
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
        let mut writer = self.writer().await?;
        // One transaction under the write lock: an event found there stays
        // until it is read back, whatever another process purges meanwhile.
        let mut tx = writer.begin_with(Sqlite::BEGIN_WRITE).await?;
        let inserted = sqlx::query(INSERT_EVENT_ONCE)
            .bind(event.id)
            .bind(&event.topic)
            .bind(&event.content_type)
            .bind(event.body.as_ref())
            .bind(event.created_at.timestamp_micros())
            .bind(event.trace_context.as_deref())
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        let recorded = if inserted {
            Recorded {
                event,
                created: true,
            }
        } else {
            let row = sqlx::query(EVENT).bind(id).fetch_one(&mut *tx).await?;
            Recorded {
                event: SqliteEventLog::event_of(&row)?,
                created: false,
            }
        };
        tx.commit().await?;
        Ok(recorded)
    }

    async fn unexpanded(&self, limit: usize) -> Result<Vec<LoggedEvent>, EventLogError> {
        sqlx::query(UNEXPANDED)
            .bind(bound(limit))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(SqliteEventLog::event_of)
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
impl DeliveryQueue for SqliteEventLog {
    async fn expand_claimed(
        &self,
        event_id: Uuid,
        subscribers: &[&str],
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, EventLogError> {
        delivery_path::expand_claimed(self, event_id, subscribers, now).await
    }

    async fn expand(
        &self,
        event_id: Uuid,
        subscribers: &[String],
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        // IMMEDIATE: the write lock is taken (or waited for) at BEGIN, not on
        // the first write, where a stale read snapshot would fail at once.
        let mut writer = self.writer().await?;
        let mut tx = writer.begin_with(Sqlite::BEGIN_WRITE).await?;
        let created = expand_in(&mut tx, event_id, subscribers, now.timestamp_micros()).await?;
        tx.commit().await?;
        Ok(created)
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
        visibility: Duration,
    ) -> Result<Vec<Claimed>, EventLogError> {
        delivery_path::claim_lanes(self, lanes, now, visibility).await
    }

    async fn claim_ordered(
        &self,
        lanes: &[&str],
        now: DateTime<Utc>,
        visibility: Duration,
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
        let mut writer = self.writer().await?;
        Ok(sqlx::query(RELEASE_CLAIMS)
            .execute(&mut *writer)
            .await?
            .rows_affected())
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
        visibility: Duration,
    ) -> Result<Vec<Claimed>, EventLogError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Under the write lock from the start, so no other claim (from this
        // process or another) can pick rows between this one's choice and
        // its mark; see `expand` for why IMMEDIATE.
        let mut writer = self.writer().await?;
        let mut tx = writer.begin_with(Sqlite::BEGIN_WRITE).await?;
        let (now, stale) = delivery_path::claim_times(now, visibility);
        let rows = sqlx::query(CLAIM)
            .bind(now)
            .bind(stale)
            .bind(bound(limit))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter().map(SqliteEventLog::claimed_of).collect()
    }

    /// Yes: the log's file is opened by one process at a time.
    fn holds_records(&self) -> bool {
        true
    }

    /// Always taken: no other process opens the file.
    async fn take_expansion(&self, event_id: Uuid) -> Result<ExpansionClaim, EventLogError> {
        Ok(ExpansionClaim::Taken {
            afresh: !self.has_records(event_id).await?,
        })
    }

    async fn deliver_since(
        &self,
        owed: &[Owed<'_>],
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        // Most new subscriptions have nothing to catch up with: one read,
        // beside the writer, says which, without queueing for it. An event
        // recorded after this read is expanded after it too, when the
        // subscription is already saved, so it finds the subscriber itself.
        let pairs: Vec<(&str, i64)> = owed
            .iter()
            .map(|owed| (owed.topic, owed.since.timestamp_micros()))
            .collect();
        let pairs = serde_json::to_string(&pairs)
            .map_err(|error| EventLogError::Invalid(error.to_string()))?;
        let positions: Vec<i64> = sqlx::query_scalar(ANY_SINCE)
            .bind(pairs)
            .fetch_all(&self.pool)
            .await?;
        let behind: Vec<&Owed<'_>> = positions
            .iter()
            .filter_map(|position| owed.get(usize::try_from(*position).ok()?))
            .collect();
        if behind.is_empty() {
            return Ok(0);
        }
        let mut writer = self.writer().await?;
        let mut written = 0;
        for owed in behind {
            written += sqlx::query(DELIVER_SINCE)
                .bind(owed.topic)
                .bind(owed.subscriber)
                .bind(owed.since.timestamp_micros())
                .bind(now.timestamp_micros())
                .execute(&mut *writer)
                .await?
                .rows_affected();
        }
        Ok(written)
    }
}

#[async_trait]
impl DeliveryOutcomes for SqliteEventLog {
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

    /// One: the writes of this log queue for its one write connection.
    fn writes_at_once(&self) -> usize {
        1
    }
}

super::shared::endpoints::endpoint_states_of!(SqliteEventLog);

#[async_trait]
impl LogUpkeep for SqliteEventLog {
    async fn unapplied_migrations(
        &self,
        limit: std::time::Duration,
    ) -> Result<Vec<i64>, EventLogError> {
        super::unapplied(&migrator(), &self.pool, limit).await
    }

    async fn purge_before(&self, cutoff: DateTime<Utc>) -> Result<u64, EventLogError> {
        retention::purge_before(self, cutoff).await
    }
}
