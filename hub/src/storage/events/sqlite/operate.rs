//! The SQLite statements behind the operators' calls: listing delivery
//! records, redeliveries and replays, and the endpoints' tally; and the
//! log's [`DeliveryOperations`], which call them. Writes run on the log's
//! write connection, in one transaction each.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{AssertSqlSafe, Connection, Row};
use uuid::Uuid;

use super::super::operate::{
    BucketRow, STATE_SQL, disabled_after, endpoint_activity, fill_buckets,
};
use super::super::sql::operate::{DISABLE, DISABLE_TALLIED, ENABLE, ENDPOINT, ENDPOINTS};
use super::super::{
    Activity, ActivityWindow, DeliveryFilter, DeliveryHealth, DeliveryOperations, DeliveryRecord,
    DeliveryState, DeliverySummary, EndpointRecord, EventLogError, Exhaustion, FailedDelivery,
    FailedFilter, Replayed, Undelivered, WebhookAttempt, invalid,
};
use super::SqlEventLog;
use super::SqliteEventLog;
use super::rows::{from_micros, hex};
use super::statements::{
    DELIVERED_SINCE, DELIVERIES, DELIVERY, FAILED, HEALTH, RETRY_FAILED, UNDELIVERED,
};

/// Newest first; each filter is a parameter that is NULL when unset.
fn list_sql() -> String {
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
}

pub(super) async fn list(
    pool: &SqlitePool,
    filter: DeliveryFilter<'_>,
    limit: usize,
) -> Result<Vec<DeliverySummary>, EventLogError> {
    sqlx::query(AssertSqlSafe(list_sql()))
        .bind(filter.event_id)
        .bind(filter.topic)
        .bind(filter.subscriber)
        .bind(filter.state.map(DeliveryState::as_str))
        .bind(filter.since.map(|since| since.timestamp_micros()))
        .bind(filter.until.map(|until| until.timestamp_micros()))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(pool)
        .await?
        .iter()
        .map(summary_from_row)
        .collect()
}

fn summary_from_row(row: &SqliteRow) -> Result<DeliverySummary, EventLogError> {
    let state: &str = row.try_get("state").map_err(invalid)?;
    Ok(DeliverySummary {
        event_id: row.try_get("event_id").map_err(invalid)?,
        original_id: row.try_get("original_id").map_err(invalid)?,
        topic: row.try_get("topic").map_err(invalid)?,
        subscriber: row.try_get("subscriber").map_err(invalid)?,
        created_at: SqliteEventLog::time_of(row, "created_at")?,
        state: DeliveryState::parse(state)
            .ok_or_else(|| EventLogError::Invalid(format!("delivery state {state:?}")))?,
        retry_count: SqliteEventLog::count_of(row, "retry_count")?,
        last_error: row.try_get("last_error").map_err(invalid)?,
        processed_at: SqliteEventLog::optional_time_of(row, "processed_at")?,
        next_attempt_at: SqliteEventLog::optional_time_of(row, "next_attempt_at")?,
    })
}

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
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
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
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
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

pub(super) async fn endpoints(
    pool: &SqlitePool,
    channel: &str,
    limit: usize,
) -> Result<Vec<EndpointRecord>, EventLogError> {
    sqlx::query(ENDPOINTS)
        .bind(channel)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(pool)
        .await?
        .iter()
        .map(endpoint_from_row)
        .collect()
}

pub(super) async fn endpoint(
    pool: &SqlitePool,
    channel: &str,
    endpoint: &str,
) -> Result<Option<EndpointRecord>, EventLogError> {
    sqlx::query(ENDPOINT)
        .bind(channel)
        .bind(endpoint)
        .fetch_optional(pool)
        .await?
        .as_ref()
        .map(endpoint_from_row)
        .transpose()
}

fn endpoint_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<EndpointRecord, EventLogError> {
    let failures: i64 = row.try_get("failures").map_err(invalid)?;
    Ok(EndpointRecord {
        channel: row.try_get("channel").map_err(invalid)?,
        endpoint: row.try_get("endpoint").map_err(invalid)?,
        failures: u32::try_from(failures)
            .map_err(|_| EventLogError::Invalid(format!("failures {failures}")))?,
        last_failure_at: SqliteEventLog::optional_time_of(row, "last_failure_at")?,
        last_error: row.try_get("last_error").map_err(invalid)?,
        disabled_at: SqliteEventLog::optional_time_of(row, "disabled_at")?,
        disabled_reason: row.try_get("disabled_reason").map_err(invalid)?,
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
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
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

pub(super) async fn set_endpoint_disabled(
    writer: &mut SqliteConnection,
    channel: &str,
    endpoint: &str,
    reason: Option<&str>,
    now: DateTime<Utc>,
) -> Result<bool, EventLogError> {
    let changed = match reason {
        Some(reason) => {
            sqlx::query(DISABLE)
                .bind(endpoint)
                .bind(now.timestamp_micros())
                .bind(reason)
                .bind(channel)
                .execute(&mut *writer)
                .await?
        }
        None => {
            sqlx::query(ENABLE)
                .bind(endpoint)
                .bind(channel)
                .execute(&mut *writer)
                .await?
        }
    };
    Ok(changed.rows_affected() > 0)
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
static ACTIVITY_BUCKETS: LazyLock<String> =
    LazyLock::new(|| super::super::sql::activity::buckets("(at - $1)"));
static BUSIEST: LazyLock<String> = LazyLock::new(super::super::sql::activity::busiest);
static FAILING: LazyLock<String> = LazyLock::new(super::super::sql::activity::failing);

async fn activity(pool: &SqlitePool, window: ActivityWindow) -> Result<Activity, EventLogError> {
    let since = window.since.timestamp_micros();
    let until = window.until().timestamp_micros();
    let rows: Vec<BucketRow> = sqlx::query_as(AssertSqlSafe(ACTIVITY_BUCKETS.as_str()))
        .bind(since)
        .bind(until)
        .bind(window.bucket_micros())
        .fetch_all(pool)
        .await?;
    let endpoints = i64::try_from(window.endpoints).unwrap_or(i64::MAX);
    let mut ranked = Vec::with_capacity(2);
    for statement in [&*BUSIEST, &*FAILING] {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(AssertSqlSafe(statement.as_str()))
            .bind(since)
            .bind(until)
            .bind(endpoints)
            .fetch_all(pool)
            .await?;
        ranked.push(endpoint_activity(rows)?);
    }
    let failing = ranked.pop().unwrap_or_default();
    let busiest = ranked.pop().unwrap_or_default();
    Ok(Activity {
        buckets: fill_buckets(&window, &rows)?,
        busiest,
        failing,
    })
}

#[async_trait]
impl DeliveryOperations for SqliteEventLog {
    async fn activity(&self, window: ActivityWindow) -> Result<Activity, EventLogError> {
        activity(&self.pool, window).await
    }

    async fn delivery(
        &self,
        event_id: Uuid,
        subscriber: &str,
    ) -> Result<Option<DeliveryRecord>, EventLogError> {
        sqlx::query(DELIVERY)
            .bind(event_id)
            .bind(subscriber)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(SqliteEventLog::delivery_of)
            .transpose()
    }

    async fn deliveries(&self, event_id: Uuid) -> Result<Vec<DeliveryRecord>, EventLogError> {
        sqlx::query(DELIVERIES)
            .bind(event_id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(SqliteEventLog::delivery_of)
            .collect()
    }

    async fn undelivered(&self) -> Result<Undelivered, EventLogError> {
        let row = sqlx::query(UNDELIVERED).fetch_one(&self.pool).await?;
        Ok(Undelivered {
            records: super::super::count(row.try_get("records").map_err(super::super::invalid)?)?,
            oldest: row
                .try_get::<Option<i64>, _>("oldest")
                .map_err(super::super::invalid)?
                .map(from_micros)
                .transpose()?,
        })
    }

    async fn health(
        &self,
        topic: &str,
        subscriber: &str,
        window: usize,
    ) -> Result<DeliveryHealth, EventLogError> {
        let row = sqlx::query(HEALTH)
            .bind(topic)
            .bind(subscriber)
            .bind(i64::try_from(window).unwrap_or(i64::MAX))
            .fetch_one(&self.pool)
            .await?;
        Ok(DeliveryHealth {
            last_success: SqliteEventLog::optional_time_of(&row, "last_success")?,
            last_error: row.try_get("last_error").map_err(super::super::invalid)?,
            pending: super::super::count(row.try_get("pending").map_err(super::super::invalid)?)?,
            failed: super::super::count(row.try_get("failed").map_err(super::super::invalid)?)?,
        })
    }

    async fn failed(
        &self,
        filter: FailedFilter<'_>,
        limit: usize,
    ) -> Result<Vec<FailedDelivery>, EventLogError> {
        sqlx::query(FAILED)
            .bind(filter.topic)
            .bind(filter.subscriber)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .bind(filter.event_id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|row| {
                Ok(FailedDelivery {
                    event_id: row.try_get("event_id").map_err(super::super::invalid)?,
                    topic: row.try_get("topic").map_err(super::super::invalid)?,
                    subscriber: row.try_get("subscriber").map_err(super::super::invalid)?,
                    created_at: from_micros(
                        row.try_get("created_at").map_err(super::super::invalid)?,
                    )?,
                    retry_count: SqliteEventLog::count_of(row, "retry_count")?,
                    last_error: row.try_get("last_error").map_err(super::super::invalid)?,
                })
            })
            .collect()
    }

    async fn retry_failed(
        &self,
        filter: FailedFilter<'_>,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        let mut writer = self.writer().await?;
        Ok(sqlx::query(RETRY_FAILED)
            .bind(filter.topic)
            .bind(filter.subscriber)
            .bind(now.timestamp_micros())
            .bind(filter.event_id)
            .execute(&mut *writer)
            .await?
            .rows_affected())
    }

    async fn list(
        &self,
        filter: DeliveryFilter<'_>,
        limit: usize,
    ) -> Result<Vec<DeliverySummary>, EventLogError> {
        list(&self.pool, filter, limit).await
    }

    async fn redeliver(
        &self,
        event_id: Uuid,
        subscribers: &[&str],
        now: DateTime<Utc>,
    ) -> Result<Option<Uuid>, EventLogError> {
        let mut writer = self.writer().await?;
        redeliver(&mut writer, event_id, subscribers, now).await
    }

    async fn replay(
        &self,
        topic: &str,
        subscriber: &str,
        since: DateTime<Utc>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Replayed, EventLogError> {
        let mut writer = self.writer().await?;
        replay(&mut writer, topic, subscriber, since, limit, now).await
    }

    async fn delivered_since(&self, since: DateTime<Utc>) -> Result<u64, EventLogError> {
        let row = sqlx::query(DELIVERED_SINCE)
            .bind(since.timestamp_micros())
            .fetch_one(&self.pool)
            .await?;
        super::super::count(row.try_get("delivered").map_err(super::super::invalid)?)
    }
}
