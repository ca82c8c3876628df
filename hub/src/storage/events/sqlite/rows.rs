//! The SQLite event log's encodings: times as µs since the epoch, the
//! JSON arrays a batch of completions and their attempts is written as, and
//! the database's refusals read as the log's errors.

use chrono::{DateTime, Utc};

use super::super::{Completion, EventLogError};

pub(super) fn from_micros(micros: i64) -> Result<DateTime<Utc>, EventLogError> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| EventLogError::Invalid(format!("timestamp {micros} µs out of range")))
}

/// A record refused for want of its event.
pub(super) fn is_foreign_key_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|error| error.is_foreign_key_violation())
}

/// The completions as the JSON array [`COMPLETE`](super::statements::COMPLETE) reads.
pub(super) fn completions_json(completions: &[&Completion]) -> Result<String, EventLogError> {
    let rows: Vec<_> = completions
        .iter()
        .map(|completion| {
            let outcome = &completion.outcome;
            let (kind, error, next) = (
                outcome.kind(),
                outcome.error(),
                outcome.next_attempt_at().map(|at| at.timestamp_micros()),
            );
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

/// Delivered `completions` as [`COMPLETE_DELIVERED`](super::statements::COMPLETE_DELIVERED) reads them: [event id
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

/// Delivered `completions` as [`INSERT_DELIVERED`](super::statements::INSERT_DELIVERED) reads them, grouped by
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

/// The attempts `completions` carry, as [`RECORD_ATTEMPTS`](super::statements::RECORD_ATTEMPTS) reads them; none
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
