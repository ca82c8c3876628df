//! The SQLite event log's encodings: rows read back into the log's types
//! (times are µs since the epoch), and the JSON arrays a batch of
//! completions and their attempts is written as.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::super::{
    Attempt, Claimed, Completion, DeliveryRecord, DeliveryState, EventLogError, LoggedEvent,
    Outcome,
};

pub(super) fn from_micros(micros: i64) -> Result<DateTime<Utc>, EventLogError> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| EventLogError::Invalid(format!("timestamp {micros} µs out of range")))
}

pub(super) fn optional_time(
    row: &SqliteRow,
    column: &str,
) -> Result<Option<DateTime<Utc>>, EventLogError> {
    row.try_get::<Option<i64>, _>(column)
        .map_err(super::super::invalid)?
        .map(from_micros)
        .transpose()
}

pub(super) fn retry_count(row: &SqliteRow) -> Result<u32, EventLogError> {
    let value: i64 = row.try_get("retry_count").map_err(super::super::invalid)?;
    u32::try_from(value)
        .map_err(|_| EventLogError::Invalid(format!("retry_count {value} out of range")))
}

pub(super) fn event_from_row(row: &SqliteRow) -> Result<LoggedEvent, EventLogError> {
    Ok(LoggedEvent {
        id: row.try_get("id").map_err(super::super::invalid)?,
        topic: row.try_get("topic").map_err(super::super::invalid)?,
        content_type: row.try_get("content_type").map_err(super::super::invalid)?,
        body: Bytes::from(
            row.try_get::<Vec<u8>, _>("body")
                .map_err(super::super::invalid)?,
        ),
        created_at: from_micros(row.try_get("created_at").map_err(super::super::invalid)?)?,
        original_id: row.try_get("original_id").map_err(super::super::invalid)?,
        trace_context: row
            .try_get("trace_context")
            .map_err(super::super::invalid)?,
    })
}

pub(super) fn claimed_from_row(row: &SqliteRow) -> Result<Claimed, EventLogError> {
    Ok(Claimed {
        event_id: row.try_get("event_id").map_err(super::super::invalid)?,
        topic: row.try_get("topic").map_err(super::super::invalid)?,
        subscriber: row.try_get("subscriber").map_err(super::super::invalid)?,
        retry_count: retry_count(row)?,
    })
}

pub(super) fn delivery_from_row(row: &SqliteRow) -> Result<DeliveryRecord, EventLogError> {
    let processed_at = optional_time(row, "processed_at")?;
    let next_attempt_at = optional_time(row, "next_attempt_at")?;
    let outcome: Option<&str> = row.try_get("outcome").map_err(super::super::invalid)?;
    Ok(DeliveryRecord {
        event_id: row.try_get("event_id").map_err(super::super::invalid)?,
        subscriber: row.try_get("subscriber").map_err(super::super::invalid)?,
        state: DeliveryState::of(processed_at.is_some(), next_attempt_at.is_some(), outcome)?,
        processed_at,
        retry_count: retry_count(row)?,
        last_error: row.try_get("last_error").map_err(super::super::invalid)?,
        processing_since: optional_time(row, "processing_since")?,
        next_attempt_at,
    })
}

pub(super) fn is_unique_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|error| error.is_unique_violation())
}

/// A record refused for want of its event.
pub(super) fn is_foreign_key_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|error| error.is_foreign_key_violation())
}

/// The completions as the JSON array [`COMPLETE`] reads.
pub(super) fn completions_json(completions: &[&Completion]) -> Result<String, EventLogError> {
    let rows: Vec<_> = completions
        .iter()
        .map(|completion| {
            let (kind, error, next) = match &completion.outcome {
                Outcome::Delivered => ("delivered", None, None),
                Outcome::Retry {
                    error,
                    next_attempt_at,
                } => (
                    "retry",
                    Some(error.as_str()),
                    Some(next_attempt_at.timestamp_micros()),
                ),
                Outcome::Exhausted { error } => ("exhausted", Some(error.as_str()), None),
                Outcome::Dropped { reason } => ("dropped", Some(reason.as_str()), None),
                Outcome::Skipped { reason } => ("skipped", Some(reason.as_str()), None),
                Outcome::Postponed {
                    error,
                    next_attempt_at,
                } => (
                    "postponed",
                    error.as_deref(),
                    Some(next_attempt_at.timestamp_micros()),
                ),
            };
            (
                completion.event_id.simple().to_string(),
                completion.subscriber.as_str(),
                kind,
                error,
                next,
            )
        })
        .collect();
    serde_json::to_string(&rows).map_err(|error| EventLogError::Invalid(error.to_string()))
}

/// A delivered record's fields as the delivered statements read them:
/// subscriber, attempted at in µs, duration in µs, status, response as hex;
/// the attempt's null when the completion carries none.
type DeliveredRecord<'a> = (
    &'a str,
    Option<i64>,
    Option<i64>,
    Option<u16>,
    Option<String>,
);

fn delivered_record(completion: &Completion) -> DeliveredRecord<'_> {
    let attempt = completion.attempt.as_ref();
    (
        completion.subscriber.as_str(),
        attempt.map(|attempt| attempt.at.timestamp_micros()),
        attempt.map(|attempt| attempt.duration_micros),
        attempt.and_then(|attempt| attempt.status),
        attempt.map(|attempt| hex(&attempt.response)),
    )
}

/// Delivered `completions` as [`COMPLETE_DELIVERED`] reads them: [event id
/// as hex, then the record's fields].
pub(super) fn delivered_json(completions: &[&Completion]) -> Result<String, EventLogError> {
    let rows: Vec<_> = completions
        .iter()
        .map(|completion| {
            let (subscriber, at, duration, status, response) = delivered_record(completion);
            let event_id = completion.event_id.simple().to_string();
            (event_id, subscriber, at, duration, status, response)
        })
        .collect();
    serde_json::to_string(&rows).map_err(|error| EventLogError::Invalid(error.to_string()))
}

/// Delivered `completions` as [`INSERT_DELIVERED`] reads them, grouped by
/// event (a fan-out's outcomes are mostly one event's): [[event id as hex,
/// [the records' fields, …]], …].
pub(super) fn delivered_by_event_json(
    completions: &[&Completion],
) -> Result<String, EventLogError> {
    let mut events: Vec<(uuid::Uuid, Vec<DeliveredRecord<'_>>)> = Vec::new();
    for completion in completions {
        let record = delivered_record(completion);
        match events
            .iter_mut()
            .rev()
            .find(|(event_id, _)| *event_id == completion.event_id)
        {
            Some((_, records)) => records.push(record),
            None => events.push((completion.event_id, vec![record])),
        }
    }
    let events: Vec<_> = events
        .iter()
        .map(|(event_id, records)| (event_id.simple().to_string(), records))
        .collect();
    serde_json::to_string(&events).map_err(|error| EventLogError::Invalid(error.to_string()))
}

/// The attempts `completions` carry, as [`RECORD_ATTEMPTS`] reads them; none
/// when no completion carries one.
pub(super) fn attempts_json(completions: &[&Completion]) -> Result<Option<String>, EventLogError> {
    let rows: Vec<_> = completions
        .iter()
        .filter_map(|completion| {
            let attempt = completion.attempt.as_ref()?;
            let error = completion.outcome.error();
            Some((
                completion.event_id.simple().to_string(),
                completion.subscriber.as_str(),
                attempt.at.timestamp_micros(),
                attempt.duration_micros,
                attempt.status,
                error,
                hex(&attempt.response),
            ))
        })
        .collect();
    if rows.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(&rows)
        .map(Some)
        .map_err(|error| EventLogError::Invalid(error.to_string()))
}

pub(super) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut text, byte| {
            let _ = write!(text, "{byte:02x}");
            text
        })
}

pub(super) fn attempt_from_row(row: &SqliteRow) -> Result<Attempt, EventLogError> {
    let status: Option<i64> = row.try_get("status").map_err(super::super::invalid)?;
    Ok(Attempt {
        at: from_micros(row.try_get("attempted_at").map_err(super::super::invalid)?)?,
        duration_micros: row.try_get("duration_us").map_err(super::super::invalid)?,
        status: status.and_then(|status| u16::try_from(status).ok()),
        error: row.try_get("error").map_err(super::super::invalid)?,
        response: Bytes::from(
            row.try_get::<Vec<u8>, _>("response")
                .map_err(super::super::invalid)?,
        ),
    })
}
