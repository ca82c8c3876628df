//! The SQLite backlog: the backlog's tables in the embedded default's file,
//! beside the event log's. Timestamps are INTEGER microseconds and ids
//! 16-byte BLOBs, as there. Every write goes through the file's one write
//! connection ([`Writer`]), so claims cannot overlap; topic lists travel as
//! one JSON array parameter read with `json_each`.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{Connection, Row};
use uuid::Uuid;
use websub_store::sqlite::Writer;

use super::sql::{
    FETCH_DONE, FETCH_FAILED, FORGET_VALIDATORS, INTENT_FAILED, KEEP_VALIDATORS, PURGE_FETCHES,
    PURGE_INTENTS, RELEASE_FETCH, SUBSCRIBING, WAITING,
};
use super::{
    Admission, Backlog, BacklogError, ClaimedFetch, FetchResult, FetchState, Intent, IntentResult,
    IntentState, Listing, Validators, Waiting, admissions, mode, releases, stale_bound, unsigned,
};
use crate::protocol::SubscriptionRequest;

// `WHERE true` is SQLite's required disambiguation between an upsert's ON and
// a join's ON after INSERT … SELECT.
const REQUEST_FETCHES: &str = "INSERT INTO websub_fetches (topic, requested_at, next_attempt_at, trace_context) \
     SELECT DISTINCT value, $2, $2, $3 FROM json_each($1) WHERE true \
     ON CONFLICT (topic) DO UPDATE SET \
         requested_at = excluded.requested_at, \
         generation = websub_fetches.generation + 1, \
         attempts = 0, \
         next_attempt_at = excluded.next_attempt_at, \
         trace_context = excluded.trace_context";

// RETURNING may read only the updated table, so the validators come from
// scalar subqueries (primary-key lookups). The limit is CAST so that a
// claim of another size does not prepare the statement again (see the event
// log's CLAIM).
const CLAIM_FETCHES: &str = "UPDATE websub_fetches SET processing_since = $1 \
     WHERE rowid IN ( \
         SELECT rowid FROM websub_fetches \
         WHERE next_attempt_at <= $1 \
           AND (processing_since IS NULL OR processing_since < $2) \
         ORDER BY next_attempt_at LIMIT CAST($3 AS INTEGER)) \
     RETURNING topic, requested_at, generation, attempts, trace_context, \
         (SELECT etag FROM websub_topic_validators AS known \
          WHERE known.topic = websub_fetches.topic) AS etag, \
         (SELECT last_modified FROM websub_topic_validators AS known \
          WHERE known.topic = websub_fetches.topic) AS last_modified";

const FETCHES: &str = "SELECT topic, requested_at, attempts, next_attempt_at, last_error \
     FROM websub_fetches \
     WHERE ($1 IS NULL OR (next_attempt_at IS NULL) = $1) \
       AND ($3 IS NULL OR instr(topic, $3) > 0) \
     ORDER BY requested_at DESC LIMIT $2";

// $1 is a JSON array of [topic, callback, id (hex), mode, secret,
// lease_seconds, owner, requested_at] arrays; an element's key is its
// index, so the first $2 − waiting are written. The count is an
// uncorrelated subquery, read once.
const REQUEST_INTENTS: &str = "INSERT INTO websub_verifications \
         (topic, callback, id, mode, secret, lease_seconds, owner, requested_at, next_attempt_at) \
     SELECT value ->> 0, value ->> 1, unhex(value ->> 2), value ->> 3, value ->> 4, \
            value ->> 5, value ->> 6, value ->> 7, value ->> 7 \
     FROM json_each($1) \
     WHERE key < $2 - (SELECT count FROM websub_verifications_waiting) \
     ON CONFLICT (topic, callback) DO UPDATE SET \
         id = excluded.id, mode = excluded.mode, secret = excluded.secret, \
         lease_seconds = excluded.lease_seconds, owner = excluded.owner, \
         requested_at = excluded.requested_at, attempts = 0, \
         next_attempt_at = excluded.next_attempt_at, last_error = NULL \
     RETURNING id";

const CLAIM_INTENTS: &str = "UPDATE websub_verifications SET processing_since = $1 \
     WHERE rowid IN ( \
         SELECT rowid FROM websub_verifications \
         WHERE next_attempt_at <= $1 \
           AND (processing_since IS NULL OR processing_since < $2) \
         ORDER BY next_attempt_at, requested_at LIMIT CAST($3 AS INTEGER)) \
     RETURNING topic, callback, id, mode, secret, lease_seconds, owner, requested_at, attempts";

// Each given as [topic, callback, id in hex]; an intent a newer request
// replaced is not deleted.
const INTENTS_DONE: &str = "DELETE FROM websub_verifications \
     WHERE (topic, callback, id) IN \
         (SELECT value ->> 0, value ->> 1, unhex(value ->> 2) FROM json_each($1)) \
     RETURNING id";

const INTENTS: &str = "SELECT mode, topic, callback, owner, requested_at, attempts, \
         next_attempt_at, last_error \
     FROM websub_verifications \
     WHERE ($1 IS NULL OR owner = $1) \
       AND ($2 IS NULL OR (next_attempt_at IS NULL) = $2) \
       AND ($4 IS NULL OR instr(topic, $4) > 0 OR instr(callback, $4) > 0) \
     ORDER BY requested_at DESC LIMIT $3";

/// The backlog in a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteBacklog {
    pool: SqlitePool,
    /// The file's write connection, shared with the event log and the
    /// subscription store ([`Writer`]).
    writer: Arc<Writer>,
}

impl SqliteBacklog {
    /// Opens the file `url_or_path` names, whose tables the event log's
    /// migrations made.
    pub async fn connect(url_or_path: &str) -> Result<Self, BacklogError> {
        let options = websub_store::sqlite::connect_options(url_or_path)?;
        Ok(Self::from_pool(
            websub_store::sqlite::open_pool(options).await?,
        ))
    }

    /// A backlog on an existing pool.
    pub fn from_pool(pool: SqlitePool) -> Self {
        Self {
            writer: Writer::of(&pool),
            pool,
        }
    }
}

fn limit(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn time(micros: i64) -> Result<DateTime<Utc>, BacklogError> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| BacklogError::Invalid(format!("timestamp out of range: {micros}")))
}

fn optional_time(row: &SqliteRow, column: &str) -> Result<Option<DateTime<Utc>>, BacklogError> {
    row.try_get::<Option<i64>, _>(column)?.map(time).transpose()
}

fn attempts(row: &SqliteRow) -> Result<u32, BacklogError> {
    unsigned(row.try_get("attempts")?)
}

fn json(topics: &[String]) -> String {
    serde_json::to_string(topics).unwrap_or_else(|_| "[]".to_owned())
}

#[async_trait]
impl Backlog for SqliteBacklog {
    async fn request_fetches(
        &self,
        topics: &[String],
        now: DateTime<Utc>,
        trace_context: Option<&str>,
    ) -> Result<(), BacklogError> {
        sqlx::query(REQUEST_FETCHES)
            .bind(json(topics))
            .bind(now.timestamp_micros())
            .bind(trace_context)
            .execute(&mut *self.writer.lock().await?)
            .await?;
        Ok(())
    }

    async fn claim_fetches(
        &self,
        limit_to: usize,
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<ClaimedFetch>, BacklogError> {
        let rows = sqlx::query(CLAIM_FETCHES)
            .bind(now.timestamp_micros())
            .bind(stale_bound(now, visibility).timestamp_micros())
            .bind(limit(limit_to))
            .fetch_all(&mut *self.writer.lock().await?)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(ClaimedFetch {
                    topic: row.try_get("topic")?,
                    requested_at: time(row.try_get("requested_at")?)?,
                    generation: row.try_get("generation")?,
                    attempts: attempts(row)?,
                    trace_context: row.try_get("trace_context")?,
                    validators: Validators {
                        etag: row.try_get("etag")?,
                        last_modified: row.try_get("last_modified")?,
                    },
                })
            })
            .collect()
    }

    async fn finish_fetch(
        &self,
        fetch: &ClaimedFetch,
        result: FetchResult,
        now: DateTime<Utc>,
    ) -> Result<(), BacklogError> {
        let now = now.timestamp_micros();
        // When a failure is due again; none once it failed for good.
        let next_attempt_at = match &result {
            FetchResult::Retry { at, .. } => Some(at.timestamp_micros()),
            _ => None,
        };
        let mut writer = self.writer.lock().await?;
        let mut tx = writer.begin().await?;
        match result {
            FetchResult::Done { validators } => {
                if let Some(validators) = validators {
                    if validators == Validators::default() {
                        sqlx::query(FORGET_VALIDATORS)
                            .bind(&fetch.topic)
                            .execute(&mut *tx)
                            .await?;
                    } else {
                        sqlx::query(KEEP_VALIDATORS)
                            .bind(&fetch.topic)
                            .bind(&validators.etag)
                            .bind(&validators.last_modified)
                            .bind(now)
                            .execute(&mut *tx)
                            .await?;
                    }
                }
                let done = sqlx::query(FETCH_DONE)
                    .bind(&fetch.topic)
                    .bind(fetch.generation)
                    .execute(&mut *tx)
                    .await?;
                if done.rows_affected() == 0 {
                    sqlx::query(RELEASE_FETCH)
                        .bind(&fetch.topic)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            FetchResult::Retry { error, .. } | FetchResult::Failed { error } => {
                sqlx::query(FETCH_FAILED)
                    .bind(&fetch.topic)
                    .bind(fetch.generation)
                    .bind(error)
                    .bind(next_attempt_at)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn fetches(
        &self,
        listing: Listing<'_>,
        limit_to: usize,
    ) -> Result<Vec<FetchState>, BacklogError> {
        let rows = sqlx::query(FETCHES)
            .bind(listing.failed)
            .bind(limit(limit_to))
            .bind(listing.search)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(FetchState {
                    topic: row.try_get("topic")?,
                    requested_at: time(row.try_get("requested_at")?)?,
                    attempts: attempts(row)?,
                    next_attempt_at: optional_time(row, "next_attempt_at")?,
                    last_error: row.try_get("last_error")?,
                })
            })
            .collect()
    }

    async fn request_intents(
        &self,
        intents: &[Intent],
        bound: u64,
    ) -> Result<Vec<Admission>, BacklogError> {
        let rows: Vec<serde_json::Value> = intents
            .iter()
            .map(|intent| {
                let request = &intent.request;
                serde_json::json!([
                    request.topic,
                    request.callback,
                    intent.id.simple().to_string(),
                    request.mode.as_str(),
                    request.secret,
                    request
                        .lease_seconds
                        .map(|seconds| i64::try_from(seconds).unwrap_or(i64::MAX)),
                    request.owner,
                    intent.requested_at.timestamp_micros(),
                ])
            })
            .collect();
        let written: Vec<Vec<u8>> = sqlx::query_scalar(REQUEST_INTENTS)
            .bind(serde_json::Value::Array(rows).to_string())
            .bind(i64::try_from(bound).unwrap_or(i64::MAX))
            .fetch_all(&mut *self.writer.lock().await?)
            .await?;
        let written = written
            .iter()
            .map(|id| Uuid::from_slice(id))
            .collect::<Result<HashSet<Uuid>, _>>()
            .map_err(|error| BacklogError::Invalid(error.to_string()))?;
        admissions(self, intents, &written).await
    }

    async fn waiting(&self) -> Result<Waiting, BacklogError> {
        let (verifications, fetches): (i64, i64) =
            sqlx::query_as(WAITING).fetch_one(&self.pool).await?;
        Ok(Waiting {
            verifications: u64::try_from(verifications).unwrap_or(0),
            fetches: u64::try_from(fetches).unwrap_or(0),
        })
    }

    async fn claim_intents(
        &self,
        limit_to: usize,
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<Intent>, BacklogError> {
        let rows = sqlx::query(CLAIM_INTENTS)
            .bind(now.timestamp_micros())
            .bind(stale_bound(now, visibility).timestamp_micros())
            .bind(limit(limit_to))
            .fetch_all(&mut *self.writer.lock().await?)
            .await?;
        rows.iter()
            .map(|row| {
                let lease: Option<i64> = row.try_get("lease_seconds")?;
                let id: Vec<u8> = row.try_get("id")?;
                Ok(Intent {
                    id: Uuid::from_slice(&id)
                        .map_err(|error| BacklogError::Invalid(error.to_string()))?,
                    request: SubscriptionRequest {
                        mode: mode(row.try_get("mode")?)?,
                        topic: row.try_get("topic")?,
                        callback: row.try_get("callback")?,
                        lease_seconds: lease.and_then(|seconds| u64::try_from(seconds).ok()),
                        secret: row.try_get("secret")?,
                        owner: row.try_get("owner")?,
                    },
                    requested_at: time(row.try_get("requested_at")?)?,
                    attempts: attempts(row)?,
                })
            })
            .collect()
    }

    async fn finish_intents(
        &self,
        finished: &[(Intent, IntentResult)],
    ) -> Result<(), BacklogError> {
        let done: Vec<serde_json::Value> = finished
            .iter()
            .filter(|(_, result)| *result == IntentResult::Done)
            .map(|(intent, _)| {
                let request = &intent.request;
                serde_json::json!([
                    request.topic,
                    request.callback,
                    intent.id.simple().to_string()
                ])
            })
            .collect();
        let mut writer = self.writer.lock().await?;
        let deleted = if done.is_empty() {
            HashSet::new()
        } else {
            let ids: Vec<Vec<u8>> = sqlx::query_scalar(INTENTS_DONE)
                .bind(serde_json::Value::Array(done).to_string())
                .fetch_all(&mut *writer)
                .await?;
            ids.iter()
                .map(|id| Uuid::from_slice(id))
                .collect::<Result<HashSet<Uuid>, _>>()
                .map_err(|error| BacklogError::Invalid(error.to_string()))?
        };
        for (intent, next, error) in releases(finished, &deleted) {
            let request = &intent.request;
            sqlx::query(INTENT_FAILED)
                .bind(&request.topic)
                .bind(&request.callback)
                .bind(error.map(|_| intent.id.as_bytes().as_slice()))
                .bind(next.map(|at| at.timestamp_micros()))
                .bind(error)
                .execute(&mut *writer)
                .await?;
        }
        Ok(())
    }

    async fn intents(
        &self,
        listing: Listing<'_>,
        limit_to: usize,
    ) -> Result<Vec<IntentState>, BacklogError> {
        let rows = sqlx::query(INTENTS)
            .bind(listing.owner)
            .bind(listing.failed)
            .bind(limit(limit_to))
            .bind(listing.search)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(IntentState {
                    mode: mode(row.try_get("mode")?)?,
                    topic: row.try_get("topic")?,
                    callback: row.try_get("callback")?,
                    owner: row.try_get("owner")?,
                    requested_at: time(row.try_get("requested_at")?)?,
                    attempts: attempts(row)?,
                    next_attempt_at: optional_time(row, "next_attempt_at")?,
                    last_error: row.try_get("last_error")?,
                })
            })
            .collect()
    }

    async fn subscribing(&self, topic: &str) -> Result<bool, BacklogError> {
        Ok(sqlx::query_scalar(SUBSCRIBING)
            .bind(topic)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn purge_failed_before(&self, cutoff: DateTime<Utc>) -> Result<u64, BacklogError> {
        let cutoff = cutoff.timestamp_micros();
        let fetches = sqlx::query(PURGE_FETCHES)
            .bind(cutoff)
            .execute(&mut *self.writer.lock().await?)
            .await?;
        let intents = sqlx::query(PURGE_INTENTS)
            .bind(cutoff)
            .execute(&mut *self.writer.lock().await?)
            .await?;
        Ok(fetches.rows_affected() + intents.rows_affected())
    }

    async fn release_claims(&self) -> Result<u64, BacklogError> {
        let fetches = sqlx::query(RELEASE_FETCH_CLAIMS)
            .execute(&mut *self.writer.lock().await?)
            .await?;
        let intents = sqlx::query(RELEASE_INTENT_CLAIMS)
            .execute(&mut *self.writer.lock().await?)
            .await?;
        Ok(fetches.rows_affected() + intents.rows_affected())
    }
}

const RELEASE_FETCH_CLAIMS: &str =
    "UPDATE websub_fetches SET processing_since = NULL WHERE processing_since IS NOT NULL";

const RELEASE_INTENT_CLAIMS: &str =
    "UPDATE websub_verifications SET processing_since = NULL WHERE processing_since IS NOT NULL";
