//! The hub's durable event log: one row per accepted event (a publish's
//! content, a fat ping) and one delivery record per (event, subscriber) —
//! the same two-table shape as a producer's outbox. The dispatcher expands
//! events into delivery records, claims due records, and writes back each
//! outcome; everything it needs to survive a crash is here.
//!
//! Two backends: [`sqlite::SqliteEventLog`] (the embedded default) and
//! [`postgres::PostgresEventLog`] (several hub replicas on one database:
//! claims use `FOR UPDATE SKIP LOCKED` and never overlap). Here are the
//! types they share and their errors; the contract, [`EventLog`] in six
//! parts, is in `contract`; the code both backends run, rows read back and
//! statements bound alike, is written once in `shared`.

mod contract;
pub mod denials;
mod operate;
pub mod postgres;
pub mod sessions;
mod shared;
pub mod signing;
mod sql;
pub mod sqlite;

pub(crate) use contract::complete_unwritten_split;
pub use contract::{
    DeliveryOperations, DeliveryOutcomes, DeliveryQueue, EventIntake, EventLog, ExpansionClaim,
    LogUpkeep, Owed, partition_span,
};
pub use operate::{
    Activity, ActivityBucket, ActivityWindow, DeliveryFilter, DeliverySummary, EndpointActivity,
    Replayed,
};
// Endpoint state, what the delivery core asks of the log: the
// `websub-delivery` crate's contract, which both backends implement.
pub use websub_delivery::state::{
    DeliveryState, EndpointRecord, EndpointStates, EventLogError, Exhaustion, WebhookAttempt,
};
// The history of endpoint changes, kept beside the log.
pub use websub_delivery::history as changes;

pub use denials::{Denial, DeniedField, DenyList};
pub use sessions::{AdminSession, AdminSessions};
pub use signing::{Signing, SigningScheme, SubscriptionSigning};

pub use websub_delivery::history::{
    ChangeFilter, EndpointChange, EndpointChanges, EndpointState, MAX_CHANGES, NewChange, Sent,
    WebhookState,
};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Content accepted for distribution, before it is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// The topic URL the content belongs to.
    pub topic: String,
    /// The topic's Content-Type, exactly (parameters included).
    pub content_type: String,
    /// The content, byte for byte.
    pub body: Bytes,
    /// The trace its spans continue (`crate::telemetry::traces`), kept
    /// while tracing is on.
    pub trace_context: Option<String>,
}

/// A recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedEvent {
    /// Unique. Time-ordered (UUIDv7) when the log assigns it
    /// ([`EventIntake::record`]); the caller's own id otherwise
    /// ([`EventIntake::record_once`]: an outbox event keeps its envelope's).
    /// Deliveries carry it as their event id.
    pub id: Uuid,
    /// The topic URL.
    pub topic: String,
    /// The Content-Type delivered with the body.
    pub content_type: String,
    /// The content.
    pub body: Bytes,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
    /// For a redelivery ([`DeliveryOperations::redeliver`], [`DeliveryOperations::replay`]): the
    /// event it sends again, whose id its deliveries carry.
    pub original_id: Option<Uuid>,
    /// The trace its expansion and attempts continue: the `traceparent`
    /// (and `tracestate`) of its intake, kept while tracing is on.
    pub trace_context: Option<String>,
}

impl LoggedEvent {
    /// The id its deliveries carry: the original's, for a redelivery, so
    /// that a subscriber can tell it has seen the event before.
    pub fn delivered_id(&self) -> Uuid {
        self.original_id.unwrap_or(self.id)
    }
}

/// What [`EventIntake::record_once`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The event as stored.
    pub event: LoggedEvent,
    /// Whether this call stored it; `false` when an event with its id was
    /// there already (and is returned unchanged).
    pub created: bool,
}

/// A subscription that asked for ordered delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderedSubscription {
    pub topic: String,
    pub callback: String,
    /// When it asked: a subscription created later is another one.
    pub since: DateTime<Utc>,
}

/// A delivery record claimed for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The event to deliver.
    pub event_id: Uuid,
    /// The event's topic.
    pub topic: String,
    /// Who it goes to: the subscription's callback URL.
    pub subscriber: String,
    /// Failed attempts so far.
    pub retry_count: u32,
}

/// What became of one claimed delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The subscriber answered 2xx.
    Delivered,
    /// The attempt failed; try again at `next_attempt_at`.
    Retry {
        /// Why the attempt failed (status or transport error).
        error: String,
        /// When the record becomes due again.
        next_attempt_at: DateTime<Utc>,
    },
    /// The attempt failed and no retries are left: the record stops being
    /// claimed and keeps the error for inspection.
    Exhausted {
        /// Why the last attempt failed.
        error: String,
    },
    /// Nothing to deliver any more (the subscription is gone, or answered
    /// 410): the record is closed with the reason kept.
    Dropped {
        /// Why it was dropped.
        reason: String,
    },
    /// Not sent: the endpoint is disabled. The record is closed with the
    /// reason kept, and a replay sends the event again.
    Skipped {
        /// Why it was skipped.
        reason: String,
    },
    /// Not attempted, or failed for want of the hub's own resources (its
    /// callback host was saturated, it had no file descriptor or memory to
    /// spare): due again at `next_attempt_at`, and not a failure of the
    /// subscriber's, so its retries are not counted.
    Postponed {
        /// The local error, if the attempt was made; kept as the last
        /// error.
        error: Option<String>,
        /// When the record becomes due again.
        next_attempt_at: DateTime<Utc>,
    },
}

impl Outcome {
    /// The error (or the reason for dropping) it records; none when
    /// delivered.
    pub fn error(&self) -> Option<&str> {
        match self {
            Self::Delivered => None,
            Self::Retry { error, .. } | Self::Exhausted { error } => Some(error),
            Self::Dropped { reason } | Self::Skipped { reason } => Some(reason),
            Self::Postponed { error, .. } => error.as_deref(),
        }
    }

    /// Its name in the completion statements, which close or reschedule a
    /// record by it.
    fn kind(&self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Retry { .. } => "retry",
            Self::Exhausted { .. } => "exhausted",
            Self::Dropped { .. } => "dropped",
            Self::Skipped { .. } => "skipped",
            Self::Postponed { .. } => "postponed",
        }
    }

    /// When the record is due again; none once it is closed.
    fn next_attempt_at(&self) -> Option<DateTime<Utc>> {
        match self {
            Self::Retry {
                next_attempt_at, ..
            }
            | Self::Postponed {
                next_attempt_at, ..
            } => Some(*next_attempt_at),
            _ => None,
        }
    }
}

/// The outcome of one claimed delivery, ready to be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The event delivered.
    pub event_id: Uuid,
    /// The subscriber it went to.
    pub subscriber: String,
    /// What happened.
    pub outcome: Outcome,
    /// The attempt that came to it, kept in the delivery's history; none
    /// when nothing was sent (the subscription went away first). Its error is
    /// written from `outcome`, so it need not be filled in.
    pub attempt: Option<Attempt>,
}

pub use websub_delivery::attempt::{Attempt, RESPONSE_EXCERPT_BYTES};

/// The full state of one delivery record, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// The event.
    pub event_id: Uuid,
    /// The subscriber.
    pub subscriber: String,
    /// When it was delivered (or dropped); `None` while pending or exhausted.
    pub processed_at: Option<DateTime<Utc>>,
    /// Failed attempts so far.
    pub retry_count: u32,
    /// The last failure, kept after exhaustion.
    pub last_error: Option<String>,
    /// When a dispatcher claimed it, while an attempt is in flight.
    pub processing_since: Option<DateTime<Utc>>,
    /// When it is due; `None` once exhausted or processed.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Where it stands.
    pub state: DeliveryState,
}

/// How deliveries to one subscriber of a topic are going, over the topic's
/// most recent events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryHealth {
    /// When a record was last closed: delivered, or dropped because the
    /// subscription was gone.
    pub last_success: Option<DateTime<Utc>>,
    /// The most recent event's failure, if any of them failed.
    pub last_error: Option<String>,
    /// Records still to be delivered (due, retrying or in flight).
    pub pending: u64,
    /// Records that exhausted their retries.
    pub failed: u64,
}

/// What is left to deliver, for the backlog gauges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Undelivered {
    /// Records due, retrying or in flight.
    pub records: u64,
    /// When the oldest of their events was recorded.
    pub oldest: Option<DateTime<Utc>>,
}

/// A delivery record that exhausted its retries, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedDelivery {
    /// The event.
    pub event_id: Uuid,
    /// The event's topic.
    pub topic: String,
    /// The subscriber (callback URL).
    pub subscriber: String,
    /// When the event was recorded.
    pub created_at: DateTime<Utc>,
    /// Attempts made.
    pub retry_count: u32,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
}

/// Which exhausted records [`DeliveryOperations::failed`] and
/// [`DeliveryOperations::retry_failed`] look at; `None` matches everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailedFilter<'a> {
    /// Only records of events of this topic.
    pub topic: Option<&'a str>,
    /// Only records of this subscriber.
    pub subscriber: Option<&'a str>,
    /// Only the records of this event.
    pub event_id: Option<Uuid>,
}

/// Events one [`DeliveryOperations::replay`] sends again at most.
pub const REPLAY_LIMIT: usize = 10_000;

/// The oldest claim still alive at `now`, or `None` when the visibility
/// timeout reaches before the Unix epoch (no claim is that old).
fn stale_bound(now: DateTime<Utc>, visibility: std::time::Duration) -> Option<DateTime<Utc>> {
    let visibility = chrono::TimeDelta::from_std(visibility).ok()?;
    now.checked_sub_signed(visibility)
        .filter(|bound| *bound >= DateTime::UNIX_EPOCH)
}

/// The versions of `migrator`'s migrations that the database of `pool`
/// has not applied, read within `limit` (see
/// [`LogUpkeep::unapplied_migrations`]).
async fn unapplied<Db>(
    migrator: &sqlx::migrate::Migrator,
    pool: &sqlx::Pool<Db>,
    limit: std::time::Duration,
) -> Result<Vec<i64>, EventLogError>
where
    Db: sqlx::Database,
    for<'c> &'c mut Db::Connection: sqlx::Executor<'c, Database = Db>,
    Db::Arguments: sqlx::IntoArguments<Db>,
    (i64,): for<'r> sqlx::FromRow<'r, Db::Row>,
{
    let applied: Vec<i64> = crate::storage::bounded(limit, pool, async |connection| {
        sqlx::query_scalar(sql::APPLIED_MIGRATIONS)
            .fetch_all(&mut *connection)
            .await
    })
    .await?;
    Ok(migrator
        .iter()
        .filter(|migration| migration.migration_type.is_up_migration())
        .map(|migration| migration.version)
        .filter(|version| !applied.contains(version))
        .collect())
}

/// A write refused because a row like it exists.
fn is_unique_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|error| error.is_unique_violation())
}

/// A column that does not decode is a stored value the backend cannot hold,
/// not a failure of the database.
fn invalid(error: sqlx::Error) -> EventLogError {
    EventLogError::Invalid(error.to_string())
}

/// Subscribers sorted and each once: sorted, the rows go into the primary
/// key's b-tree in key order (byte order on both backends), mostly
/// appending to one leaf rather than splitting pages all over the index;
/// deduplicated, because an insert without ON CONFLICT would fail on a
/// subscriber listed twice.
fn sorted_unique<'a>(subscribers: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut subscribers: Vec<&str> = subscribers.into_iter().collect();
    subscribers.sort_unstable();
    subscribers.dedup();
    subscribers
}

/// A database count as the unsigned number it is.
fn count(value: i64) -> Result<u64, EventLogError> {
    u64::try_from(value).map_err(|_| EventLogError::Invalid(format!("negative count {value}")))
}

/// A stored count of failures or retries as the number it is.
fn small_count(value: Option<i64>) -> Result<Option<u32>, EventLogError> {
    value
        .map(|value| {
            u32::try_from(value).map_err(|_| EventLogError::Invalid(format!("count {value}")))
        })
        .transpose()
}

/// A stored state name as the state.
fn state_of(name: &str) -> Result<EndpointState, EventLogError> {
    EndpointState::parse(name)
        .ok_or_else(|| EventLogError::Invalid(format!("endpoint state {name:?}")))
}

/// A stored webhook state name as the state.
fn webhook_state_of(name: &str) -> Result<WebhookState, EventLogError> {
    WebhookState::parse(name)
        .ok_or_else(|| EventLogError::Invalid(format!("webhook state {name:?}")))
}

/// Opens the event log a database URL names (`sqlite:PATH` or
/// `postgres://…`) and runs its migrations.
pub async fn connect(url: &str) -> Result<std::sync::Arc<dyn EventLog>, EventLogError> {
    if url.starts_with("sqlite:") {
        Ok(std::sync::Arc::new(
            sqlite::SqliteEventLog::connect(url).await?,
        ))
    } else {
        Ok(std::sync::Arc::new(
            postgres::PostgresEventLog::connect(url).await?,
        ))
    }
}

/// [`connect`], with the claims of a PostgreSQL log held by `replica`: the
/// id this process beats under ([`crate::storage::replicas`]), so that they are
/// handed back at once if it dies. SQLite, which one process uses, ignores
/// it.
pub async fn connect_as(
    url: &str,
    replica: Uuid,
) -> Result<std::sync::Arc<dyn EventLog>, EventLogError> {
    if url.starts_with("sqlite:") {
        connect(url).await
    } else {
        Ok(std::sync::Arc::new(
            postgres::PostgresEventLog::connect(url)
                .await?
                .with_replica(replica),
        ))
    }
}
