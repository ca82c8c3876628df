//! The PostgreSQL backlog: the `websub_fetches`, `websub_topic_validators`
//! and `websub_verifications` tables of the hub's database, shared by every
//! replica. Claims lock their rows with `FOR UPDATE SKIP LOCKED`, so
//! replicas claiming at once take disjoint rows. Unlike the event log's
//! connections, these commit synchronously: a ping or a subscribe is
//! acknowledged only once its row would survive the database's own crash.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use uuid::Uuid;

use super::sql::{
    FETCH_DONE, FETCH_FAILED, FORGET_VALIDATORS, INTENT_FAILED, KEEP_VALIDATORS, PURGE_FETCHES,
    PURGE_INTENTS, RELEASE_FETCH, SUBSCRIBING, WAITING,
};
use super::{
    Admission, Backlog, BacklogError, ClaimedFetch, FetchResult, FetchState, Intent, IntentResult,
    IntentState, Listing, Validators, Waiting, admissions, mode, releases, stale_bound, unsigned,
};
use crate::protocol::SubscriptionRequest;

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

fn limit(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn attempts(row: &PgRow) -> Result<u32, BacklogError> {
    unsigned(i64::from(row.try_get::<i32, _>("attempts")?))
}

#[async_trait]
impl Backlog for PostgresBacklog {
    async fn request_fetches(
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

    async fn claim_fetches(
        &self,
        limit_to: usize,
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<ClaimedFetch>, BacklogError> {
        let rows = sqlx::query(CLAIM_FETCHES)
            .bind(now)
            .bind(stale_bound(now, visibility))
            .bind(limit(limit_to))
            .bind(self.replica)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(ClaimedFetch {
                    topic: row.try_get("topic")?,
                    requested_at: row.try_get("requested_at")?,
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
        match result {
            FetchResult::Done { validators } => {
                if let Some(validators) = validators {
                    if validators == Validators::default() {
                        sqlx::query(FORGET_VALIDATORS)
                            .bind(&fetch.topic)
                            .execute(&self.pool)
                            .await?;
                    } else {
                        sqlx::query(KEEP_VALIDATORS)
                            .bind(&fetch.topic)
                            .bind(&validators.etag)
                            .bind(&validators.last_modified)
                            .bind(now)
                            .execute(&self.pool)
                            .await?;
                    }
                }
                let done = sqlx::query(FETCH_DONE)
                    .bind(&fetch.topic)
                    .bind(fetch.generation)
                    .execute(&self.pool)
                    .await?;
                if done.rows_affected() == 0 {
                    sqlx::query(RELEASE_FETCH)
                        .bind(&fetch.topic)
                        .bind(now)
                        .execute(&self.pool)
                        .await?;
                }
            }
            FetchResult::Retry { at, error } => {
                fetch_failed(&self.pool, fetch, &error, Some(at), now).await?;
            }
            FetchResult::Failed { error } => {
                fetch_failed(&self.pool, fetch, &error, None, now).await?;
            }
        }
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
                    requested_at: row.try_get("requested_at")?,
                    attempts: attempts(row)?,
                    next_attempt_at: row.try_get("next_attempt_at")?,
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
        let written: std::collections::HashSet<Uuid> = written.into_iter().collect();
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
            .bind(now)
            .bind(stale_bound(now, visibility))
            .bind(limit(limit_to))
            .bind(self.replica)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let lease: Option<i64> = row.try_get("lease_seconds")?;
                Ok(Intent {
                    id: row.try_get("id")?,
                    request: SubscriptionRequest {
                        mode: mode(row.try_get("mode")?)?,
                        topic: row.try_get("topic")?,
                        callback: row.try_get("callback")?,
                        lease_seconds: lease.and_then(|seconds| u64::try_from(seconds).ok()),
                        secret: row.try_get("secret")?,
                        owner: row.try_get("owner")?,
                    },
                    requested_at: row.try_get("requested_at")?,
                    attempts: attempts(row)?,
                })
            })
            .collect()
    }

    async fn finish_intents(
        &self,
        finished: &[(Intent, IntentResult)],
    ) -> Result<(), BacklogError> {
        let done: Vec<&Intent> = finished
            .iter()
            .filter(|(_, result)| *result == IntentResult::Done)
            .map(|(intent, _)| intent)
            .collect();
        let deleted: HashSet<Uuid> = if done.is_empty() {
            HashSet::new()
        } else {
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
            ids.into_iter().collect()
        };
        for (intent, next, error) in releases(finished, &deleted) {
            let request = &intent.request;
            sqlx::query(INTENT_FAILED)
                .bind(&request.topic)
                .bind(&request.callback)
                .bind(error.map(|_| intent.id))
                .bind(next)
                .bind(error)
                .execute(&self.pool)
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
                    requested_at: row.try_get("requested_at")?,
                    attempts: attempts(row)?,
                    next_attempt_at: row.try_get("next_attempt_at")?,
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
        let fetches = sqlx::query(PURGE_FETCHES)
            .bind(cutoff)
            .execute(&self.pool)
            .await?;
        let intents = sqlx::query(PURGE_INTENTS)
            .bind(cutoff)
            .execute(&self.pool)
            .await?;
        Ok(fetches.rows_affected() + intents.rows_affected())
    }

    async fn release_claims(&self) -> Result<u64, BacklogError> {
        // Replicas share this backlog: a claim found at start may be a
        // live replica's. A dead one's are handed back by the replicas'
        // heartbeat (crate::storage::replicas), the rest by their timeouts.
        Ok(0)
    }
}

async fn fetch_failed(
    pool: &PgPool,
    fetch: &ClaimedFetch,
    error: &str,
    next: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<(), BacklogError> {
    sqlx::query(FETCH_FAILED)
        .bind(&fetch.topic)
        .bind(fetch.generation)
        .bind(error)
        .bind(next)
        .bind(now)
        .execute(pool)
        .await?;
    Ok(())
}
