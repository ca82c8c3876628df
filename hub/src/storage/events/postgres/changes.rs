//! The PostgreSQL statements of the endpoints' history
//! ([`EndpointChanges`]): claims skip each other's rows
//! (`FOR UPDATE SKIP LOCKED`), so replicas sharing the database send each
//! change to the operator webhook from one of them at a time.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::super::sql::changes::{COLUMNS, DELIVERED, FAILED, PURGE, RELEASED, RETRY, SHED, TRIM};
use super::super::{
    ChangeFilter, EndpointChange, EndpointChanges, EventLogError, MAX_CHANGES, NewChange, Sent,
    invalid,
};
use super::super::{small_count, state_of, webhook_state_of};
use super::PostgresEventLog;

const APPEND: &str = "INSERT INTO websub_endpoint_changes \
     (channel, endpoint, state, at, failures, since, reason, source, next_attempt_at) \
     SELECT c.channel, c.endpoint, c.state, c.at, c.failures, c.since, c.reason, c.source, c.at \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], \
                                 $5::int[], $6::timestamptz[], $7::text[], $8::text[]) \
         WITH ORDINALITY AS c(channel, endpoint, state, at, failures, since, reason, source, n) \
     ORDER BY n";

fn list_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM websub_endpoint_changes \
         WHERE ($1::text IS NULL OR channel = $1) AND ($2::text IS NULL OR endpoint = $2) \
         ORDER BY id DESC LIMIT $3"
    )
}

fn claim_sql() -> String {
    format!(
        "UPDATE websub_endpoint_changes SET claimed_until = $2 \
         WHERE id IN (SELECT id FROM websub_endpoint_changes \
                      WHERE webhook_state = 'pending' AND next_attempt_at <= $1 \
                        AND (claimed_until IS NULL OR claimed_until <= $1) \
                      ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) \
         RETURNING {COLUMNS}"
    )
}

fn change_from_row(row: &PgRow) -> Result<EndpointChange, EventLogError> {
    let state: String = row.try_get("state").map_err(invalid)?;
    let webhook_state: String = row.try_get("webhook_state").map_err(invalid)?;
    let failures: Option<i32> = row.try_get("failures").map_err(invalid)?;
    let retries: i32 = row.try_get("retry_count").map_err(invalid)?;
    Ok(EndpointChange {
        id: row.try_get("id").map_err(invalid)?,
        channel: row.try_get("channel").map_err(invalid)?,
        endpoint: row.try_get("endpoint").map_err(invalid)?,
        to: state_of(&state)?,
        at: row.try_get("at").map_err(invalid)?,
        failures: small_count(failures.map(i64::from))?,
        since: row.try_get("since").map_err(invalid)?,
        reason: row.try_get("reason").map_err(invalid)?,
        source: row.try_get("source").map_err(invalid)?,
        webhook_state: webhook_state_of(&webhook_state)?,
        webhook_retries: small_count(Some(i64::from(retries)))?.unwrap_or_default(),
        webhook_error: row.try_get("last_error").map_err(invalid)?,
        delivered_at: row.try_get("delivered_at").map_err(invalid)?,
    })
}

fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[async_trait]
impl EndpointChanges for PostgresEventLog {
    async fn append_changes(&self, changes: &[NewChange]) -> Result<(), EventLogError> {
        if changes.is_empty() {
            return Ok(());
        }
        let column = |get: fn(&NewChange) -> Option<String>| -> Vec<Option<String>> {
            changes.iter().map(get).collect()
        };
        let mut tx = self.pool.begin().await?;
        sqlx::query(APPEND)
            .bind(column(|change| Some(change.channel.to_owned())))
            .bind(column(|change| Some(change.endpoint.clone())))
            .bind(column(|change| Some(change.to.as_str().to_owned())))
            .bind(changes.iter().map(|change| change.at).collect::<Vec<_>>())
            .bind(
                changes
                    .iter()
                    .map(|change| change.failures.and_then(|n| i32::try_from(n).ok()))
                    .collect::<Vec<_>>(),
            )
            .bind(
                changes
                    .iter()
                    .map(|change| change.since)
                    .collect::<Vec<_>>(),
            )
            .bind(column(|change| change.reason.clone()))
            .bind(column(|change| Some(change.source.to_owned())))
            .execute(&mut *tx)
            .await?;
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
        let mut claimed = sqlx::query(sqlx::AssertSqlSafe(claim_sql()))
            .bind(now)
            .bind(until)
            .bind(limit_of(limit))
            .fetch_all(&self.pool)
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
        let mut tx = self.pool.begin().await?;
        for (id, sent) in settled {
            let query = match sent {
                Sent::Delivered(at) => sqlx::query(DELIVERED).bind(id).bind(at),
                Sent::Retry {
                    error,
                    next_attempt_at,
                    counted,
                } => sqlx::query(RETRY)
                    .bind(id)
                    .bind(next_attempt_at)
                    .bind(error)
                    .bind(i32::from(*counted)),
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
        let shed = sqlx::query(SHED)
            .bind(limit_of(keep))
            .bind(older_than)
            .execute(&self.pool)
            .await?;
        Ok(shed.rows_affected())
    }

    async fn purge_changes_before(&self, cutoff: DateTime<Utc>) -> Result<u64, EventLogError> {
        let purged = sqlx::query(PURGE).bind(cutoff).execute(&self.pool).await?;
        Ok(purged.rows_affected())
    }
}
