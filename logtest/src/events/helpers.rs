//! What the event log checks are written with: times in whole
//! microseconds, unique topics and subscribers, and short forms of the
//! calls most checks make. Public, for a backend's own tests.

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, TimeDelta, Utc};
use uuid::Uuid;
use websub_hub::storage::events::{
    Attempt, Claimed, Completion, DeliveryRecord, DeliveryState, EventLog, LoggedEvent, NewEvent,
    Outcome,
};

/// A time with whole microseconds, the precision both backends store.
pub fn base_time() -> DateTime<Utc> {
    DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).expect("now is in range")
}

/// `n` seconds.
pub fn secs(n: i64) -> TimeDelta {
    TimeDelta::seconds(n)
}

/// Long enough that no claim in a check goes stale unless the check says so.
pub const VISIBILITY: Duration = Duration::from_secs(30);

pub fn topic() -> String {
    format!("https://publisher.example/topics/{}", Uuid::new_v4())
}

pub fn subscribers(prefix: &str, n: usize) -> Vec<String> {
    let run = Uuid::new_v4().simple();
    (0..n)
        // Non-ASCII and a double quote: batches travel as JSON on SQLite.
        .map(|i| format!("https://subscriber.example/{prefix}/{run}/{i}?name=\"Zoë\""))
        .collect()
}

pub async fn record(log: &dyn EventLog, topic: &str, now: DateTime<Utc>) -> LoggedEvent {
    log.record(
        NewEvent {
            topic: topic.to_owned(),
            content_type: "application/json".to_owned(),
            body: Bytes::from_static(b"{\"hello\":\"world\"}"),
            trace_context: None,
        },
        now,
    )
    .await
    .expect("record an event")
}

/// Claims everything due at `now` and keeps only this event's records.
pub async fn claim_own(log: &dyn EventLog, event_id: Uuid, now: DateTime<Utc>) -> Vec<Claimed> {
    log.claim(100_000, now, VISIBILITY)
        .await
        .expect("claim")
        .into_iter()
        .filter(|claimed| claimed.event_id == event_id)
        .collect()
}

/// The backend's name, for printed measurements.
pub fn backend(log: &dyn EventLog) -> &'static str {
    if format!("{log:?}").starts_with("Postgres") {
        "postgres"
    } else {
        "sqlite"
    }
}

pub fn record_of<'a>(records: &'a [DeliveryRecord], subscriber: &str) -> &'a DeliveryRecord {
    records
        .iter()
        .find(|record| record.subscriber == subscriber)
        .unwrap_or_else(|| panic!("no delivery record for {subscriber}"))
}

pub fn completion(event_id: Uuid, subscriber: &str, outcome: Outcome) -> Completion {
    Completion {
        event_id,
        subscriber: subscriber.to_owned(),
        outcome,
        attempt: None,
    }
}

/// An attempt at `at` answered `status`, to be retried a minute later,
/// with the attempt kept.
pub fn retried(event_id: Uuid, subscriber: &str, at: DateTime<Utc>, status: u16) -> Completion {
    let error = format!("HTTP {status}");
    Completion {
        attempt: Some(Attempt {
            at,
            duration_micros: 1_000,
            status: Some(status),
            error: Some(error.clone()),
            response: Bytes::new(),
        }),
        ..completion(
            event_id,
            subscriber,
            Outcome::Retry {
                error,
                next_attempt_at: at + secs(60),
            },
        )
    }
}

pub fn pending(event_id: Uuid, subscriber: &str, due: DateTime<Utc>) -> DeliveryRecord {
    DeliveryRecord {
        event_id,
        subscriber: subscriber.to_owned(),
        processed_at: None,
        retry_count: 0,
        last_error: None,
        processing_since: None,
        next_attempt_at: Some(due),
        state: DeliveryState::Pending,
    }
}

pub fn strs(subscribers: &[String]) -> Vec<&str> {
    subscribers.iter().map(String::as_str).collect()
}

pub fn sorted(mut subscribers: Vec<String>) -> Vec<String> {
    subscribers.sort();
    subscribers
}

pub fn is_unexpanded(unexpanded: &[LoggedEvent], event_id: Uuid) -> bool {
    unexpanded.iter().any(|event| event.id == event_id)
}

/// The state of each listed record, by (event, subscriber).
pub fn states(
    listed: &[websub_hub::storage::events::DeliverySummary],
) -> Vec<(Uuid, String, DeliveryState)> {
    listed
        .iter()
        .map(|record| (record.event_id, record.subscriber.clone(), record.state))
        .collect()
}
