//! The hub's backlog: work it has acknowledged but not yet done, kept in its
//! own database so that a `kill -9` at any moment loses none of it.
//!
//! Two kinds of work wait here:
//!
//! - **topic fetches** asked for by publish pings. A ping is written before
//!   its 2xx; fetch workers claim due fetches, and a fetch leaves the backlog
//!   once done, or stays as failed (with its last error) once its retries
//!   are spent. A topic has one row however often it is pinged: a ping that
//!   arrives while the topic is being fetched moves `requested_at` on, and
//!   the fetch in flight then leaves the row due again, because it may have
//!   read the content from before that ping. The validators each topic
//!   answered last (ETag, Last-Modified) are kept beside, for the next
//!   conditional fetch from any replica.
//! - **verifications of intent**: each subscribe or unsubscribe answered
//!   202, one row per (topic, callback). A newer request for the pair
//!   replaces the older, even while the older is being verified; the older's
//!   outcome then leaves the newer in place (see [`Backlog::finish_intent`]).
//!   The number waiting is bounded at admission.
//!
//! Claims follow the event log's: `processing_since` marks a row in flight,
//! concurrent claimers never take the same row (`FOR UPDATE SKIP LOCKED` on
//! PostgreSQL, the write lock on SQLite), and a claim older than the
//! visibility timeout belongs to a process that died, so the row is claimed
//! again. On PostgreSQL each claim also records the replica that holds it
//! (`claimed_by`), so that a dead replica's claims are handed back within
//! seconds by the replicas' heartbeat ([`crate::storage::replicas`]). The tables live
//! beside the event log's and are created by its migrations.
//!
//! Both backends run one [`Backlog`] impl, written once in `shared`; each
//! names where its database differs (the claims' and lists' statements,
//! its batch writes).

pub mod postgres;
mod shared;
mod sql;
pub mod sqlite;
pub mod worker;

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::protocol::{Mode, SubscriptionRequest};

/// What a topic answered last time, for a conditional fetch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Validators {
    /// The `ETag` it sent.
    pub etag: Option<String>,
    /// The `Last-Modified` it sent.
    pub last_modified: Option<String>,
}

/// A topic fetch claimed by a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedFetch {
    /// The topic to fetch.
    pub topic: String,
    /// When the latest ping for it arrived.
    pub requested_at: DateTime<Utc>,
    /// How many pings the row had counted when it was claimed.
    pub generation: i64,
    /// Failed attempts so far.
    pub attempts: u32,
    /// The trace of the latest ping for it (`crate::telemetry::traces`),
    /// which its content's intake continues.
    pub trace_context: Option<String>,
    /// What the topic answered last time.
    pub validators: Validators,
}

/// How a claimed fetch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchResult {
    /// Fetched (recorded, not modified, or nobody subscribes): the row
    /// leaves the backlog unless a newer ping came meanwhile. New
    /// validators replace the stored ones when given.
    Done {
        /// What the topic answered this time, if it answered content.
        validators: Option<Validators>,
    },
    /// Failed; tried again at `at`.
    Retry {
        /// When it is due again.
        at: DateTime<Utc>,
        /// What went wrong.
        error: String,
    },
    /// Failed for good: kept, with the error, for operators to see.
    Failed {
        /// What went wrong.
        error: String,
    },
}

/// A topic fetch as the operator API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchState {
    /// The topic.
    pub topic: String,
    /// When the latest ping for it arrived.
    pub requested_at: DateTime<Utc>,
    /// Failed attempts so far.
    pub attempts: u32,
    /// When it is due; `None` once failed for good.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The last failure.
    pub last_error: Option<String>,
}

/// A subscribe or unsubscribe waiting for its verification of intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// This request's id: a newer request for the same pair has another.
    pub id: Uuid,
    /// The request as accepted.
    pub request: SubscriptionRequest,
    /// When it was accepted.
    pub requested_at: DateTime<Utc>,
    /// Failed attempts so far.
    pub attempts: u32,
}

impl Intent {
    /// A fresh intent for `request`, accepted at `now`.
    pub fn new(request: SubscriptionRequest, now: DateTime<Utc>) -> Self {
        Self {
            id: Uuid::now_v7(),
            request,
            requested_at: now,
            attempts: 0,
        }
    }
}

/// How a claimed verification ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntentResult {
    /// Done (saved, deleted): the row leaves the backlog.
    Done,
    /// Failed; tried again at `at`.
    Retry {
        /// When it is due again.
        at: DateTime<Utc>,
        /// What went wrong.
        error: String,
    },
    /// Failed for good (refused, not confirmed, denied): kept, with the
    /// error, so the requester can learn what happened.
    Failed {
        /// What went wrong.
        error: String,
    },
}

/// A verification as the subscriber and operator APIs show it (never its
/// secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentState {
    /// Subscribe or unsubscribe.
    pub mode: Mode,
    /// The topic.
    pub topic: String,
    /// The callback.
    pub callback: String,
    /// Who asked, when authenticated.
    pub owner: Option<String>,
    /// When it was accepted.
    pub requested_at: DateTime<Utc>,
    /// Failed attempts so far.
    pub attempts: u32,
    /// When it is due; `None` once failed for good.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The last failure.
    pub last_error: Option<String>,
}

/// Whether an intent was taken in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Written; it will be verified.
    Accepted,
    /// Not written: this many verifications are waiting already.
    Full {
        /// How many are waiting.
        pending: u64,
    },
}

/// What waits in the backlog, for its gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Waiting {
    /// Verifications of intent.
    pub verifications: u64,
    /// Topic fetches.
    pub fetches: u64,
}

/// Which rows a listing wants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Listing<'a> {
    /// Only rows failed for good (`Some(true)`), only those still due
    /// (`Some(false)`), or both.
    pub failed: Option<bool>,
    /// Only intents of this owner.
    pub owner: Option<&'a str>,
    /// Only rows whose topic (or an intent's callback) contains this text,
    /// as it is (case counts).
    pub search: Option<&'a str>,
}

/// Each of `intents`' admission once those in `written` were written:
/// the others are refused with the number of verifications waiting, read
/// from `backlog` only when there are any.
async fn admissions(
    backlog: &(impl Backlog + ?Sized),
    intents: &[Intent],
    written: &HashSet<Uuid>,
) -> Result<Vec<Admission>, BacklogError> {
    let pending = if intents.iter().all(|intent| written.contains(&intent.id)) {
        0
    } else {
        backlog.waiting().await?.verifications
    };
    Ok(intents
        .iter()
        .map(|intent| {
            if written.contains(&intent.id) {
                Admission::Accepted
            } else {
                Admission::Full { pending }
            }
        })
        .collect())
}

/// Failures of the backlog.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BacklogError {
    /// The database failed.
    #[error("backlog database failed: {0}")]
    Database(#[from] sqlx::Error),
    /// A stored value could not be decoded.
    #[error("invalid stored backlog data: {0}")]
    Invalid(String),
    /// The write of a group this request was admitted with failed, for
    /// every request of it.
    #[error("{0}")]
    Group(Arc<BacklogError>),
}

/// Where acknowledged work waits until it is done. Every method is safe to
/// call concurrently, from several replicas sharing one database where the
/// backend allows it; times are passed in.
#[async_trait]
pub trait Backlog: Send + Sync + std::fmt::Debug {
    /// Asks for a fetch of each topic, due at `now`: one row per topic, a
    /// topic already waiting (or failed) becomes due again with a fresh
    /// retry budget.
    async fn request_fetches(
        &self,
        topics: &[String],
        now: DateTime<Utc>,
        trace_context: Option<&str>,
    ) -> Result<(), BacklogError>;

    /// Claims up to `limit` due fetches, with the topic's stored validators.
    async fn claim_fetches(
        &self,
        limit: usize,
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<ClaimedFetch>, BacklogError>;

    /// Records how a claimed fetch ended. When a ping came after the claim
    /// (the row counts more pings than the claim), the row stays due at once with a fresh
    /// budget, whatever the result: that ping asked for content newer than
    /// what this fetch may have read.
    async fn finish_fetch(
        &self,
        fetch: &ClaimedFetch,
        result: FetchResult,
        now: DateTime<Utc>,
    ) -> Result<(), BacklogError>;

    /// Fetches waiting or failed, most recently pinged first, at most
    /// `limit`.
    async fn fetches(
        &self,
        listing: Listing<'_>,
        limit: usize,
    ) -> Result<Vec<FetchState>, BacklogError>;

    /// Writes each of `intents`, in order, until `bound` verifications
    /// would be waiting (a replacement counted as new: past the bound
    /// nothing is written), and answers each one's admission. It is one
    /// statement, durable when it returns: the group commit of requests
    /// that arrive together. The count is read once per call and calls are
    /// not serialised, so calls racing at the bound may pass it by as many
    /// as they write at once. A waiting or failed intent for the same pair
    /// is replaced; one in flight keeps its claim, so the newer is verified
    /// after it ends. No two of `intents` may name the same pair.
    async fn request_intents(
        &self,
        intents: &[Intent],
        bound: u64,
    ) -> Result<Vec<Admission>, BacklogError>;

    /// [`Backlog::request_intents`] of one.
    async fn request_intent(&self, intent: &Intent, bound: u64) -> Result<Admission, BacklogError> {
        let admissions = self
            .request_intents(std::slice::from_ref(intent), bound)
            .await?;
        admissions
            .into_iter()
            .next()
            .ok_or_else(|| BacklogError::Invalid("no admission for the intent".to_owned()))
    }

    /// Claims up to `limit` due intents, oldest first.
    async fn claim_intents(
        &self,
        limit: usize,
        now: DateTime<Utc>,
        visibility: std::time::Duration,
    ) -> Result<Vec<Intent>, BacklogError>;

    /// Records how each of `finished`, claimed intents, ended: the done
    /// ones leave in one statement, the group commit of verifications that
    /// end together, and each failure is a statement of its own. When a
    /// newer request replaced one meanwhile, only its claim is released:
    /// the newer is due as written. No two may name the same pair.
    async fn finish_intents(&self, finished: &[(Intent, IntentResult)])
    -> Result<(), BacklogError>;

    /// [`Backlog::finish_intents`] of one.
    async fn finish_intent(
        &self,
        intent: &Intent,
        result: IntentResult,
    ) -> Result<(), BacklogError> {
        self.finish_intents(&[(intent.clone(), result)]).await
    }

    /// Intents waiting or failed, newest first, at most `limit`.
    async fn intents(
        &self,
        listing: Listing<'_>,
        limit: usize,
    ) -> Result<Vec<IntentState>, BacklogError>;

    /// How many verifications and fetches wait (due, retrying or in
    /// flight; not failed).
    async fn waiting(&self) -> Result<Waiting, BacklogError>;

    /// Whether a subscribe to `topic` is waiting for its verification: a
    /// publish must not be discarded as having nobody to reach while one
    /// may be about to be saved.
    async fn subscribing(&self, topic: &str) -> Result<bool, BacklogError>;

    /// Deletes fetches and intents failed for good whose request came
    /// before `cutoff` (a request fails within minutes of being made).
    /// Returns how many rows went.
    async fn purge_failed_before(&self, cutoff: DateTime<Utc>) -> Result<u64, BacklogError>;

    /// Hands back every claim at once, on a backlog only one process uses
    /// (SQLite), whose claims at start-up can only be its dead
    /// predecessor's; nothing on one replicas share (there the heartbeat
    /// hands back a dead replica's, [`crate::storage::replicas`]). Returns how many
    /// verifications and fetches were released.
    async fn release_claims(&self) -> Result<u64, BacklogError>;
}

/// Opens the backlog in the database a URL names (`sqlite:PATH` or
/// `postgres://…`). Its tables come with the event log's migrations, so
/// [`crate::storage::events::connect`] on the same URL comes first.
pub async fn connect(url: &str) -> Result<Arc<dyn Backlog>, BacklogError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(sqlite::SqliteBacklog::connect(url).await?))
    } else {
        Ok(Arc::new(postgres::PostgresBacklog::connect(url).await?))
    }
}

/// [`connect`], with the claims of a PostgreSQL backlog held by `replica`
/// (see [`crate::storage::events::connect_as`]).
pub async fn connect_as(url: &str, replica: Uuid) -> Result<Arc<dyn Backlog>, BacklogError> {
    if url.starts_with("sqlite:") {
        connect(url).await
    } else {
        Ok(Arc::new(
            postgres::PostgresBacklog::connect(url)
                .await?
                .with_replica(replica),
        ))
    }
}

/// What is left to write of `finished` once the intents of `deleted` are
/// gone: a done intent not deleted was replaced by a newer request and only
/// has its claim released, and a failure is recorded on its own row (or,
/// replaced too, only releases the claim). Each comes with when it is due
/// again and its error.
fn releases<'a>(
    finished: &'a [(Intent, IntentResult)],
    deleted: &'a HashSet<Uuid>,
) -> impl Iterator<Item = (&'a Intent, Option<DateTime<Utc>>, Option<&'a str>)> {
    finished.iter().filter_map(|(intent, result)| match result {
        IntentResult::Done if deleted.contains(&intent.id) => None,
        IntentResult::Done => Some((intent, None, None)),
        IntentResult::Retry { at, error } => Some((intent, Some(*at), Some(error.as_str()))),
        IntentResult::Failed { error } => Some((intent, None, Some(error.as_str()))),
    })
}

/// A count as the unsigned number it is.
fn unsigned(value: i64) -> Result<u32, BacklogError> {
    u32::try_from(value).map_err(|_| BacklogError::Invalid(format!("count out of range: {value}")))
}

/// A stored mode.
fn mode(value: &str) -> Result<Mode, BacklogError> {
    match value {
        "subscribe" => Ok(Mode::Subscribe),
        "unsubscribe" => Ok(Mode::Unsubscribe),
        other => Err(BacklogError::Invalid(format!("unknown mode {other:?}"))),
    }
}

/// The oldest claim still alive at `now`.
fn stale_bound(now: DateTime<Utc>, visibility: std::time::Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(visibility)
        .ok()
        .and_then(|visibility| now.checked_sub_signed(visibility))
        .unwrap_or(DateTime::UNIX_EPOCH)
}
