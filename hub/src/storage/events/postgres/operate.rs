//! The PostgreSQL statements behind the operators' calls: listing delivery
//! records, redeliveries and replays, and the endpoints' tally; and the
//! log's [`DeliveryOperations`], which call them.

use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};
use uuid::Uuid;

use super::super::operate::{BucketRow, STATE_SQL, endpoint_activity, fill_buckets};
use super::super::sql::operate::{DISABLE, DISABLE_TALLIED, ENABLE, ENDPOINT, ENDPOINTS};
use super::super::{
    Activity, ActivityWindow, DeliveryFilter, DeliveryHealth, DeliveryOperations, DeliveryRecord,
    DeliveryState, DeliverySummary, EndpointRecord, EventLogError, Exhaustion, FailedDelivery,
    FailedFilter, Replayed, Undelivered, WebhookAttempt, invalid,
};
use super::SqlEventLog;
use super::statements::{
    DELIVERED_SINCE, DELIVERIES, DELIVERY, FAILED, HEALTH, RETRY_FAILED, UNDELIVERED,
};
use super::{PostgresEventLog, READ_COMMITTED};

/// Newest first; each filter is a parameter that is NULL when unset, so one
/// statement serves them all. A topic walks the (topic, created_at) index;
/// otherwise the events' `created_at` index is walked backwards and each
/// event probes the deliveries' primary key, stopping at the limit.
fn list_sql() -> String {
    format!(
        "SELECT * FROM ( \
             SELECT d.event_id, e.original_id, e.topic, d.subscriber::TEXT AS subscriber, \
                    e.created_at, {STATE_SQL} AS state, d.retry_count, d.last_error, \
                    d.processed_at, d.next_attempt_at \
             FROM websub_events AS e JOIN websub_deliveries AS d ON d.event_id = e.id \
             WHERE ($1::UUID IS NULL OR e.id = $1 OR e.original_id = $1) \
               AND ($2::TEXT IS NULL OR e.topic = $2) \
               AND ($3::TEXT IS NULL OR d.subscriber = $3) \
               AND ($5::TIMESTAMPTZ IS NULL OR e.created_at >= $5) \
               AND ($6::TIMESTAMPTZ IS NULL OR e.created_at < $6)) AS listed \
         WHERE ($4::TEXT IS NULL OR state = $4) \
         ORDER BY created_at DESC, event_id DESC, subscriber LIMIT $7"
    )
}

pub(super) async fn list(
    pool: &PgPool,
    filter: DeliveryFilter<'_>,
    limit: usize,
) -> Result<Vec<DeliverySummary>, EventLogError> {
    sqlx::query(AssertSqlSafe(list_sql()))
        .bind(filter.event_id)
        .bind(filter.topic)
        .bind(filter.subscriber)
        .bind(filter.state.map(DeliveryState::as_str))
        .bind(filter.since)
        .bind(filter.until)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(pool)
        .await?
        .iter()
        .map(summary_from_row)
        .collect()
}

fn summary_from_row(row: &PgRow) -> Result<DeliverySummary, EventLogError> {
    let state: &str = row.try_get("state").map_err(invalid)?;
    Ok(DeliverySummary {
        event_id: row.try_get("event_id").map_err(invalid)?,
        original_id: row.try_get("original_id").map_err(invalid)?,
        topic: row.try_get("topic").map_err(invalid)?,
        subscriber: row.try_get("subscriber").map_err(invalid)?,
        created_at: row.try_get("created_at").map_err(invalid)?,
        state: DeliveryState::parse(state)
            .ok_or_else(|| EventLogError::Invalid(format!("delivery state {state:?}")))?,
        retry_count: PostgresEventLog::count_of(row, "retry_count")?,
        last_error: row.try_get("last_error").map_err(invalid)?,
        processed_at: row.try_get("processed_at").map_err(invalid)?,
        next_attempt_at: row.try_get("next_attempt_at").map_err(invalid)?,
    })
}

// One copy per (original, copy) pair, already expanded: only the records
// written with it are ever delivered.
const COPY_EVENTS: &str = "INSERT INTO websub_events \
     (id, topic, content_type, body, created_at, expanded_at, original_id) \
     SELECT c.copy_id, e.topic, e.content_type, e.body, $3, $3, COALESCE(e.original_id, e.id) \
     FROM unnest($1::UUID[], $2::UUID[]) AS c (original_id, copy_id) \
     JOIN websub_events AS e ON e.id = c.original_id";

const COPY_RECORDS: &str = "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at) \
     SELECT c.copy_id, s.subscriber, $3 \
     FROM unnest($1::UUID[]) AS c (copy_id), unnest($2::TEXT[]) AS s (subscriber)";

/// Records a copy of each of `originals` (all in the log) with a record due
/// at `now` for each of `subscribers`; the copies' ids, in order.
async fn copy_events(
    tx: &mut Transaction<'_, Postgres>,
    originals: &[Uuid],
    subscribers: &[&str],
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, EventLogError> {
    let copies: Vec<Uuid> = originals.iter().map(|_| Uuid::now_v7()).collect();
    let copied = sqlx::query(COPY_EVENTS)
        .bind(originals)
        .bind(&copies)
        .bind(now)
        .execute(&mut **tx)
        .await?
        .rows_affected();
    if copied != copies.len() as u64 {
        return Err(EventLogError::Invalid(format!(
            "{} of {} events to send again were purged meanwhile",
            copies.len() as u64 - copied,
            copies.len()
        )));
    }
    let subscribers = super::super::sorted_unique(subscribers.iter().copied());
    sqlx::query(COPY_RECORDS)
        .bind(&copies)
        .bind(&subscribers)
        .bind(now)
        .execute(&mut **tx)
        .await?;
    Ok(copies)
}

pub(super) async fn redeliver(
    pool: &PgPool,
    event_id: Uuid,
    subscribers: &[&str],
    now: DateTime<Utc>,
) -> Result<Option<Uuid>, EventLogError> {
    let mut tx = pool.begin_with(READ_COMMITTED).await?;
    // Locks the original against a purge until the copy is in.
    let found: Option<Uuid> =
        sqlx::query_scalar("SELECT id FROM websub_events WHERE id = $1 FOR KEY SHARE")
            .bind(event_id)
            .fetch_optional(&mut *tx)
            .await?;
    if found.is_none() {
        return Ok(None);
    }
    let copies = copy_events(&mut tx, &[event_id], subscribers, now).await?;
    tx.commit().await?;
    Ok(copies.into_iter().next())
}

const REPLAYED: &str = "SELECT id, created_at FROM websub_events \
     WHERE topic = $1 AND created_at >= $2 AND original_id IS NULL \
     ORDER BY created_at, id LIMIT $3 FOR KEY SHARE";

pub(super) async fn replay(
    pool: &PgPool,
    topic: &str,
    subscriber: &str,
    since: DateTime<Utc>,
    limit: usize,
    now: DateTime<Utc>,
) -> Result<Replayed, EventLogError> {
    let mut tx = pool.begin_with(READ_COMMITTED).await?;
    let mut found: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(REPLAYED)
        .bind(topic)
        .bind(since)
        .bind(i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?;
    let resume_since = (found.len() > limit).then(|| found[limit].1);
    found.truncate(limit);
    let originals: Vec<Uuid> = found.iter().map(|(id, _)| *id).collect();
    let redeliveries = if originals.is_empty() {
        Vec::new()
    } else {
        copy_events(&mut tx, &originals, &[subscriber], now).await?
    };
    tx.commit().await?;
    Ok(Replayed {
        redeliveries,
        resume_since,
    })
}

pub(super) async fn endpoints(
    pool: &PgPool,
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
    pool: &PgPool,
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

fn endpoint_from_row(row: &sqlx::postgres::PgRow) -> Result<EndpointRecord, EventLogError> {
    Ok(EndpointRecord {
        channel: row.try_get("channel").map_err(invalid)?,
        endpoint: row.try_get("endpoint").map_err(invalid)?,
        failures: PostgresEventLog::count_of(row, "failures")?,
        last_failure_at: row.try_get("last_failure_at").map_err(invalid)?,
        last_error: row.try_get("last_error").map_err(invalid)?,
        disabled_at: row.try_get("disabled_at").map_err(invalid)?,
        disabled_reason: row.try_get("disabled_reason").map_err(invalid)?,
    })
}

// One row per exhaustion; several for one endpoint add up. The last error
// wins. An endpoint that reaches the threshold while enabled is disabled,
// and returned.
const TALLY_EXHAUSTED: &str = "WITH counted AS ( \
         SELECT endpoint, count(*)::INT AS failures, (array_agg(error))[count(*)] AS error \
         FROM unnest($1::TEXT[], $2::TEXT[]) AS x (endpoint, error) GROUP BY endpoint) \
     INSERT INTO websub_endpoints AS w (channel, endpoint, failures, last_failure_at, last_error) \
     SELECT $4, endpoint, failures, $3, error FROM counted \
     ON CONFLICT (channel, endpoint) DO UPDATE \
     SET failures = w.failures + excluded.failures, last_failure_at = excluded.last_failure_at, \
         last_error = excluded.last_error \
     RETURNING endpoint::TEXT, failures, disabled_at IS NOT NULL AS disabled";

const CLEAR_DELIVERED: &str = "DELETE FROM websub_endpoints \
     WHERE channel = $2 AND endpoint = ANY ($1::TEXT[]) AND disabled_at IS NULL";

pub(super) async fn tally_endpoints(
    pool: &PgPool,
    channel: &str,
    exhausted: &[Exhaustion<'_>],
    delivered: &[&str],
    disable_after: u32,
    now: DateTime<Utc>,
) -> Result<Vec<String>, EventLogError> {
    let mut tx = pool.begin_with(READ_COMMITTED).await?;
    if !delivered.is_empty() {
        sqlx::query(CLEAR_DELIVERED)
            .bind(delivered)
            .bind(channel)
            .execute(&mut *tx)
            .await?;
    }
    let mut disabled = Vec::new();
    if !exhausted.is_empty() {
        let endpoints: Vec<&str> = exhausted.iter().map(|x| x.endpoint).collect();
        let errors: Vec<&str> = exhausted.iter().map(|x| x.error).collect();
        let tallied: Vec<(String, i32, bool)> = sqlx::query_as(TALLY_EXHAUSTED)
            .bind(&endpoints)
            .bind(&errors)
            .bind(now)
            .bind(channel)
            .fetch_all(&mut *tx)
            .await?;
        for (endpoint, failures, already) in tallied {
            if disable_after == 0 || already || u32::try_from(failures).unwrap_or(0) < disable_after
            {
                continue;
            }
            let reason = super::super::operate::disabled_after(i64::from(failures));
            sqlx::query(DISABLE_TALLIED)
                .bind(&endpoint)
                .bind(now)
                .bind(&reason)
                .bind(channel)
                .execute(&mut *tx)
                .await?;
            disabled.push(endpoint);
        }
    }
    tx.commit().await?;
    Ok(disabled)
}

pub(super) async fn set_endpoint_disabled(
    pool: &PgPool,
    channel: &str,
    endpoint: &str,
    reason: Option<&str>,
    now: DateTime<Utc>,
) -> Result<bool, EventLogError> {
    let changed = match reason {
        Some(reason) => {
            sqlx::query(DISABLE)
                .bind(endpoint)
                .bind(now)
                .bind(reason)
                .bind(channel)
                .execute(pool)
                .await?
        }
        None => {
            sqlx::query(ENABLE)
                .bind(endpoint)
                .bind(channel)
                .execute(pool)
                .await?
        }
    };
    Ok(changed.rows_affected() > 0)
}

const KEEP_WEBHOOK_ATTEMPTS: &str = "INSERT INTO websub_webhook_attempts \
     (event_id, subscriber, attempted_at, duration_us, status, error, response) \
     SELECT * FROM unnest($1::UUID[], $2::TEXT[], $3::TIMESTAMPTZ[], $4::BIGINT[], \
                          $5::SMALLINT[], $6::TEXT[], $7::BYTEA[])";

pub(super) async fn keep_webhook_attempts(
    pool: &PgPool,
    attempts: &[WebhookAttempt<'_>],
) -> Result<(), EventLogError> {
    if attempts.is_empty() {
        return Ok(());
    }
    let event_ids: Vec<Uuid> = attempts.iter().map(|kept| kept.event_id).collect();
    let subscribers: Vec<&str> = attempts.iter().map(|kept| kept.subscriber).collect();
    let ats: Vec<DateTime<Utc>> = attempts.iter().map(|kept| kept.attempt.at).collect();
    let durations: Vec<i64> = attempts
        .iter()
        .map(|kept| kept.attempt.duration_micros)
        .collect();
    let statuses: Vec<Option<i16>> = attempts
        .iter()
        .map(|kept| {
            kept.attempt
                .status
                .and_then(|status| i16::try_from(status).ok())
        })
        .collect();
    let errors: Vec<Option<&str>> = attempts
        .iter()
        .map(|kept| kept.attempt.error.as_deref())
        .collect();
    let responses: Vec<&[u8]> = attempts
        .iter()
        .map(|kept| kept.attempt.response.as_ref())
        .collect();
    sqlx::query(KEEP_WEBHOOK_ATTEMPTS)
        .bind(event_ids)
        .bind(subscribers)
        .bind(ats)
        .bind(durations)
        .bind(statuses)
        .bind(errors)
        .bind(responses)
        .execute(pool)
        .await?;
    Ok(())
}

// The distance from a TIMESTAMPTZ is an interval; its seconds, in
// microseconds, are exact at the precision PostgreSQL keeps.
static ACTIVITY_BUCKETS: LazyLock<String> = LazyLock::new(|| {
    super::super::sql::activity::buckets("(extract(epoch FROM at - $1) * 1000000)::BIGINT")
});
static BUSIEST: LazyLock<String> = LazyLock::new(super::super::sql::activity::busiest);
static FAILING: LazyLock<String> = LazyLock::new(super::super::sql::activity::failing);

async fn activity(pool: &PgPool, window: ActivityWindow) -> Result<Activity, EventLogError> {
    let until = window.until();
    let rows: Vec<BucketRow> = sqlx::query_as(AssertSqlSafe(ACTIVITY_BUCKETS.as_str()))
        .bind(window.since)
        .bind(until)
        .bind(window.bucket_micros())
        .fetch_all(pool)
        .await?;
    let endpoints = i64::try_from(window.endpoints).unwrap_or(i64::MAX);
    let mut ranked = Vec::with_capacity(2);
    for statement in [&*BUSIEST, &*FAILING] {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(AssertSqlSafe(statement.as_str()))
            .bind(window.since)
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
impl DeliveryOperations for PostgresEventLog {
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
            .map(PostgresEventLog::delivery_of)
            .transpose()
    }

    async fn deliveries(&self, event_id: Uuid) -> Result<Vec<DeliveryRecord>, EventLogError> {
        sqlx::query(DELIVERIES)
            .bind(event_id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(PostgresEventLog::delivery_of)
            .collect()
    }

    async fn undelivered(&self) -> Result<Undelivered, EventLogError> {
        let row = sqlx::query(UNDELIVERED).fetch_one(&self.pool).await?;
        Ok(Undelivered {
            records: super::super::count(row.try_get("records").map_err(super::super::invalid)?)?,
            oldest: row.try_get("oldest").map_err(super::super::invalid)?,
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
            last_success: row.try_get("last_success").map_err(super::super::invalid)?,
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
                    created_at: row.try_get("created_at").map_err(super::super::invalid)?,
                    retry_count: PostgresEventLog::count_of(row, "retry_count")?,
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
        Ok(sqlx::query(RETRY_FAILED)
            .bind(filter.topic)
            .bind(filter.subscriber)
            .bind(now)
            .bind(filter.event_id)
            .execute(&self.pool)
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
        redeliver(&self.pool, event_id, subscribers, now).await
    }

    async fn replay(
        &self,
        topic: &str,
        subscriber: &str,
        since: DateTime<Utc>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Replayed, EventLogError> {
        replay(&self.pool, topic, subscriber, since, limit, now).await
    }

    async fn delivered_since(&self, since: DateTime<Utc>) -> Result<u64, EventLogError> {
        let row = sqlx::query(DELIVERED_SINCE)
            .bind(since)
            .fetch_one(&self.pool)
            .await?;
        super::super::count(row.try_get("delivered").map_err(super::super::invalid)?)
    }
}
