//! The event log's code written once for SQLite and PostgreSQL: the rows
//! read back into the log's types, and the operations whose statements and
//! steps the two databases share. A backend states where it differs, in
//! [`SqlEventLog`]'s few required items: where it reads, the connection it
//! writes on, and the statements its dialect spells its own way; its trait
//! impls call the rest.
//!
//! [`Dialect`] says how each database keeps a time; everything else here is
//! the same on both.

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::{
    AssertSqlSafe, ColumnIndex, Connection, Database, Encode, Executor, IntoArguments, Pool, Row,
    Type,
};
use uuid::Uuid;

use super::{
    Attempt, ChangeFilter, Claimed, DeliveryRecord, DeliveryState, DeliverySummary, EndpointChange,
    EndpointRecord, EventLogError, Exhaustion, LoggedEvent, MAX_CHANGES, NewChange,
    OrderedSubscription, Replayed, Sent, WebhookAttempt, invalid, small_count, sql, state_of,
    webhook_state_of,
};
use crate::storage::dialect::{Dialect, Stored, bound};

pub(super) mod endpoints;
mod operations;

/// A backend's log, as the code written once for both databases sees it.
#[async_trait]
pub(super) trait SqlEventLog: Sync
where
    for<'c> &'c mut <Self::Db as Database>::Connection: Executor<'c, Database = Self::Db>,
    <Self::Db as Database>::Arguments: IntoArguments<Self::Db>,
    for<'n> &'n str: ColumnIndex<<Self::Db as Database>::Row>,
    usize: ColumnIndex<<Self::Db as Database>::Row>,
    for<'q> &'q str: Encode<'q, Self::Db> + Type<Self::Db>,
    for<'q> Option<&'q str>: Encode<'q, Self::Db>,
    Option<Uuid>: for<'q> Encode<'q, Self::Db>,
    Option<<Self::Db as Dialect>::Time>: for<'q> Encode<'q, Self::Db>,
    Uuid: Stored<Self::Db>,
    String: Stored<Self::Db>,
    Vec<u8>: Stored<Self::Db>,
    i64: Stored<Self::Db>,
    i32: Stored<Self::Db>,
    i16: Stored<Self::Db>,
    bool: Stored<Self::Db>,
{
    /// The database the log is kept in.
    type Db: Dialect;

    /// The connection writes go through, held for one write.
    type Writer<'a>: std::ops::DerefMut<Target = <Self::Db as Database>::Connection> + Send
    where
        Self: 'a;

    /// The lanes with records due, each with its earliest due time.
    const DUE_LANES: &'static str;

    /// Hands a failing endpoint's claimed records back (see
    /// [`super::DeliveryQueue::release_endpoint`]).
    const RELEASE_ENDPOINT: &'static str;

    /// The exhausted records a [`FailedFilter`](super::FailedFilter) matches, newest first.
    const FAILED: &'static str;

    /// Makes the records [`Self::FAILED`] matches due again.
    const RETRY_FAILED: &'static str;

    /// A delivery's recent health (see [`DeliveryOperations::health`](super::DeliveryOperations::health)).
    const HEALTH: &'static str;

    /// The records a [`DeliveryFilter`](super::DeliveryFilter) matches, newest first.
    fn listing() -> &'static str;

    /// The attempts of a window counted by bucket (see
    /// [`super::sql::activity::buckets`]): the distance from a time to the
    /// window's start in µs is the dialect's.
    fn activity_buckets() -> &'static str;

    /// See [`DeliveryOperations::redeliver`](super::DeliveryOperations::redeliver): how a copy is locked against a
    /// purge is the database's.
    async fn redeliver_copy(
        &self,
        event_id: Uuid,
        subscribers: &[&str],
        now: DateTime<Utc>,
    ) -> Result<Option<Uuid>, EventLogError>;

    /// See [`DeliveryOperations::replay`](super::DeliveryOperations::replay).
    async fn replay_since(
        &self,
        topic: &str,
        subscriber: &str,
        since: DateTime<Utc>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Replayed, EventLogError>;

    /// Claims the endpoint changes not yet sent whose time has come (see
    /// [`EndpointChanges::claim_unsent`](super::EndpointChanges::claim_unsent)): `$1` now, `$2` the claim's end,
    /// `$3` how many, returning [`sql::changes::COLUMNS`].
    fn change_claim() -> &'static str;

    /// Writes `changes` (not empty) to the endpoints' history on
    /// `connection`, in the transaction [`Self::changes_appended`] began:
    /// row by row on SQLite, as arrays on PostgreSQL.
    async fn append_rows(
        connection: &mut <Self::Db as Database>::Connection,
        changes: &[NewChange],
    ) -> Result<(), EventLogError>;

    /// See [`super::EndpointStates::tally_endpoints`]: PostgreSQL tallies a
    /// batch in one statement, SQLite endpoint by endpoint.
    async fn tally_failures(
        &self,
        channel: &str,
        exhausted: &[Exhaustion<'_>],
        delivered: &[&str],
        disable_after: u32,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, EventLogError>;

    /// Keeps `attempts` (not empty); see
    /// [`super::EndpointStates::keep_webhook_attempts`].
    async fn write_webhook_attempts(
        &self,
        attempts: &[WebhookAttempt<'_>],
    ) -> Result<(), EventLogError>;

    /// The pool reads go to.
    fn reads(&self) -> &Pool<Self::Db>;

    /// The connection to write on: SQLite's one write connection, a
    /// PostgreSQL pool's next.
    async fn writer(&self) -> Result<Self::Writer<'_>, EventLogError>;

    /// A time the database kept, read from `column`.
    fn time_of(
        row: &<Self::Db as Database>::Row,
        column: &str,
    ) -> Result<DateTime<Utc>, EventLogError> {
        let kept: <Self::Db as Dialect>::Time = row.try_get(column).map_err(invalid)?;
        <Self::Db as Dialect>::at(kept)
            .ok_or_else(|| EventLogError::Invalid(format!("{column} is out of range")))
    }

    /// A time the database may have kept, read from `column`.
    fn optional_time_of(
        row: &<Self::Db as Database>::Row,
        column: &str,
    ) -> Result<Option<DateTime<Utc>>, EventLogError> {
        let kept: Option<<Self::Db as Dialect>::Time> = row.try_get(column).map_err(invalid)?;
        kept.map(|kept| {
            <Self::Db as Dialect>::at(kept)
                .ok_or_else(|| EventLogError::Invalid(format!("{column} is out of range")))
        })
        .transpose()
    }

    /// A count the log keeps as a non-negative integer, read from `column`.
    fn count_of(row: &<Self::Db as Database>::Row, column: &str) -> Result<u32, EventLogError> {
        let value: i32 = row.try_get(column).map_err(invalid)?;
        u32::try_from(value).map_err(|_| EventLogError::Invalid(format!("{column} {value}")))
    }

    /// An event from a row of the events' columns.
    fn event_of(row: &<Self::Db as Database>::Row) -> Result<LoggedEvent, EventLogError> {
        Ok(LoggedEvent {
            id: row.try_get("id").map_err(invalid)?,
            topic: row.try_get("topic").map_err(invalid)?,
            content_type: row.try_get("content_type").map_err(invalid)?,
            body: Bytes::from(row.try_get::<Vec<u8>, _>("body").map_err(invalid)?),
            created_at: Self::time_of(row, "created_at")?,
            original_id: row.try_get("original_id").map_err(invalid)?,
            trace_context: row.try_get("trace_context").map_err(invalid)?,
        })
    }

    /// A claimed record from a row of a claim.
    fn claimed_of(row: &<Self::Db as Database>::Row) -> Result<Claimed, EventLogError> {
        Ok(Claimed {
            event_id: row.try_get("event_id").map_err(invalid)?,
            topic: row.try_get("topic").map_err(invalid)?,
            subscriber: row.try_get("subscriber").map_err(invalid)?,
            retry_count: Self::count_of(row, "retry_count")?,
        })
    }

    /// A delivery record from a row of [`sql::DELIVERY`]'s columns.
    fn delivery_of(row: &<Self::Db as Database>::Row) -> Result<DeliveryRecord, EventLogError> {
        let processed_at = Self::optional_time_of(row, "processed_at")?;
        let next_attempt_at = Self::optional_time_of(row, "next_attempt_at")?;
        let outcome: Option<String> = row.try_get("outcome").map_err(invalid)?;
        Ok(DeliveryRecord {
            state: DeliveryState::of(
                processed_at.is_some(),
                next_attempt_at.is_some(),
                outcome.as_deref(),
            )?,
            event_id: row.try_get("event_id").map_err(invalid)?,
            subscriber: row.try_get("subscriber").map_err(invalid)?,
            processed_at,
            retry_count: Self::count_of(row, "retry_count")?,
            last_error: row.try_get("last_error").map_err(invalid)?,
            processing_since: Self::optional_time_of(row, "processing_since")?,
            next_attempt_at,
        })
    }

    /// An attempt from a row of [`sql::ATTEMPTS`]' columns.
    fn attempt_of(row: &<Self::Db as Database>::Row) -> Result<Attempt, EventLogError> {
        let status: Option<i16> = row.try_get("status").map_err(invalid)?;
        Ok(Attempt {
            at: Self::time_of(row, "attempted_at")?,
            duration_micros: row.try_get("duration_us").map_err(invalid)?,
            status: status.and_then(|status| u16::try_from(status).ok()),
            error: row.try_get("error").map_err(invalid)?,
            response: Bytes::from(row.try_get::<Vec<u8>, _>("response").map_err(invalid)?),
        })
    }

    /// An endpoint's state from a row of [`sql::operate::ENDPOINTS`]' columns.
    fn endpoint_of(row: &<Self::Db as Database>::Row) -> Result<EndpointRecord, EventLogError> {
        Ok(EndpointRecord {
            channel: row.try_get("channel").map_err(invalid)?,
            endpoint: row.try_get("endpoint").map_err(invalid)?,
            failures: Self::count_of(row, "failures")?,
            last_failure_at: Self::optional_time_of(row, "last_failure_at")?,
            last_error: row.try_get("last_error").map_err(invalid)?,
            disabled_at: Self::optional_time_of(row, "disabled_at")?,
            disabled_reason: row.try_get("disabled_reason").map_err(invalid)?,
        })
    }

    /// A listed record from a row of [`Self::listing`].
    fn summary_of(row: &<Self::Db as Database>::Row) -> Result<DeliverySummary, EventLogError> {
        let state: String = row.try_get("state").map_err(invalid)?;
        Ok(DeliverySummary {
            event_id: row.try_get("event_id").map_err(invalid)?,
            original_id: row.try_get("original_id").map_err(invalid)?,
            topic: row.try_get("topic").map_err(invalid)?,
            subscriber: row.try_get("subscriber").map_err(invalid)?,
            created_at: Self::time_of(row, "created_at")?,
            state: DeliveryState::parse(&state)
                .ok_or_else(|| EventLogError::Invalid(format!("delivery state {state:?}")))?,
            retry_count: Self::count_of(row, "retry_count")?,
            last_error: row.try_get("last_error").map_err(invalid)?,
            processed_at: Self::optional_time_of(row, "processed_at")?,
            next_attempt_at: Self::optional_time_of(row, "next_attempt_at")?,
        })
    }

    /// A change from a row of [`sql::changes::COLUMNS`].
    fn change_of(row: &<Self::Db as Database>::Row) -> Result<EndpointChange, EventLogError> {
        let state: String = row.try_get("state").map_err(invalid)?;
        let webhook_state: String = row.try_get("webhook_state").map_err(invalid)?;
        let failures: Option<i32> = row.try_get("failures").map_err(invalid)?;
        let retries: i32 = row.try_get("retry_count").map_err(invalid)?;
        Ok(EndpointChange {
            id: row.try_get("id").map_err(invalid)?,
            channel: row.try_get("channel").map_err(invalid)?,
            endpoint: row.try_get("endpoint").map_err(invalid)?,
            to: state_of(&state)?,
            at: Self::time_of(row, "at")?,
            failures: small_count(failures.map(i64::from))?,
            since: Self::optional_time_of(row, "since")?,
            reason: row.try_get("reason").map_err(invalid)?,
            source: row.try_get("source").map_err(invalid)?,
            webhook_state: webhook_state_of(&webhook_state)?,
            webhook_retries: small_count(Some(i64::from(retries)))?.unwrap_or_default(),
            webhook_error: row.try_get("last_error").map_err(invalid)?,
            delivered_at: Self::optional_time_of(row, "delivered_at")?,
        })
    }

    /// See [`super::EndpointStates::endpoints`].
    async fn endpoints_of(
        &self,
        channel: &str,
        limit: usize,
    ) -> Result<Vec<EndpointRecord>, EventLogError> {
        sqlx::query(sql::operate::ENDPOINTS)
            .bind(channel)
            .bind(bound(limit))
            .fetch_all(self.reads())
            .await?
            .iter()
            .map(Self::endpoint_of)
            .collect()
    }

    /// See [`super::EndpointStates::endpoint`].
    async fn endpoint_in(
        &self,
        channel: &str,
        endpoint: &str,
    ) -> Result<Option<EndpointRecord>, EventLogError> {
        sqlx::query(sql::operate::ENDPOINT)
            .bind(channel)
            .bind(endpoint)
            .fetch_optional(self.reads())
            .await?
            .as_ref()
            .map(Self::endpoint_of)
            .transpose()
    }

    /// See [`super::EndpointStates::set_endpoint_disabled`].
    async fn disable_endpoint(
        &self,
        channel: &str,
        endpoint: &str,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool, EventLogError> {
        let query = match reason {
            Some(reason) => sqlx::query(sql::operate::DISABLE)
                .bind(endpoint)
                .bind(Self::Db::time(now))
                .bind(reason)
                .bind(channel),
            None => sqlx::query(sql::operate::ENABLE)
                .bind(endpoint)
                .bind(channel),
        };
        let mut writer = self.writer().await?;
        let done = query.execute(&mut *writer).await?;
        Ok(Self::Db::affected(&done) > 0)
    }

    /// See [`super::EventIntake::event`].
    async fn logged_event(&self, id: Uuid) -> Result<Option<LoggedEvent>, EventLogError> {
        sqlx::query(sql::EVENT)
            .bind(id)
            .fetch_optional(self.reads())
            .await?
            .as_ref()
            .map(Self::event_of)
            .transpose()
    }

    /// See [`super::EventIntake::has_records`].
    async fn any_records(&self, event_id: Uuid) -> Result<bool, EventLogError> {
        let row = sqlx::query(sql::HAS_RECORDS)
            .bind(event_id)
            .fetch_one(self.reads())
            .await?;
        row.try_get(0usize).map_err(invalid)
    }

    /// See [`super::EventIntake::latest`].
    async fn latest_event(&self, topic: &str) -> Result<Option<LoggedEvent>, EventLogError> {
        sqlx::query(sql::LATEST)
            .bind(topic)
            .fetch_optional(self.reads())
            .await?
            .as_ref()
            .map(Self::event_of)
            .transpose()
    }

    /// The attempts `statement` selects for one delivery, oldest first.
    async fn attempts_by(
        &self,
        statement: &'static str,
        event_id: Uuid,
        subscriber: &str,
    ) -> Result<Vec<Attempt>, EventLogError> {
        sqlx::query(statement)
            .bind(event_id)
            .bind(subscriber)
            .fetch_all(self.reads())
            .await?
            .iter()
            .map(Self::attempt_of)
            .collect()
    }

    /// See [`super::DeliveryQueue::set_ordered`].
    async fn keep_ordered(
        &self,
        topic: &str,
        callback: &str,
        ordered: bool,
        now: DateTime<Utc>,
    ) -> Result<(), EventLogError> {
        let query = if ordered {
            sqlx::query(sql::ORDER)
                .bind(topic)
                .bind(callback)
                .bind(Self::Db::time(now))
        } else {
            sqlx::query(sql::UNORDER).bind(topic).bind(callback)
        };
        let mut writer = self.writer().await?;
        query.execute(&mut *writer).await?;
        Ok(())
    }

    /// See [`super::DeliveryQueue::ordered_subscriptions`].
    async fn ordered(&self, limit: usize) -> Result<Vec<OrderedSubscription>, EventLogError> {
        sqlx::query(sql::ORDERED_SUBSCRIPTIONS)
            .bind(bound(limit))
            .fetch_all(self.reads())
            .await?
            .iter()
            .map(|row| {
                Ok(OrderedSubscription {
                    topic: row.try_get("topic").map_err(invalid)?,
                    callback: row.try_get("callback").map_err(invalid)?,
                    since: Self::time_of(row, "since")?,
                })
            })
            .collect()
    }

    /// See [`super::DeliveryQueue::due_lanes`].
    async fn lanes_due(&self, limit: usize) -> Result<Vec<(String, DateTime<Utc>)>, EventLogError> {
        sqlx::query(Self::DUE_LANES)
            .bind(bound(limit))
            .fetch_all(self.reads())
            .await?
            .iter()
            .map(|row| {
                Ok((
                    row.try_get("lane").map_err(invalid)?,
                    Self::time_of(row, "due")?,
                ))
            })
            .collect()
    }

    /// See [`super::DeliveryQueue::drop_since`].
    async fn drop_records_since(
        &self,
        topic: &str,
        subscriber: &str,
        since: DateTime<Utc>,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        let mut writer = self.writer().await?;
        let done = sqlx::query(sql::DROP_SINCE)
            .bind(topic)
            .bind(subscriber)
            .bind(Self::Db::time(since))
            .bind(reason)
            .bind(Self::Db::time(now))
            .execute(&mut *writer)
            .await?;
        Ok(Self::Db::affected(&done))
    }

    /// See [`super::DeliveryQueue::release_endpoint`].
    async fn release_failing(
        &self,
        subscriber: &str,
        failing_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        let mut writer = self.writer().await?;
        let done = sqlx::query(Self::RELEASE_ENDPOINT)
            .bind(crate::delivery::websub::lane_of(subscriber))
            .bind(subscriber)
            .bind(Self::Db::time(now))
            .bind(Self::Db::time(failing_since))
            .execute(&mut *writer)
            .await?;
        Ok(Self::Db::affected(&done))
    }

    /// See [`super::EndpointStates::webhook_events_attempted_since`].
    async fn webhook_events_since(
        &self,
        subscriber: &str,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Uuid>, EventLogError> {
        sqlx::query(sql::WEBHOOK_EVENTS_SINCE)
            .bind(subscriber)
            .bind(Self::Db::time(since))
            .bind(bound(limit))
            .fetch_all(self.reads())
            .await?
            .iter()
            .map(|row| row.try_get(0usize).map_err(invalid))
            .collect()
    }

    /// See [`super::EndpointChanges::append_changes`]: `changes` and the
    /// trim of the history to [`MAX_CHANGES`], in one transaction.
    async fn changes_appended(&self, changes: &[NewChange]) -> Result<(), EventLogError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut writer = self.writer().await?;
        let mut tx = writer
            .begin_with(<Self::Db as Dialect>::BEGIN_WRITE)
            .await?;
        Self::append_rows(&mut tx, changes).await?;
        sqlx::query(sql::changes::TRIM)
            .bind(MAX_CHANGES)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// See [`super::EndpointChanges::list_changes`].
    async fn changes_listed(
        &self,
        filter: ChangeFilter<'_>,
        limit: usize,
    ) -> Result<Vec<EndpointChange>, EventLogError> {
        sqlx::query(AssertSqlSafe(endpoints::LIST.as_str()))
            .bind(filter.channel)
            .bind(filter.endpoint)
            .bind(bound(limit))
            .fetch_all(self.reads())
            .await?
            .iter()
            .map(Self::change_of)
            .collect()
    }

    /// See [`super::EndpointChanges::claim_unsent`].
    async fn changes_claimed(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<EndpointChange>, EventLogError> {
        let query = sqlx::query(AssertSqlSafe(Self::change_claim()))
            .bind(Self::Db::time(now))
            .bind(Self::Db::time(until))
            .bind(bound(limit));
        let mut writer = self.writer().await?;
        let mut claimed = query
            .fetch_all(&mut *writer)
            .await?
            .iter()
            .map(Self::change_of)
            .collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by_key(|change| change.id);
        Ok(claimed)
    }

    /// See [`super::EndpointChanges::settle_sent`].
    async fn changes_settled(&self, settled: &[(i64, Sent)]) -> Result<(), EventLogError> {
        if settled.is_empty() {
            return Ok(());
        }
        let mut writer = self.writer().await?;
        let mut tx = writer
            .begin_with(<Self::Db as Dialect>::BEGIN_WRITE)
            .await?;
        for (id, sent) in settled {
            let query = match sent {
                Sent::Delivered(at) => sqlx::query(sql::changes::DELIVERED)
                    .bind(id)
                    .bind(Self::Db::time(*at)),
                Sent::Retry {
                    error,
                    next_attempt_at,
                    counted,
                } => sqlx::query(sql::changes::RETRY)
                    .bind(id)
                    .bind(Self::Db::time(*next_attempt_at))
                    .bind(error.as_str())
                    .bind(i32::from(*counted)),
                Sent::Failed { error } => sqlx::query(sql::changes::FAILED)
                    .bind(id)
                    .bind(error.as_str()),
                Sent::Released => sqlx::query(sql::changes::RELEASED).bind(id),
            };
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// See [`super::EndpointChanges::shed_unsent`].
    async fn changes_shed(
        &self,
        keep: usize,
        older_than: DateTime<Utc>,
    ) -> Result<u64, EventLogError> {
        let query = sqlx::query(sql::changes::SHED)
            .bind(bound(keep))
            .bind(Self::Db::time(older_than));
        let mut writer = self.writer().await?;
        let shed = query.execute(&mut *writer).await?;
        Ok(Self::Db::affected(&shed))
    }

    /// See [`super::EndpointChanges::purge_changes_before`].
    async fn changes_purged(&self, cutoff: DateTime<Utc>) -> Result<u64, EventLogError> {
        let query = sqlx::query(sql::changes::PURGE).bind(Self::Db::time(cutoff));
        let mut writer = self.writer().await?;
        let purged = query.execute(&mut *writer).await?;
        Ok(Self::Db::affected(&purged))
    }
}
