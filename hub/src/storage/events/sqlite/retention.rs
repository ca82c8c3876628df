//! The SQLite log's retention: old events deleted with their records in
//! chunks that each hold the file's one writer only for a short turn, so
//! that deliveries queued behind a purge keep flowing.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::statements::{PURGE, PURGE_WEBHOOK_ATTEMPTS};
use super::{EventLogError, SqliteEventLog};

/// How long one `DELETE` aims to hold the writer: each event deleted
/// cascades to its delivery rows, as many as it had subscribers, so the
/// number of events per chunk follows the time the last chunk took,
/// between one and [`PURGE_MOST`]. Deliveries waiting for the writer
/// meanwhile wait at most about this long.
const PURGE_TURN: Duration = Duration::from_millis(2);

/// The most events one chunk of a purge deletes.
const PURGE_MOST: i64 = 1_000;

/// The events of the log created before `cutoff` go, with their records;
/// webhook attempts older than `cutoff` too. Returns how many events went.
pub(super) async fn purge_before(
    log: &SqliteEventLog,
    cutoff: DateTime<Utc>,
) -> Result<u64, EventLogError> {
    let mut deleted = 0;
    let mut size: i64 = 16;
    loop {
        let mut writer = log.writer().await?;
        let started = Instant::now();
        let chunk = sqlx::query(PURGE)
            .bind(cutoff.timestamp_micros())
            .bind(size)
            .execute(&mut *writer)
            .await?
            .rows_affected();
        deleted += chunk;
        let took = started.elapsed();
        let full = chunk >= size.unsigned_abs();
        if took < PURGE_TURN / 2 {
            size = (size * 2).min(PURGE_MOST);
        } else if took > PURGE_TURN * 2 {
            size = (size / 2).max(1);
        }
        if !full {
            sqlx::query(PURGE_WEBHOOK_ATTEMPTS)
                .bind(cutoff.timestamp_micros())
                .execute(&mut *writer)
                .await?;
            return Ok(deleted);
        }
    }
}
