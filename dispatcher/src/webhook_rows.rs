//! A webhook's delivery rows for operators: listed with their state, and
//! sent again. The rows are the producer's, in the outbox's own two-table
//! shape (one row per event and subscriber), so sending again re-opens the
//! rows — due now, with a fresh retry budget — while the history of every
//! earlier attempt stays in the hub's log.

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Serialize;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;
use websub_delivery::state::{DeliveryState, bounded};

use crate::Dispatcher;
use crate::signals::Scan;
use crate::sql::skipped_row;

/// One webhook delivery row, as an operator lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookDelivery {
    /// The feed's outbox table.
    pub outbox: String,
    /// The outbox event.
    pub event_id: Uuid,
    /// The event's name.
    pub event_name: String,
    /// The webhook's name.
    pub subscriber: String,
    /// When the event was committed.
    pub created_at: DateTime<Utc>,
    /// `pending`, `delivered`, `failed` or `skipped` (its webhook was
    /// disabled).
    pub state: DeliveryState,
    /// Failed attempts counted against the retry limit.
    pub retry_count: u32,
    /// The last failure.
    pub last_error: Option<String>,
    /// When it was delivered.
    pub processed_at: Option<DateTime<Utc>>,
    /// When it is due, while pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// Which webhook rows [`Dispatcher::webhook_deliveries`] lists; `None`
/// matches everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WebhookFilter<'a> {
    /// Only this webhook's.
    pub subscriber: Option<&'a str>,
    /// Only those in this state.
    pub state: Option<DeliveryState>,
    /// Events committed at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Events committed before this time.
    pub until: Option<DateTime<Utc>>,
}

impl Dispatcher {
    /// The webhook rows matching `filter`, newest event first, at most
    /// `limit`.
    pub async fn webhook_deliveries(
        &self,
        filter: WebhookFilter<'_>,
        limit: usize,
    ) -> Result<Vec<WebhookDelivery>, sqlx::Error> {
        let inner = &self.inner;
        let outbox = inner.config.tables.outbox_sql();
        let deliveries = inner.config.tables.deliveries_sql();
        let sql = format!(
            "SELECT * FROM ( \
                 SELECT d.event_id, o.event_name, d.subscriber, o.created_at, \
                        CASE WHEN d.processed_at IS NOT NULL THEN 'delivered' \
                             WHEN d.next_attempt_at IS NOT NULL THEN 'pending' \
                             WHEN {skipped} THEN 'skipped' \
                             ELSE 'failed' END AS state, \
                        d.retry_count, d.last_error, d.processed_at, d.next_attempt_at \
                 FROM {deliveries} AS d JOIN {outbox} AS o ON o.id = d.event_id \
                 WHERE ($1::text IS NULL OR d.subscriber = $1) \
                   AND ($2::timestamp IS NULL OR o.created_at >= $2) \
                   AND ($3::timestamp IS NULL OR o.created_at < $3)) AS listed \
             WHERE ($4::text IS NULL OR state = $4) \
             ORDER BY created_at DESC, event_id, subscriber LIMIT $5",
            skipped = skipped_row("d"),
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(filter.subscriber)
            .bind(filter.since.map(|since| since.naive_utc()))
            .bind(filter.until.map(|until| until.naive_utc()))
            .bind(filter.state.map(DeliveryState::as_str))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX));
        let rows = bounded(
            inner.config.query_timeout,
            &inner.pool,
            async move |connection| rows.fetch_all(connection).await,
        )
        .await?;
        let utc = |time: Option<NaiveDateTime>| time.map(|time| time.and_utc());
        rows.iter()
            .map(|row| {
                let state: String = row.try_get("state")?;
                let created_at: NaiveDateTime = row.try_get("created_at")?;
                let retry_count: i32 = row.try_get("retry_count")?;
                Ok(WebhookDelivery {
                    outbox: inner.config.tables.outbox().to_owned(),
                    event_id: row.try_get("event_id")?,
                    event_name: row.try_get("event_name")?,
                    subscriber: row.try_get("subscriber")?,
                    created_at: created_at.and_utc(),
                    state: DeliveryState::parse(&state).unwrap_or(DeliveryState::Failed),
                    retry_count: u32::try_from(retry_count).unwrap_or(0),
                    last_error: row.try_get("last_error")?,
                    processed_at: utc(row.try_get("processed_at")?),
                    next_attempt_at: utc(row.try_get("next_attempt_at")?),
                })
            })
            .collect()
    }

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
            .bind(i64::try_from(limit).unwrap_or(i64::MAX));
        let reopened = bounded(
            inner.config.query_timeout,
            &inner.pool,
            async move |connection| reopened.execute(connection).await,
        )
        .await?
        .rows_affected();
        if reopened > 0 {
            self.request(Scan::None);
        }
        Ok(reopened)
    }
}
