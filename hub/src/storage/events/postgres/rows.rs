//! The PostgreSQL event log's encodings: the column arrays a batch of
//! completions and their attempts is written as, and the database's
//! refusals read as the log's errors.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::super::{Completion, EventLogError};

/// The completions as the column arrays [`COMPLETE`](super::statements::COMPLETE) unnests.
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
            let outcome = &completion.outcome;
            let (kind, error, next) = (outcome.kind(), outcome.error(), outcome.next_attempt_at());
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
