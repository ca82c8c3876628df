//! The backlog written once for SQLite and PostgreSQL: one [`Backlog`] impl
//! for every [`SqlBacklog`]. A backend states where it differs, in the
//! trait's required items: where it reads, the connection it writes on,
//! the statements its dialect spells its own way (the claims, the lists'
//! searches), and the batch writes, which travel as one JSON parameter on
//! SQLite and as arrays on PostgreSQL.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{ColumnIndex, Connection, Database, Encode, Executor, IntoArguments, Pool, Row, Type};
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
use crate::storage::dialect::{Dialect, Stored, bound};

/// A backend's backlog, as the code written once for both databases sees
/// it.
#[async_trait]
pub(super) trait SqlBacklog: Send + Sync + std::fmt::Debug {
    /// The database the backlog is kept in.
    type Db: Dialect;

    /// The connection writes go through, held for one write.
    type Writer<'a>: std::ops::DerefMut<Target = <Self::Db as Database>::Connection> + Send
    where
        Self: 'a;

    /// Claims due fetches: `$1` now, `$2` the oldest live claim, `$3` how
    /// many, `$4` (where [`Self::claimant`] is some) the claimant; returns
    /// each with its topic's validators.
    const CLAIM_FETCHES: &'static str;

    /// Claims due verification intents, bound as [`Self::CLAIM_FETCHES`].
    const CLAIM_INTENTS: &'static str;

    /// The fetches a [`Listing`] matches: `$1` failed, `$2` how many, `$3`
    /// the search.
    const FETCHES: &'static str;

    /// The intents a [`Listing`] matches: `$1` owner, `$2` failed, `$3` how
    /// many, `$4` the search.
    const INTENTS: &'static str;

    /// The pool reads go to.
    fn reads(&self) -> &Pool<Self::Db>;

    /// The connection to write on: SQLite's one write connection, a
    /// PostgreSQL pool's next.
    async fn writer(&self) -> Result<Self::Writer<'_>, BacklogError>;

    /// Who claims, where claims are recorded as held by a replica.
    fn claimant(&self) -> Option<Uuid>;

    /// See [`Backlog::request_fetches`].
    async fn write_fetches(
        &self,
        topics: &[String],
        now: DateTime<Utc>,
        trace_context: Option<&str>,
    ) -> Result<(), BacklogError>;

    /// Writes the first `bound` less those waiting of `intents`; the ids
    /// written.
    async fn write_intents(
        &self,
        intents: &[Intent],
        bound: u64,
    ) -> Result<HashSet<Uuid>, BacklogError>;

    /// Deletes `done` (not empty), unless a newer request replaced one; the
    /// ids deleted.
    async fn delete_intents(&self, done: &[&Intent]) -> Result<HashSet<Uuid>, BacklogError>;

    /// See [`Backlog::release_claims`].
    async fn release_all(&self) -> Result<u64, BacklogError>;
}

/// A time the database kept.
fn at<Db: Dialect>(kept: Db::Time) -> Result<DateTime<Utc>, BacklogError> {
    Db::at(kept).ok_or_else(|| BacklogError::Invalid("a timestamp is out of range".to_owned()))
}

/// A time the database may have kept.
fn optional_at<Db: Dialect>(kept: Option<Db::Time>) -> Result<Option<DateTime<Utc>>, BacklogError> {
    kept.map(at::<Db>).transpose()
}

/// A row's count of failed attempts.
fn attempts(kept: i32) -> Result<u32, BacklogError> {
    unsigned(kept.into())
}

/// The rows a claim's `statement` returns, bound as
/// [`SqlBacklog::CLAIM_FETCHES`] says.
async fn claimed<Log>(
    log: &Log,
    statement: &'static str,
    now: DateTime<Utc>,
    visibility: std::time::Duration,
    limit_to: usize,
) -> Result<Vec<<Log::Db as Database>::Row>, BacklogError>
where
    Log: SqlBacklog,
    for<'c> &'c mut <Log::Db as Database>::Connection: Executor<'c, Database = Log::Db>,
    <Log::Db as Database>::Arguments: IntoArguments<Log::Db>,
    i64: Stored<Log::Db>,
    Uuid: Stored<Log::Db>,
{
    let mut claim = sqlx::query(statement)
        .bind(Log::Db::time(now))
        .bind(Log::Db::time(stale_bound(now, visibility)))
        .bind(bound(limit_to));
    if let Some(claimant) = log.claimant() {
        claim = claim.bind(claimant);
    }
    let mut writer = log.writer().await?;
    Ok(claim.fetch_all(&mut *writer).await?)
}

// The bounds say what the statements bind and read on the backend's
// database.
#[async_trait]
impl<Log> Backlog for Log
where
    Log: SqlBacklog,
    for<'c> &'c mut <Log::Db as Database>::Connection: Executor<'c, Database = Log::Db>,
    <Log::Db as Database>::Arguments: IntoArguments<Log::Db>,
    for<'n> &'n str: ColumnIndex<<Log::Db as Database>::Row>,
    usize: ColumnIndex<<Log::Db as Database>::Row>,
    for<'q> &'q str: Encode<'q, Log::Db> + Type<Log::Db>,
    for<'q> Option<&'q str>: Encode<'q, Log::Db>,
    Option<Uuid>: for<'q> Encode<'q, Log::Db>,
    Option<bool>: for<'q> Encode<'q, Log::Db>,
    Option<<Log::Db as Dialect>::Time>: for<'q> Encode<'q, Log::Db>,
    Uuid: Stored<Log::Db>,
    String: Stored<Log::Db>,
    i64: Stored<Log::Db>,
    i32: Stored<Log::Db>,
    bool: Stored<Log::Db>,
{
    async fn request_fetches(
        &self,
        topics: &[String],
        now: DateTime<Utc>,
        trace_context: Option<&str>,
    ) -> Result<(), BacklogError> {
        self.write_fetches(topics, now, trace_context).await
    }

    async fn claim_fetches(
        &self,
        limit_to: usize,
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<ClaimedFetch>, BacklogError> {
        claimed(self, Log::CLAIM_FETCHES, now, visibility, limit_to)
            .await?
            .iter()
            .map(|row| {
                Ok(ClaimedFetch {
                    topic: row.try_get("topic")?,
                    requested_at: at::<Log::Db>(row.try_get("requested_at")?)?,
                    generation: row.try_get("generation")?,
                    attempts: attempts(row.try_get("attempts")?)?,
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
        let now = Log::Db::time(now);
        let mut writer = self.writer().await?;
        let mut tx = writer.begin_with(<Log::Db as Dialect>::BEGIN_WRITE).await?;
        let failure = match result {
            FetchResult::Done { validators } => {
                if let Some(validators) = validators {
                    let keep = if validators == Validators::default() {
                        sqlx::query(FORGET_VALIDATORS).bind(fetch.topic.as_str())
                    } else {
                        sqlx::query(KEEP_VALIDATORS)
                            .bind(fetch.topic.as_str())
                            .bind(validators.etag.as_deref())
                            .bind(validators.last_modified.as_deref())
                            .bind(now)
                    };
                    keep.execute(&mut *tx).await?;
                }
                let done = sqlx::query(FETCH_DONE)
                    .bind(fetch.topic.as_str())
                    .bind(fetch.generation)
                    .execute(&mut *tx)
                    .await?;
                // Overtaken by a newer ping meanwhile: due again, at once.
                if Log::Db::affected(&done) == 0 {
                    sqlx::query(RELEASE_FETCH)
                        .bind(fetch.topic.as_str())
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                }
                None
            }
            // When a failure is due again; none once it failed for good.
            FetchResult::Retry { at, error } => Some((Some(at), error)),
            FetchResult::Failed { error } => Some((None, error)),
        };
        if let Some((next, error)) = failure {
            sqlx::query(FETCH_FAILED)
                .bind(fetch.topic.as_str())
                .bind(fetch.generation)
                .bind(error.as_str())
                .bind(next.map(Log::Db::time))
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn fetches(
        &self,
        listing: Listing<'_>,
        limit_to: usize,
    ) -> Result<Vec<FetchState>, BacklogError> {
        let rows = sqlx::query(Log::FETCHES)
            .bind(listing.failed)
            .bind(bound(limit_to))
            .bind(listing.search)
            .fetch_all(self.reads())
            .await?;
        rows.iter()
            .map(|row| {
                Ok(FetchState {
                    topic: row.try_get("topic")?,
                    requested_at: at::<Log::Db>(row.try_get("requested_at")?)?,
                    attempts: attempts(row.try_get("attempts")?)?,
                    next_attempt_at: optional_at::<Log::Db>(row.try_get("next_attempt_at")?)?,
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
        let written = self.write_intents(intents, bound).await?;
        admissions(self, intents, &written).await
    }

    async fn waiting(&self) -> Result<Waiting, BacklogError> {
        let row = sqlx::query(WAITING).fetch_one(self.reads()).await?;
        let verifications: i64 = row.try_get(0usize)?;
        let fetches: i64 = row.try_get(1usize)?;
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
        claimed(self, Log::CLAIM_INTENTS, now, visibility, limit_to)
            .await?
            .iter()
            .map(|row| {
                let lease: Option<i64> = row.try_get("lease_seconds")?;
                let stated: String = row.try_get("mode")?;
                Ok(Intent {
                    id: row.try_get("id")?,
                    request: SubscriptionRequest {
                        mode: mode(&stated)?,
                        topic: row.try_get("topic")?,
                        callback: row.try_get("callback")?,
                        lease_seconds: lease.and_then(|seconds| u64::try_from(seconds).ok()),
                        secret: row.try_get("secret")?,
                        owner: row.try_get("owner")?,
                    },
                    requested_at: at::<Log::Db>(row.try_get("requested_at")?)?,
                    attempts: attempts(row.try_get("attempts")?)?,
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
        let deleted = if done.is_empty() {
            HashSet::new()
        } else {
            self.delete_intents(&done).await?
        };
        let mut writer = self.writer().await?;
        for (intent, next, error) in releases(finished, &deleted) {
            let request = &intent.request;
            sqlx::query(INTENT_FAILED)
                .bind(request.topic.as_str())
                .bind(request.callback.as_str())
                .bind(error.map(|_| intent.id))
                .bind(next.map(Log::Db::time))
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
        let rows = sqlx::query(Log::INTENTS)
            .bind(listing.owner)
            .bind(listing.failed)
            .bind(bound(limit_to))
            .bind(listing.search)
            .fetch_all(self.reads())
            .await?;
        rows.iter()
            .map(|row| {
                let stated: String = row.try_get("mode")?;
                Ok(IntentState {
                    mode: mode(&stated)?,
                    topic: row.try_get("topic")?,
                    callback: row.try_get("callback")?,
                    owner: row.try_get("owner")?,
                    requested_at: at::<Log::Db>(row.try_get("requested_at")?)?,
                    attempts: attempts(row.try_get("attempts")?)?,
                    next_attempt_at: optional_at::<Log::Db>(row.try_get("next_attempt_at")?)?,
                    last_error: row.try_get("last_error")?,
                })
            })
            .collect()
    }

    async fn subscribing(&self, topic: &str) -> Result<bool, BacklogError> {
        let row = sqlx::query(SUBSCRIBING)
            .bind(topic)
            .fetch_one(self.reads())
            .await?;
        Ok(row.try_get(0usize)?)
    }

    async fn purge_failed_before(&self, cutoff: DateTime<Utc>) -> Result<u64, BacklogError> {
        let cutoff = Log::Db::time(cutoff);
        let mut purged = 0;
        for statement in [PURGE_FETCHES, PURGE_INTENTS] {
            let mut writer = self.writer().await?;
            let done = sqlx::query(statement)
                .bind(cutoff)
                .execute(&mut *writer)
                .await?;
            purged += Log::Db::affected(&done);
        }
        Ok(purged)
    }

    async fn release_claims(&self) -> Result<u64, BacklogError> {
        self.release_all().await
    }
}
