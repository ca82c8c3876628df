//! The rows of a producer's outbox tables as the dispatcher's statements
//! (`sql`) read and write them: the events an expansion looks at, the rows
//! it claims, and each claimed row's outcome.

use std::time::Duration;

use chrono::NaiveDateTime;
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

/// Which events an expansion that claims looks at.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NewEvents<'a> {
    /// These, named by notifications.
    Notified(&'a [Uuid]),
    /// Those created at or after this time.
    CreatedSince(NaiveDateTime),
}

/// What an expansion that claims did.
#[derive(Debug)]
pub(crate) struct ClaimingExpansion {
    pub(crate) claimed: Vec<ClaimedRow>,
    /// Rows written but left unclaimed for want of room.
    pub(crate) unclaimed: usize,
    /// The database time the statement ran at.
    pub(crate) ran_at: Option<NaiveDateTime>,
    /// How many of the notified ids name no event.
    pub(crate) unknown_ids: usize,
}

/// One claimed delivery row, with its event.
#[derive(Debug, Clone)]
pub(crate) struct ClaimedRow {
    pub(crate) event_id: Uuid,
    pub(crate) subscriber: String,
    pub(crate) retry_count: i32,
    pub(crate) claimed_at: NaiveDateTime,
    pub(crate) event_name: String,
    pub(crate) resource_type: String,
    pub(crate) resource_id: String,
    pub(crate) event_type: String,
    pub(crate) app: Option<String>,
    pub(crate) payload: String,
    pub(crate) created_at: NaiveDateTime,
}

/// What to write back for one claimed row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RowOutcome {
    /// Delivered: `processed_at = now`.
    Delivered,
    /// Failed; due again after `wait`.
    Retry { error: String, wait: Duration },
    /// Failed with no retries left: never claimed again.
    Exhausted { error: String },
    /// Failed for a reason that is not the event's: due again after `wait`,
    /// no attempt counted.
    Postponed { error: String, wait: Duration },
    /// Not attempted: its webhook's breaker is open. Due again after
    /// `wait`, no attempt counted, its last error kept.
    Held { wait: Duration },
    /// Not attempted (its subscriber went away, or is saturated): the claim
    /// is handed back without counting an attempt.
    Released,
    /// Not attempted: the subscriber's endpoint is disabled. Closed like an
    /// exhausted row (never claimed again) without counting an attempt, the
    /// reason kept in `last_error`.
    Skipped,
}

/// One row's outcome.
#[derive(Debug, Clone)]
pub(crate) struct RowCompletion {
    pub(crate) event_id: Uuid,
    pub(crate) subscriber: String,
    pub(crate) claimed_at: NaiveDateTime,
    pub(crate) outcome: RowOutcome,
    /// The attempt it came from, for the history; none when nothing was
    /// sent.
    pub(crate) attempt: Option<websub_delivery::attempt::Attempt>,
}

pub(super) fn claimed_row(row: &PgRow) -> Result<ClaimedRow, sqlx::Error> {
    Ok(ClaimedRow {
        event_id: row.try_get("event_id")?,
        subscriber: row.try_get("subscriber")?,
        retry_count: row.try_get("retry_count")?,
        claimed_at: row.try_get("processing_since")?,
        event_name: row.try_get("event_name")?,
        resource_type: row.try_get("resource_type")?,
        resource_id: row.try_get("resource_id")?,
        event_type: row.try_get("event_type")?,
        app: row.try_get("app")?,
        payload: row.try_get("payload")?,
        created_at: row.try_get("created_at")?,
    })
}
