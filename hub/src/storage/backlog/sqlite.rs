//! The SQLite backlog: the backlog's tables in the embedded default's file,
//! beside the event log's. Timestamps are INTEGER microseconds and ids
//! 16-byte BLOBs, as there. Every write goes through the file's one write
//! connection ([`Writer`]), so claims cannot overlap; topic lists travel as
//! one JSON array parameter read with `json_each`.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use tokio::sync::MappedMutexGuard;
use uuid::Uuid;
use websub_store::sqlite::Writer;

use super::shared::SqlBacklog;
use super::{BacklogError, Intent};

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

#[async_trait]
impl SqlBacklog for SqliteBacklog {
    type Db = Sqlite;
    type Writer<'a> = MappedMutexGuard<'a, SqliteConnection>;

    const CLAIM_FETCHES: &'static str = CLAIM_FETCHES;
    const CLAIM_INTENTS: &'static str = CLAIM_INTENTS;
    const FETCHES: &'static str = FETCHES;
    const INTENTS: &'static str = INTENTS;

    fn reads(&self) -> &SqlitePool {
        &self.pool
    }

    async fn writer(&self) -> Result<Self::Writer<'_>, BacklogError> {
        Ok(self.writer.lock().await?)
    }

    /// None: the file is opened by one process at a time.
    fn claimant(&self) -> Option<Uuid> {
        None
    }

    async fn write_fetches(
        &self,
        topics: &[String],
        now: DateTime<Utc>,
        trace_context: Option<&str>,
    ) -> Result<(), BacklogError> {
        let topics = serde_json::to_string(topics)
            .map_err(|error| BacklogError::Invalid(error.to_string()))?;
        sqlx::query(REQUEST_FETCHES)
            .bind(topics)
            .bind(now.timestamp_micros())
            .bind(trace_context)
            .execute(&mut *self.writer.lock().await?)
            .await?;
        Ok(())
    }

    async fn write_intents(
        &self,
        intents: &[Intent],
        bound: u64,
    ) -> Result<HashSet<Uuid>, BacklogError> {
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
        let written: Vec<Uuid> = sqlx::query_scalar(REQUEST_INTENTS)
            .bind(serde_json::Value::Array(rows).to_string())
            .bind(i64::try_from(bound).unwrap_or(i64::MAX))
            .fetch_all(&mut *self.writer.lock().await?)
            .await?;
        Ok(written.into_iter().collect())
    }

    async fn delete_intents(&self, done: &[&Intent]) -> Result<HashSet<Uuid>, BacklogError> {
        let done: Vec<serde_json::Value> = done
            .iter()
            .map(|intent| {
                let request = &intent.request;
                serde_json::json!([
                    request.topic,
                    request.callback,
                    intent.id.simple().to_string()
                ])
            })
            .collect();
        let ids: Vec<Uuid> = sqlx::query_scalar(INTENTS_DONE)
            .bind(serde_json::Value::Array(done).to_string())
            .fetch_all(&mut *self.writer.lock().await?)
            .await?;
        Ok(ids.into_iter().collect())
    }

    async fn release_all(&self) -> Result<u64, BacklogError> {
        let mut writer = self.writer.lock().await?;
        let fetches = sqlx::query(RELEASE_FETCH_CLAIMS)
            .execute(&mut *writer)
            .await?;
        let intents = sqlx::query(RELEASE_INTENT_CLAIMS)
            .execute(&mut *writer)
            .await?;
        Ok(fetches.rows_affected() + intents.rows_affected())
    }
}

const RELEASE_FETCH_CLAIMS: &str =
    "UPDATE websub_fetches SET processing_since = NULL WHERE processing_since IS NOT NULL";

const RELEASE_INTENT_CLAIMS: &str =
    "UPDATE websub_verifications SET processing_since = NULL WHERE processing_since IS NOT NULL";
