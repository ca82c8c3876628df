//! The PostgreSQL parts of the operators' calls, those its dialect spells its
//! own way: the list's statement, redeliveries and replays, the endpoints'
//! tally, the activity buckets and the outbox webhooks' attempts kept. The
//! calls themselves are written once ([`super::super::shared`]).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::super::operate::STATE_SQL;
use super::super::sql::operate::DISABLE_TALLIED;
use super::super::{EventLogError, Exhaustion, Replayed, WebhookAttempt};
use super::READ_COMMITTED;

/// Newest first; each filter is a parameter that is NULL when unset, so one
/// statement serves them all. A topic walks the (topic, created_at) index;
/// otherwise the events' `created_at` index is walked backwards and each
/// event probes the deliveries' primary key, stopping at the limit.
pub(super) static LISTING: LazyLock<String> = LazyLock::new(|| {
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
});

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

const KEEP_WEBHOOK_ATTEMPTS: &str = "INSERT INTO websub_webhook_attempts \
     (event_id, subscriber, attempted_at, duration_us, status, error, response) \
     SELECT * FROM unnest($1::UUID[], $2::TEXT[], $3::TIMESTAMPTZ[], $4::BIGINT[], \
                          $5::SMALLINT[], $6::TEXT[], $7::BYTEA[])";

pub(super) async fn keep_webhook_attempts(
    pool: &PgPool,
    attempts: &[WebhookAttempt<'_>],
) -> Result<(), EventLogError> {
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
pub(super) static ACTIVITY_BUCKETS: LazyLock<String> = LazyLock::new(|| {
    super::super::sql::activity::buckets("(extract(epoch FROM at - $1) * 1000000)::BIGINT")
});
