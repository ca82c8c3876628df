//! The operators' calls ([`DeliveryOperations`]), one impl for every
//! [`SqlEventLog`]: the same on both databases but for the few statements
//! each spells its own way, which are the backend's required items.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Encode, Executor, IntoArguments, Row, Type};
use uuid::Uuid;

use super::super::operate::{BucketRow, endpoint_activity, fill_buckets};
use super::super::{
    Activity, ActivityWindow, DeliveryFilter, DeliveryHealth, DeliveryOperations, DeliveryRecord,
    DeliveryState, DeliverySummary, EventLogError, FailedDelivery, FailedFilter, Replayed,
    Undelivered, count, invalid, sql,
};
use super::SqlEventLog;
use crate::storage::dialect::{Dialect, Stored, bound};

// The bounds are [`SqlEventLog`]'s, which Rust does not carry over from
// its declaration.
#[async_trait]
impl<Log> DeliveryOperations for Log
where
    Log: SqlEventLog + Send + std::fmt::Debug,
    for<'c> &'c mut <Log::Db as Database>::Connection: Executor<'c, Database = Log::Db>,
    <Log::Db as Database>::Arguments: IntoArguments<Log::Db>,
    for<'n> &'n str: ColumnIndex<<Log::Db as Database>::Row>,
    usize: ColumnIndex<<Log::Db as Database>::Row>,
    for<'q> &'q str: Encode<'q, Log::Db> + Type<Log::Db>,
    for<'q> Option<&'q str>: Encode<'q, Log::Db>,
    Option<Uuid>: for<'q> Encode<'q, Log::Db>,
    Option<<Log::Db as Dialect>::Time>: for<'q> Encode<'q, Log::Db>,
    Uuid: Stored<Log::Db>,
    String: Stored<Log::Db>,
    Vec<u8>: Stored<Log::Db>,
    i64: Stored<Log::Db>,
    i32: Stored<Log::Db>,
    i16: Stored<Log::Db>,
    bool: Stored<Log::Db>,
{
    async fn activity(&self, window: ActivityWindow) -> Result<Activity, EventLogError> {
        let since = Log::Db::time(window.since);
        let until = Log::Db::time(window.until());
        let rows: Vec<BucketRow> = sqlx::query_as(AssertSqlSafe(Log::activity_buckets()))
            .bind(since)
            .bind(until)
            .bind(window.bucket_micros())
            .fetch_all(self.reads())
            .await?;
        let endpoints = i64::try_from(window.endpoints).unwrap_or(i64::MAX);
        let mut ranked = Vec::with_capacity(2);
        for statement in [&*sql::activity::BUSIEST, &*sql::activity::FAILING] {
            let rows: Vec<(String, i64, i64)> = sqlx::query_as(AssertSqlSafe(statement.as_str()))
                .bind(since)
                .bind(until)
                .bind(endpoints)
                .fetch_all(self.reads())
                .await?;
            ranked.push(endpoint_activity(rows)?);
        }
        let failing = ranked.pop().unwrap_or_default();
        let busiest = ranked.pop().unwrap_or_default();
        Ok(Activity {
            buckets: fill_buckets(&window, &rows)?,
            busiest,
            failing,
        })
    }

    async fn delivery(
        &self,
        event_id: Uuid,
        subscriber: &str,
    ) -> Result<Option<DeliveryRecord>, EventLogError> {
        sqlx::query(sql::DELIVERY)
            .bind(event_id)
            .bind(subscriber)
            .fetch_optional(self.reads())
            .await?
            .as_ref()
            .map(Log::delivery_of)
            .transpose()
    }

    async fn deliveries(&self, event_id: Uuid) -> Result<Vec<DeliveryRecord>, EventLogError> {
        sqlx::query(sql::DELIVERIES)
            .bind(event_id)
            .fetch_all(self.reads())
            .await?
            .iter()
            .map(Log::delivery_of)
            .collect()
    }

    async fn undelivered(&self) -> Result<Undelivered, EventLogError> {
        let row = sqlx::query(sql::UNDELIVERED)
            .fetch_one(self.reads())
            .await?;
        Ok(Undelivered {
            records: count(row.try_get("records").map_err(invalid)?)?,
            oldest: Log::optional_time_of(&row, "oldest")?,
        })
    }

    async fn health(
        &self,
        topic: &str,
        subscriber: &str,
        window: usize,
    ) -> Result<DeliveryHealth, EventLogError> {
        let row = sqlx::query(Log::HEALTH)
            .bind(topic)
            .bind(subscriber)
            .bind(bound(window))
            .fetch_one(self.reads())
            .await?;
        Ok(DeliveryHealth {
            last_success: Log::optional_time_of(&row, "last_success")?,
            last_error: row.try_get("last_error").map_err(invalid)?,
            pending: count(row.try_get("pending").map_err(invalid)?)?,
            failed: count(row.try_get("failed").map_err(invalid)?)?,
        })
    }

    async fn failed(
        &self,
        filter: FailedFilter<'_>,
        limit: usize,
    ) -> Result<Vec<FailedDelivery>, EventLogError> {
        sqlx::query(Log::FAILED)
            .bind(filter.topic)
            .bind(filter.subscriber)
            .bind(bound(limit))
            .bind(filter.event_id)
            .fetch_all(self.reads())
            .await?
            .iter()
            .map(|row| {
                Ok(FailedDelivery {
                    event_id: row.try_get("event_id").map_err(invalid)?,
                    topic: row.try_get("topic").map_err(invalid)?,
                    subscriber: row.try_get("subscriber").map_err(invalid)?,
                    created_at: Log::time_of(row, "created_at")?,
                    retry_count: Log::count_of(row, "retry_count")?,
                    last_error: row.try_get("last_error").map_err(invalid)?,
                })
            })
            .collect()
    }

    async fn retry_failed(
        &self,
        filter: FailedFilter<'_>,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        let query = sqlx::query(Log::RETRY_FAILED)
            .bind(filter.topic)
            .bind(filter.subscriber)
            .bind(Log::Db::time(now))
            .bind(filter.event_id);
        let mut writer = self.writer().await?;
        let done = query.execute(&mut *writer).await?;
        Ok(Log::Db::affected(&done))
    }

    async fn list(
        &self,
        filter: DeliveryFilter<'_>,
        limit: usize,
    ) -> Result<Vec<DeliverySummary>, EventLogError> {
        sqlx::query(AssertSqlSafe(Log::listing()))
            .bind(filter.event_id)
            .bind(filter.topic)
            .bind(filter.subscriber)
            .bind(filter.state.map(DeliveryState::as_str))
            .bind(filter.since.map(Log::Db::time))
            .bind(filter.until.map(Log::Db::time))
            .bind(bound(limit))
            .fetch_all(self.reads())
            .await?
            .iter()
            .map(Log::summary_of)
            .collect()
    }

    async fn redeliver(
        &self,
        event_id: Uuid,
        subscribers: &[&str],
        now: DateTime<Utc>,
    ) -> Result<Option<Uuid>, EventLogError> {
        self.redeliver_copy(event_id, subscribers, now).await
    }

    async fn replay(
        &self,
        topic: &str,
        subscriber: &str,
        since: DateTime<Utc>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Replayed, EventLogError> {
        self.replay_since(topic, subscriber, since, limit, now)
            .await
    }

    async fn delivered_since(&self, since: DateTime<Utc>) -> Result<u64, EventLogError> {
        let row = sqlx::query(sql::DELIVERED_SINCE)
            .bind(Log::Db::time(since))
            .fetch_one(self.reads())
            .await?;
        count(row.try_get("delivered").map_err(invalid)?)
    }
}
