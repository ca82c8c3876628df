//! The SQLite statements of the endpoints' history
//! ([`EndpointChanges`]): writes go through the log's write connection, one
//! transaction each, so a claim cannot overlap another.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Connection, Row};

use super::super::sql::changes::{COLUMNS, DELIVERED, FAILED, PURGE, RELEASED, RETRY, SHED, TRIM};
use super::super::{
    ChangeFilter, EndpointChange, EndpointChanges, EventLogError, MAX_CHANGES, NewChange, Sent,
    invalid,
};
use super::super::{small_count, state_of, webhook_state_of};
use super::SqlEventLog;
use super::SqliteEventLog;

const APPEND: &str = "INSERT INTO websub_endpoint_changes \
     (channel, endpoint, state, at, failures, since, reason, source, next_attempt_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $4)";

fn list_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM websub_endpoint_changes \
         WHERE ($1 IS NULL OR channel = $1) AND ($2 IS NULL OR endpoint = $2) \
         ORDER BY id DESC LIMIT $3"
    )
}

fn claim_sql() -> String {
    format!(
        "UPDATE websub_endpoint_changes SET claimed_until = $2 \
         WHERE id IN (SELECT id FROM websub_endpoint_changes \
                      WHERE webhook_state = 'pending' AND next_attempt_at <= $1 \
                        AND (claimed_until IS NULL OR claimed_until <= $1) \
                      ORDER BY id LIMIT $3) \
         RETURNING {COLUMNS}"
    )
}

fn change_from_row(row: &SqliteRow) -> Result<EndpointChange, EventLogError> {
    let state: String = row.try_get("state").map_err(invalid)?;
    let webhook_state: String = row.try_get("webhook_state").map_err(invalid)?;
    Ok(EndpointChange {
        id: row.try_get("id").map_err(invalid)?,
        channel: row.try_get("channel").map_err(invalid)?,
        endpoint: row.try_get("endpoint").map_err(invalid)?,
        to: state_of(&state)?,
        at: SqliteEventLog::time_of(row, "at")?,
        failures: small_count(row.try_get("failures").map_err(invalid)?)?,
        since: SqliteEventLog::optional_time_of(row, "since")?,
        reason: row.try_get("reason").map_err(invalid)?,
        source: row.try_get("source").map_err(invalid)?,
        webhook_state: webhook_state_of(&webhook_state)?,
        webhook_retries: small_count(Some(row.try_get("retry_count").map_err(invalid)?))?
            .unwrap_or_default(),
        webhook_error: row.try_get("last_error").map_err(invalid)?,
        delivered_at: SqliteEventLog::optional_time_of(row, "delivered_at")?,
    })
}

fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[async_trait]
impl EndpointChanges for SqliteEventLog {
    async fn append_changes(&self, changes: &[NewChange]) -> Result<(), EventLogError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut writer = self.writer().await?;
        let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
        for change in changes {
            sqlx::query(APPEND)
                .bind(change.channel)
                .bind(&change.endpoint)
                .bind(change.to.as_str())
                .bind(change.at.timestamp_micros())
                .bind(change.failures.map(i64::from))
                .bind(change.since.map(|since| since.timestamp_micros()))
                .bind(change.reason.as_deref())
                .bind(change.source)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(TRIM)
            .bind(MAX_CHANGES)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_changes(
        &self,
        filter: ChangeFilter<'_>,
        limit: usize,
    ) -> Result<Vec<EndpointChange>, EventLogError> {
        sqlx::query(sqlx::AssertSqlSafe(list_sql()))
            .bind(filter.channel)
            .bind(filter.endpoint)
            .bind(limit_of(limit))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(change_from_row)
            .collect()
    }

    async fn claim_unsent(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<EndpointChange>, EventLogError> {
        let mut writer = self.writer().await?;
        let mut claimed = sqlx::query(sqlx::AssertSqlSafe(claim_sql()))
            .bind(now.timestamp_micros())
            .bind(until.timestamp_micros())
            .bind(limit_of(limit))
            .fetch_all(&mut *writer)
            .await?
            .iter()
            .map(change_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by_key(|change| change.id);
        Ok(claimed)
    }

    async fn settle_sent(&self, settled: &[(i64, Sent)]) -> Result<(), EventLogError> {
        if settled.is_empty() {
            return Ok(());
        }
        let mut writer = self.writer().await?;
        let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
        for (id, sent) in settled {
            let query = match sent {
                Sent::Delivered(at) => sqlx::query(DELIVERED).bind(id).bind(at.timestamp_micros()),
                Sent::Retry {
                    error,
                    next_attempt_at,
                    counted,
                } => sqlx::query(RETRY)
                    .bind(id)
                    .bind(next_attempt_at.timestamp_micros())
                    .bind(error)
                    .bind(i64::from(*counted)),
                Sent::Failed { error } => sqlx::query(FAILED).bind(id).bind(error),
                Sent::Released => sqlx::query(RELEASED).bind(id),
            };
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn shed_unsent(
        &self,
        keep: usize,
        older_than: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        let mut writer = self.writer().await?;
        let shed = sqlx::query(SHED)
            .bind(limit_of(keep))
            .bind(older_than.timestamp_micros())
            .execute(&mut *writer)
            .await?;
        Ok(shed.rows_affected())
    }

    async fn purge_changes_before(&self, cutoff: DateTime<Utc>) -> Result<u64, EventLogError> {
        let mut writer = self.writer().await?;
        let purged = sqlx::query(PURGE)
            .bind(cutoff.timestamp_micros())
            .execute(&mut *writer)
            .await?;
        Ok(purged.rows_affected())
    }
}
