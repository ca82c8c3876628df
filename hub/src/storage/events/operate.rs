//! What operators read and steer in the event log beyond the dispatcher's
//! bookkeeping: where each delivery stands, the filters that list them,
//! redeliveries and replays (copies of an event, each a round of its own),
//! and the health of endpoints that have been failing.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{DeliveryState, EventLogError};

/// The SQL that computes a record's [`DeliveryState`] from the columns of
/// `websub_deliveries AS d`, the same in both dialects.
pub(super) const STATE_SQL: &str = "CASE \
     WHEN d.processed_at IS NULL AND d.next_attempt_at IS NOT NULL THEN 'pending' \
     WHEN d.processed_at IS NULL THEN 'failed' \
     ELSE COALESCE(d.outcome, 'delivered') END";

/// Which delivery records [`DeliveryOperations::list`](super::DeliveryOperations::list) returns;
/// `None` matches everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryFilter<'a> {
    /// Records of this event, and of its redeliveries.
    pub event_id: Option<Uuid>,
    /// Records of events of this topic.
    pub topic: Option<&'a str>,
    /// Records of this subscriber (a callback URL).
    pub subscriber: Option<&'a str>,
    /// Records in this state.
    pub state: Option<DeliveryState>,
    /// Records of events recorded at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Records of events recorded before this time.
    pub until: Option<DateTime<Utc>>,
}

/// One delivery record with its event's topic and time, for lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct DeliverySummary {
    /// The event this record belongs to: the original's, or a redelivery's.
    pub event_id: Uuid,
    /// For a redelivery, the event it sends again (whose id the subscriber
    /// receives).
    pub original_id: Option<Uuid>,
    /// The event's topic.
    pub topic: String,
    /// The subscriber (callback URL).
    pub subscriber: String,
    /// When the event (or the redelivery) was recorded.
    pub created_at: DateTime<Utc>,
    /// Where it stands.
    pub state: DeliveryState,
    /// Failed attempts counted against the retry limit.
    pub retry_count: u32,
    /// The last failure (or why it was dropped or skipped).
    pub last_error: Option<String>,
    /// When it was closed: delivered, dropped or skipped.
    pub processed_at: Option<DateTime<Utc>>,
    /// When it is due, while pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// What [`DeliveryOperations::replay`](super::DeliveryOperations::replay) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// The redeliveries recorded, one per event, oldest event first.
    pub redeliveries: Vec<Uuid>,
    /// When more events follow than one call replays: the time of the first
    /// of them, to replay from next.
    pub resume_since: Option<DateTime<Utc>>,
}

/// Why the tally disabled an endpoint.
pub(super) fn disabled_after(failures: i64) -> String {
    if failures == 1 {
        "1 delivery exhausted its retries".to_owned()
    } else {
        format!("{failures} deliveries in a row exhausted their retries")
    }
}

/// Which span of time [`DeliveryOperations::activity`](super::DeliveryOperations::activity)
/// reads, in how many buckets, and how many endpoints it ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivityWindow {
    /// The start of the first bucket.
    pub since: DateTime<Utc>,
    /// How long each bucket lasts (at least a microsecond).
    pub bucket: chrono::TimeDelta,
    /// How many buckets follow `since`.
    pub buckets: usize,
    /// How many endpoints each ranking lists at most.
    pub endpoints: usize,
}

impl ActivityWindow {
    /// The end of the last bucket.
    pub fn until(&self) -> DateTime<Utc> {
        self.since + self.bucket * i32::try_from(self.buckets).unwrap_or(i32::MAX)
    }

    /// The bucket's length in microseconds, as the statements divide by it.
    pub(super) fn bucket_micros(&self) -> i64 {
        self.bucket.num_microseconds().unwrap_or(i64::MAX).max(1)
    }
}

/// The attempts of one bucket of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivityBucket {
    /// When the bucket starts.
    pub start: DateTime<Utc>,
    /// Attempts answered 2xx.
    pub delivered: u64,
    /// Attempts that failed (an answer other than 2xx, or none).
    pub failed: u64,
    /// The median attempt's duration, in microseconds; `None` without an
    /// attempt.
    pub p50_micros: Option<i64>,
    /// The 99th percentile's (nearest rank), in microseconds.
    pub p99_micros: Option<i64>,
}

/// One endpoint's attempts over a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointActivity {
    /// The callback URL.
    pub endpoint: String,
    /// Attempts answered 2xx.
    pub delivered: u64,
    /// Attempts that failed.
    pub failed: u64,
}

/// What [`DeliveryOperations::activity`](super::DeliveryOperations::activity) found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activity {
    /// Every bucket of the window, in time order, empty ones included.
    pub buckets: Vec<ActivityBucket>,
    /// The endpoints with the most attempts answered 2xx, most first.
    pub busiest: Vec<EndpointActivity>,
    /// The endpoints with the most failed attempts, most first; only those
    /// with one at least.
    pub failing: Vec<EndpointActivity>,
}

/// One row of a bucketed statement: the bucket's number from the window's
/// start, attempts delivered and failed, the two percentiles.
pub(super) type BucketRow = (i64, i64, i64, Option<i64>, Option<i64>);

/// The window's buckets from the rows the statement found (only buckets
/// with attempts have one), the others empty.
pub(super) fn fill_buckets(
    window: &ActivityWindow,
    rows: &[BucketRow],
) -> Result<Vec<ActivityBucket>, EventLogError> {
    let mut buckets: Vec<ActivityBucket> = (0..window.buckets)
        .map(|number| ActivityBucket {
            start: window.since + window.bucket * i32::try_from(number).unwrap_or(i32::MAX),
            delivered: 0,
            failed: 0,
            p50_micros: None,
            p99_micros: None,
        })
        .collect();
    for &(number, delivered, failed, p50, p99) in rows {
        let bucket = usize::try_from(number)
            .ok()
            .and_then(|number| buckets.get_mut(number))
            .ok_or_else(|| EventLogError::Invalid(format!("bucket {number} out of the window")))?;
        bucket.delivered = super::count(delivered)?;
        bucket.failed = super::count(failed)?;
        bucket.p50_micros = p50;
        bucket.p99_micros = p99;
    }
    Ok(buckets)
}

/// Endpoints from the rows the ranking statement found: (endpoint,
/// delivered, failed).
pub(super) fn endpoint_activity(
    rows: Vec<(String, i64, i64)>,
) -> Result<Vec<EndpointActivity>, EventLogError> {
    rows.into_iter()
        .map(|(endpoint, delivered, failed)| {
            Ok(EndpointActivity {
                endpoint,
                delivered: super::count(delivered)?,
                failed: super::count(failed)?,
            })
        })
        .collect()
}
