//! Sending a webhook's events again. The delivery rows are the producer's,
//! in the outbox's own two-table shape (one row per event and subscriber),
//! so sending again re-opens the rows — due now, with a fresh retry budget
//! — while the history of every earlier attempt stays in the hub's log.

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::Dispatcher;
use super::signals::Scan;
use crate::outbox::sql::bounded;

impl Dispatcher {
    /// Re-opens `subscriber`'s rows of the events recorded at or after
    /// `since` (or of the one event `event_id`), oldest first, at most
    /// `limit`, leaving those in flight alone; returns how many. The
    /// dispatcher then delivers them as any due row.
    pub async fn resend(
        &self,
        subscriber: &str,
        since: Option<DateTime<Utc>>,
        event_id: Option<Uuid>,
        limit: usize,
    ) -> Result<u64, sqlx::Error> {
        let inner = &self.inner;
        let outbox = inner.config.tables.outbox_sql();
        let deliveries = inner.config.tables.deliveries_sql();
        let sql = format!(
            "UPDATE {deliveries} AS d \
             SET processed_at = NULL, retry_count = 0, processing_since = NULL, \
                 next_attempt_at = timezone('utc', now()) \
             WHERE (d.event_id, d.subscriber) IN ( \
                 SELECT r.event_id, r.subscriber FROM {deliveries} AS r \
                 JOIN {outbox} AS o ON o.id = r.event_id \
                 WHERE r.subscriber = $1 AND r.processing_since IS NULL \
                   AND ($2::timestamp IS NULL OR o.created_at >= $2) \
                   AND ($3::uuid IS NULL OR o.id = $3) \
                 ORDER BY o.created_at, o.id LIMIT $4 \
                 FOR UPDATE OF r SKIP LOCKED)"
        );
        let reopened = sqlx::query(AssertSqlSafe(sql))
            .bind(subscriber)
            .bind(since.map(|since| since.naive_utc()))
            .bind(event_id)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&inner.pool);
        let reopened = bounded(inner.config.query_timeout, reopened)
            .await?
            .rows_affected();
        if reopened > 0 {
            self.request(Scan::None);
        }
        Ok(reopened)
    }
}
