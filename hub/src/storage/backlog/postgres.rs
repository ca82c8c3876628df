//! The PostgreSQL backlog: the `websub_fetches`, `websub_topic_validators`
//! and `websub_verifications` tables of the hub's database, shared by every
//! replica. Claims lock their rows with `FOR UPDATE SKIP LOCKED`, so
//! replicas claiming at once take disjoint rows. Unlike the event log's
//! connections, these commit synchronously: a ping or a subscribe is
//! acknowledged only once its row would survive the database's own crash.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgPoolOptions};
use uuid::Uuid;

use super::shared::SqlBacklog;
use super::{BacklogError, Intent};

/// Connections of the backlog's pool: admissions, claims and outcomes are
/// single short statements.
const POOL_SIZE: u32 = 8;

const REQUEST_FETCHES: &str = "INSERT INTO websub_fetches (topic, requested_at, next_attempt_at, trace_context) \
     SELECT topic, $2, $2, $3 FROM unnest($1::text[]) AS topic \
     ON CONFLICT (topic) DO UPDATE SET \
         requested_at = excluded.requested_at, \
         generation = websub_fetches.generation + 1, \
         attempts = 0, \
         next_attempt_at = excluded.next_attempt_at, \
         trace_context = excluded.trace_context";

const CLAIM_FETCHES: &str = "UPDATE websub_fetches AS pending \
     SET processing_since = $1, claimed_by = $4 \
     FROM (SELECT topic FROM websub_fetches \
           WHERE next_attempt_at <= $1 \
             AND (processing_since IS NULL OR processing_since < $2) \
           ORDER BY next_attempt_at LIMIT $3 \
           FOR UPDATE SKIP LOCKED) AS due \
     LEFT JOIN websub_topic_validators AS known ON known.topic = due.topic \
     WHERE pending.topic = due.topic \
     RETURNING pending.topic, pending.requested_at, pending.generation, pending.attempts, \
         pending.trace_context, \
         known.etag, known.last_modified";

const FETCHES: &str = "SELECT topic, requested_at, attempts, next_attempt_at, last_error \
     FROM websub_fetches \
     WHERE ($1::boolean IS NULL OR (next_attempt_at IS NULL) = $1) \
       AND ($3::text IS NULL OR strpos(topic, $3) > 0) \
     ORDER BY requested_at DESC LIMIT $2";

// One row per element of the arrays, in order: the first $9 − waiting are
// written. The count is an uncorrelated subquery, read once.
const REQUEST_INTENTS: &str = "INSERT INTO websub_verifications \
         (topic, callback, id, mode, secret, lease_seconds, owner, requested_at, next_attempt_at) \
     SELECT topic, callback, id, mode, secret, lease_seconds, owner, requested_at, requested_at \
     FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::text[], $6::bigint[], \
                 $7::text[], $8::timestamptz[]) WITH ORDINALITY \
         AS given (topic, callback, id, mode, secret, lease_seconds, owner, requested_at, n) \
     WHERE n <= $9 - (SELECT count FROM websub_verifications_waiting) \
     ON CONFLICT (topic, callback) DO UPDATE SET \
         id = excluded.id, mode = excluded.mode, secret = excluded.secret, \
         lease_seconds = excluded.lease_seconds, owner = excluded.owner, \
         requested_at = excluded.requested_at, attempts = 0, \
         next_attempt_at = excluded.next_attempt_at, last_error = NULL \
     RETURNING id";

// The rows are chosen and locked first, then updated by their tuple ids:
// joined back by key instead, a generic plan (what a prepared statement
// settles on) reads the whole table to hash it.
const CLAIM_INTENTS: &str = "UPDATE websub_verifications \
     SET processing_since = $1, claimed_by = $4 \
     WHERE ctid = ANY(ARRAY( \
         SELECT ctid FROM websub_verifications \
         WHERE next_attempt_at <= $1 \
           AND (processing_since IS NULL OR processing_since < $2) \
         ORDER BY next_attempt_at, requested_at LIMIT $3 \
         FOR UPDATE SKIP LOCKED)) \
     RETURNING topic, callback, id, mode, secret, lease_seconds, owner, requested_at, attempts";

// An intent a newer request replaced is not deleted.
const INTENTS_DONE: &str = "DELETE FROM websub_verifications \
     WHERE (topic, callback, id) IN \
         (SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[])) \
     RETURNING id";

const INTENTS: &str = "SELECT mode, topic, callback, owner, requested_at, attempts, \
         next_attempt_at, last_error \
     FROM websub_verifications \
     WHERE ($1::text IS NULL OR owner = $1) \
       AND ($2::boolean IS NULL OR (next_attempt_at IS NULL) = $2) \
       AND ($4::text IS NULL OR strpos(topic, $4) > 0 OR strpos(callback, $4) > 0) \
     ORDER BY requested_at DESC LIMIT $3";

/// The backlog in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PostgresBacklog {
    pool: PgPool,
    /// The replica its claims are recorded as held by; see
    /// [`crate::storage::replicas`].
    replica: Uuid,
}

impl PostgresBacklog {
    /// Connects to `url`, whose schema the event log's migrations made.
    pub async fn connect(url: &str) -> Result<Self, BacklogError> {
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .connect_with(crate::storage::postgres_session(url)?)
            .await?;
        Ok(Self::from_pool(pool))
    }

    /// A backlog on an existing pool, its claims held by a replica id of
    /// its own (see [`with_replica`](Self::with_replica)).
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            pool,
            replica: Uuid::now_v7(),
        }
    }

    /// The same backlog, its claims held by `replica`: the id this process
    /// registers and beats under ([`crate::storage::replicas::Replicas`]).
    #[must_use]
    pub fn with_replica(mut self, replica: Uuid) -> Self {
        self.replica = replica;
        self
    }
}

#[async_trait]
impl SqlBacklog for PostgresBacklog {
    type Db = Postgres;
    type Writer<'a> = PoolConnection<Postgres>;

    const CLAIM_FETCHES: &'static str = CLAIM_FETCHES;
    const CLAIM_INTENTS: &'static str = CLAIM_INTENTS;
    const FETCHES: &'static str = FETCHES;
    const INTENTS: &'static str = INTENTS;

    fn reads(&self) -> &PgPool {
        &self.pool
    }

    async fn writer(&self) -> Result<Self::Writer<'_>, BacklogError> {
        Ok(self.pool.acquire().await?)
    }

    fn claimant(&self) -> Option<Uuid> {
        Some(self.replica)
    }

    async fn write_fetches(
        &self,
        topics: &[String],
        now: DateTime<Utc>,
        trace_context: Option<&str>,
    ) -> Result<(), BacklogError> {
        let mut topics = topics.to_vec();
        // Sorted and once each: one statement may not touch a row twice, and
        // replicas upserting the same topics lock them in the same order.
        topics.sort_unstable();
        topics.dedup();
        sqlx::query(REQUEST_FETCHES)
            .bind(&topics)
            .bind(now)
            .bind(trace_context)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn write_intents(
        &self,
        intents: &[Intent],
        bound: u64,
    ) -> Result<HashSet<Uuid>, BacklogError> {
        let requests = || intents.iter().map(|intent| &intent.request);
        let written: Vec<Uuid> = sqlx::query_scalar(REQUEST_INTENTS)
            .bind(requests().map(|r| r.topic.as_str()).collect::<Vec<_>>())
            .bind(requests().map(|r| r.callback.as_str()).collect::<Vec<_>>())
            .bind(intents.iter().map(|intent| intent.id).collect::<Vec<_>>())
            .bind(requests().map(|r| r.mode.as_str()).collect::<Vec<_>>())
            .bind(requests().map(|r| r.secret.as_deref()).collect::<Vec<_>>())
            .bind(
                requests()
                    .map(|r| {
                        r.lease_seconds
                            .map(|seconds| i64::try_from(seconds).unwrap_or(i64::MAX))
                    })
                    .collect::<Vec<_>>(),
            )
            .bind(requests().map(|r| r.owner.as_deref()).collect::<Vec<_>>())
            .bind(
                intents
                    .iter()
                    .map(|intent| intent.requested_at)
                    .collect::<Vec<_>>(),
            )
            .bind(i64::try_from(bound).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
        Ok(written.into_iter().collect())
    }

    async fn delete_intents(&self, done: &[&Intent]) -> Result<HashSet<Uuid>, BacklogError> {
        let ids: Vec<Uuid> = sqlx::query_scalar(INTENTS_DONE)
            .bind(
                done.iter()
                    .map(|intent| &intent.request.topic)
                    .collect::<Vec<_>>(),
            )
            .bind(
                done.iter()
                    .map(|intent| &intent.request.callback)
                    .collect::<Vec<_>>(),
            )
            .bind(done.iter().map(|intent| intent.id).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await?;
        Ok(ids.into_iter().collect())
    }

    /// None: replicas share this backlog, and a claim found at start may be
    /// a live replica's. A dead one's are handed back by the replicas'
    /// heartbeat ([`crate::storage::replicas`]), the rest by their timeouts.
    async fn release_all(&self) -> Result<u64, BacklogError> {
        Ok(0)
    }
}
