//! The PostgreSQL event log's encodings: rows read back into the log's
//! types, the column arrays a batch of completions and their attempts is
//! written as, and the database's refusals read as the log's errors.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::super::{
    Attempt, Claimed, Completion, DeliveryRecord, DeliveryState, EventLogError, LoggedEvent,
    Outcome,
};

pub(super) fn retry_count(value: i32) -> Result<u32, EventLogError> {
    u32::try_from(value)
        .map_err(|_| EventLogError::Invalid(format!("negative retry_count {value}")))
}

pub(super) fn event_from_row(row: &PgRow) -> Result<LoggedEvent, EventLogError> {
    Ok(LoggedEvent {
        id: row.try_get("id").map_err(super::super::invalid)?,
        topic: row.try_get("topic").map_err(super::super::invalid)?,
        content_type: row.try_get("content_type").map_err(super::super::invalid)?,
        body: Bytes::from(
            row.try_get::<Vec<u8>, _>("body")
                .map_err(super::super::invalid)?,
        ),
        created_at: row.try_get("created_at").map_err(super::super::invalid)?,
        original_id: row.try_get("original_id").map_err(super::super::invalid)?,
        trace_context: row
            .try_get("trace_context")
            .map_err(super::super::invalid)?,
    })
}

pub(super) fn claimed_from_row(row: &PgRow) -> Result<Claimed, EventLogError> {
    Ok(Claimed {
        event_id: row.try_get("event_id").map_err(super::super::invalid)?,
        topic: row.try_get("topic").map_err(super::super::invalid)?,
        subscriber: row.try_get("subscriber").map_err(super::super::invalid)?,
        retry_count: retry_count(row.try_get("retry_count").map_err(super::super::invalid)?)?,
    })
}

pub(super) fn delivery_from_row(row: &PgRow) -> Result<DeliveryRecord, EventLogError> {
    let processed_at: Option<DateTime<Utc>> =
        row.try_get("processed_at").map_err(super::super::invalid)?;
    let next_attempt_at: Option<DateTime<Utc>> = row
        .try_get("next_attempt_at")
        .map_err(super::super::invalid)?;
    let outcome: Option<&str> = row.try_get("outcome").map_err(super::super::invalid)?;
    Ok(DeliveryRecord {
        state: DeliveryState::of(processed_at.is_some(), next_attempt_at.is_some(), outcome)?,
        event_id: row.try_get("event_id").map_err(super::super::invalid)?,
        subscriber: row.try_get("subscriber").map_err(super::super::invalid)?,
        processed_at,
        retry_count: retry_count(row.try_get("retry_count").map_err(super::super::invalid)?)?,
        last_error: row.try_get("last_error").map_err(super::super::invalid)?,
        processing_since: row
            .try_get("processing_since")
            .map_err(super::super::invalid)?,
        next_attempt_at,
    })
}

/// The completions as the column arrays [`COMPLETE`] unnests.
pub(super) struct CompletionColumns<'a> {
    pub(super) event_ids: Vec<Uuid>,
    pub(super) subscribers: Vec<&'a str>,
    pub(super) kinds: Vec<&'static str>,
    pub(super) errors: Vec<Option<&'a str>>,
    pub(super) next_attempts: Vec<Option<DateTime<Utc>>>,
    pub(super) attempted_ats: Vec<Option<DateTime<Utc>>>,
    pub(super) durations: Vec<Option<i64>>,
    pub(super) statuses: Vec<Option<i16>>,
    pub(super) responses: Vec<Option<&'a [u8]>>,
}

impl<'a> CompletionColumns<'a> {
    pub(super) fn new<I>(completions: I) -> Self
    where
        I: IntoIterator<Item = &'a Completion>,
        I::IntoIter: ExactSizeIterator,
    {
        let completions = completions.into_iter();
        let count = completions.len();
        let mut columns = Self {
            event_ids: Vec::with_capacity(count),
            subscribers: Vec::with_capacity(count),
            kinds: Vec::with_capacity(count),
            errors: Vec::with_capacity(count),
            next_attempts: Vec::with_capacity(count),
            attempted_ats: Vec::with_capacity(count),
            durations: Vec::with_capacity(count),
            statuses: Vec::with_capacity(count),
            responses: Vec::with_capacity(count),
        };
        for completion in completions {
            let (kind, error, next) = match &completion.outcome {
                Outcome::Delivered => ("delivered", None, None),
                Outcome::Retry {
                    error,
                    next_attempt_at,
                } => ("retry", Some(error.as_str()), Some(*next_attempt_at)),
                Outcome::Exhausted { error } => ("exhausted", Some(error.as_str()), None),
                Outcome::Dropped { reason } => ("dropped", Some(reason.as_str()), None),
                Outcome::Skipped { reason } => ("skipped", Some(reason.as_str()), None),
                Outcome::Postponed {
                    error,
                    next_attempt_at,
                } => ("postponed", error.as_deref(), Some(*next_attempt_at)),
            };
            columns.event_ids.push(completion.event_id);
            columns.subscribers.push(&completion.subscriber);
            columns.kinds.push(kind);
            columns.errors.push(error);
            columns.next_attempts.push(next);
            let attempt = completion.attempt.as_ref();
            columns
                .attempted_ats
                .push(attempt.map(|attempt| attempt.at));
            columns
                .durations
                .push(attempt.map(|attempt| attempt.duration_micros));
            columns.statuses.push(
                attempt
                    .and_then(|attempt| attempt.status)
                    .and_then(|status| i16::try_from(status).ok()),
            );
            columns
                .responses
                .push(attempt.map(|attempt| attempt.response.as_ref()));
        }
        columns
    }
}

pub(super) fn attempt_from_row(row: &PgRow) -> Result<Attempt, EventLogError> {
    let status: Option<i16> = row.try_get("status").map_err(super::super::invalid)?;
    Ok(Attempt {
        at: row.try_get("attempted_at").map_err(super::super::invalid)?,
        duration_micros: row.try_get("duration_us").map_err(super::super::invalid)?,
        status: status.and_then(|status| u16::try_from(status).ok()),
        error: row.try_get("error").map_err(super::super::invalid)?,
        response: Bytes::from(
            row.try_get::<Vec<u8>, _>("response")
                .map_err(super::super::invalid)?,
        ),
    })
}

/// A record refused because one like it exists.
pub(super) fn is_unique_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|error| error.is_unique_violation())
}

/// A foreign-key failure of an insert means the event is not in the log.
pub(super) fn missing_event(error: sqlx::Error, event_id: Uuid) -> EventLogError {
    if error
        .as_database_error()
        .is_some_and(|error| error.is_foreign_key_violation())
    {
        EventLogError::UnknownEvent(event_id)
    } else {
        EventLogError::Database(error)
    }
}
