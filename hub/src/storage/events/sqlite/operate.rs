//! The SQLite parts of the operators' calls, those its dialect spells its
//! own way: the list's statement, redeliveries and replays, the endpoints'
//! tally, the activity buckets and the outbox webhooks' attempts kept. The
//! calls themselves are written once ([`super::super::shared`]). Writes run on the log's
//! write connection, in one transaction each.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Sqlite};
use uuid::Uuid;

use super::super::operate::{STATE_SQL, disabled_after};
use super::super::sql::operate::DISABLE_TALLIED;
use super::super::{EventLogError, Exhaustion, Replayed, WebhookAttempt};
use super::rows::{from_micros, hex};
use crate::storage::dialect::Dialect as _;

/// Newest first; each filter is a parameter that is NULL when unset.
pub(super) static LISTING: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT * FROM ( \
             SELECT d.event_id, e.original_id, e.topic, d.subscriber, e.created_at, \
                    {STATE_SQL} AS state, d.retry_count, d.last_error, d.processed_at, \
                    d.next_attempt_at \
             FROM websub_events AS e JOIN websub_deliveries AS d ON d.event_id = e.id \
             WHERE ($1 IS NULL OR e.id = $1 OR e.original_id = $1) \
               AND ($2 IS NULL OR e.topic = $2) \
               AND ($3 IS NULL OR d.subscriber = $3) \
               AND ($5 IS NULL OR e.created_at >= $5) \
               AND ($6 IS NULL OR e.created_at < $6)) AS listed \
         WHERE ($4 IS NULL OR state = $4) \
         ORDER BY created_at DESC, event_id DESC, subscriber LIMIT $7"
    )
});

const COPY_EVENT: &str = "INSERT INTO websub_events \
     (id, topic, content_type, body, created_at, expanded_at, original_id) \
     SELECT $2, topic, content_type, body, $3, $3, COALESCE(original_id, id) \
     FROM websub_events WHERE id = $1";

/// Records a copy of each of `originals` with a record due at `now` for
/// each of `subscribers`, on a transaction; the copies' ids, in order.
async fn copy_events(
    tx: &mut SqliteConnection,
    originals: &[Uuid],
    subscribers: &[&str],
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, EventLogError> {
    let subscribers =
        serde_json::to_string(&super::super::sorted_unique(subscribers.iter().copied()))
            .map_err(|error| EventLogError::Invalid(error.to_string()))?;
    let now = now.timestamp_micros();
    let mut copies = Vec::with_capacity(originals.len());
    for original in originals {
        let copy = Uuid::now_v7();
        let copied = sqlx::query(COPY_EVENT)
            .bind(original)
            .bind(copy)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if copied == 0 {
            return Err(EventLogError::UnknownEvent(*original));
        }
        sqlx::query(super::statements::EXPAND)
            .bind(copy)
            .bind(now)
            .bind(&subscribers)
            .execute(&mut *tx)
            .await?;
        copies.push(copy);
    }
    Ok(copies)
}

pub(super) async fn redeliver(
    writer: &mut SqliteConnection,
    event_id: Uuid,
    subscribers: &[&str],
    now: DateTime<Utc>,
) -> Result<Option<Uuid>, EventLogError> {
    let mut tx = writer.begin_with(Sqlite::BEGIN_WRITE).await?;
    match copy_events(&mut tx, &[event_id], subscribers, now).await {
        Ok(copies) => {
            tx.commit().await?;
            Ok(copies.into_iter().next())
        }
        Err(EventLogError::UnknownEvent(_)) => Ok(None),
        Err(error) => Err(error),
    }
}

const REPLAYED: &str = "SELECT id, created_at FROM websub_events \
     WHERE topic = $1 AND created_at >= $2 AND original_id IS NULL \
     ORDER BY created_at, id LIMIT $3";

pub(super) async fn replay(
    writer: &mut SqliteConnection,
    topic: &str,
    subscriber: &str,
    since: DateTime<Utc>,
    limit: usize,
    now: DateTime<Utc>,
) -> Result<Replayed, EventLogError> {
    let mut tx = writer.begin_with(Sqlite::BEGIN_WRITE).await?;
    let mut found: Vec<(Uuid, i64)> = sqlx::query_as(REPLAYED)
        .bind(topic)
        .bind(since.timestamp_micros())
        .bind(i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?;
    let resume_since = if found.len() > limit {
        Some(from_micros(found[limit].1)?)
    } else {
        None
    };
    found.truncate(limit);
    let originals: Vec<Uuid> = found.iter().map(|(id, _)| *id).collect();
    let redeliveries = copy_events(&mut tx, &originals, &[subscriber], now).await?;
    tx.commit().await?;
    Ok(Replayed {
        redeliveries,
        resume_since,
    })
}

const TALLY_EXHAUSTED: &str = "INSERT INTO websub_endpoints AS w \
     (channel, endpoint, failures, last_failure_at, last_error) VALUES ($5, $1, $2, $3, $4) \
     ON CONFLICT (channel, endpoint) DO UPDATE \
     SET failures = w.failures + excluded.failures, last_failure_at = excluded.last_failure_at, \
         last_error = excluded.last_error \
     RETURNING failures, disabled_at IS NOT NULL AS disabled";

const CLEAR_DELIVERED: &str = "DELETE FROM websub_endpoints \
     WHERE channel = $2 AND endpoint IN (SELECT value FROM json_each($1)) \
       AND disabled_at IS NULL";

pub(super) async fn tally_endpoints(
    writer: &mut SqliteConnection,
    channel: &str,
    exhausted: &[Exhaustion<'_>],
    delivered: &[&str],
    disable_after: u32,
    now: DateTime<Utc>,
) -> Result<Vec<String>, EventLogError> {
    // Per endpoint: how many exhaustions, and the last one's error.
    let mut counted: BTreeMap<&str, (i64, &str)> = BTreeMap::new();
    for exhaustion in exhausted {
        let entry = counted.entry(exhaustion.endpoint).or_insert((0, ""));
        entry.0 += 1;
        entry.1 = exhaustion.error;
    }
    let now = now.timestamp_micros();
    let mut tx = writer.begin_with(Sqlite::BEGIN_WRITE).await?;
    if !delivered.is_empty() {
        let delivered = serde_json::to_string(delivered)
            .map_err(|error| EventLogError::Invalid(error.to_string()))?;
        sqlx::query(CLEAR_DELIVERED)
            .bind(delivered)
            .bind(channel)
            .execute(&mut *tx)
            .await?;
    }
    let mut disabled = Vec::new();
    for (endpoint, (failures, error)) in counted {
        let (total, already): (i64, bool) = sqlx::query_as(TALLY_EXHAUSTED)
            .bind(endpoint)
            .bind(failures)
            .bind(now)
            .bind(error)
            .bind(channel)
            .fetch_one(&mut *tx)
            .await?;
        if disable_after == 0 || already || total < i64::from(disable_after) {
            continue;
        }
        sqlx::query(DISABLE_TALLIED)
            .bind(endpoint)
            .bind(now)
            .bind(disabled_after(total))
            .bind(channel)
            .execute(&mut *tx)
            .await?;
        disabled.push(endpoint.to_owned());
    }
    tx.commit().await?;
    Ok(disabled)
}

// One row of `$1` per attempt: [event id as hex, webhook, attempted at in
// µs, duration in µs, status, error, response as hex].
const KEEP_WEBHOOK_ATTEMPTS: &str = "INSERT INTO websub_webhook_attempts \
     (event_id, subscriber, attempted_at, duration_us, status, error, response) \
     SELECT unhex(value ->> 0), value ->> 1, value ->> 2, value ->> 3, value ->> 4, \
            value ->> 5, unhex(value ->> 6) \
     FROM json_each($1)";

pub(super) async fn keep_webhook_attempts(
    writer: &mut SqliteConnection,
    attempts: &[WebhookAttempt<'_>],
) -> Result<(), EventLogError> {
    let rows: Vec<_> = attempts
        .iter()
        .map(|kept| {
            (
                kept.event_id.simple().to_string(),
                kept.subscriber,
                kept.attempt.at.timestamp_micros(),
                kept.attempt.duration_micros,
                kept.attempt.status,
                kept.attempt.error.as_deref(),
                hex(&kept.attempt.response),
            )
        })
        .collect();
    let rows =
        serde_json::to_string(&rows).map_err(|error| EventLogError::Invalid(error.to_string()))?;
    sqlx::query(KEEP_WEBHOOK_ATTEMPTS)
        .bind(rows)
        .execute(&mut *writer)
        .await?;
    Ok(())
}

// Times are microseconds here: the distance is a subtraction.
pub(super) static ACTIVITY_BUCKETS: LazyLock<String> =
    LazyLock::new(|| super::super::sql::activity::buckets("(at - $1)"));
