//! The PostgreSQL log's writes on the delivery path: records written
//! claimed or waiting as an event is expanded, lanes' claims, and
//! outcomes, each one statement on the pool.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::super::is_unique_violation;
use super::super::{
    Claimed, Completion, EventLogError, ExpansionClaim, complete_unwritten_split, sorted_unique,
    stale_bound,
};
use super::SqlEventLog;
use super::rows::{CompletionColumns, missing_event};
use super::statements::{
    CLAIM_LANES, CLAIM_ORDERED, COMPLETE, EVENT_EXISTS, EXPAND_AGAIN, EXPAND_CLAIMED_AGAIN,
    EXPAND_CLAIMED_FIRST, EXPAND_ORDERED, INSERT_DELIVERED, TAKE_EXPANSION,
};
use super::{EXPAND_CHUNK, PostgresEventLog};

pub(super) async fn expand_claimed(
    log: &PostgresEventLog,
    event_id: Uuid,
    subscribers: &[&str],
    now: DateTime<Utc>,
) -> Result<Vec<String>, EventLogError> {
    let subscribers = sorted_unique(subscribers.iter().copied());
    if subscribers.is_empty() {
        event_must_exist(log, event_id).await?;
        return Ok(Vec::new());
    }
    let mut created = Vec::with_capacity(subscribers.len());
    for chunk in subscribers.chunks(EXPAND_CHUNK) {
        // The insert's statement trigger fails it when the event is gone.
        let first = sqlx::query(EXPAND_CLAIMED_FIRST)
            .bind(event_id)
            .bind(now)
            .bind(chunk)
            .bind(log.replica)
            .execute(&log.pool)
            .await;
        match first {
            Ok(_) => created.extend(chunk.iter().map(|subscriber| (*subscriber).to_owned())),
            Err(error) if is_unique_violation(&error) => {
                let rows: Vec<String> = sqlx::query_scalar(EXPAND_CLAIMED_AGAIN)
                    .bind(event_id)
                    .bind(now)
                    .bind(chunk)
                    .bind(log.replica)
                    .fetch_all(&log.pool)
                    .await
                    .map_err(|error| missing_event(error, event_id))?;
                created.extend(rows);
            }
            Err(error) => return Err(missing_event(error, event_id)),
        }
    }
    Ok(created)
}

pub(super) async fn expand_waiting(
    log: &PostgresEventLog,
    event_id: Uuid,
    subscribers: &[&str],
    due: DateTime<Utc>,
    ordered: bool,
) -> Result<u64, EventLogError> {
    let subscribers = sorted_unique(subscribers.iter().copied());
    if subscribers.is_empty() {
        event_must_exist(log, event_id).await?;
        return Ok(0);
    }
    let statement = if ordered {
        EXPAND_ORDERED
    } else {
        EXPAND_AGAIN
    };
    let mut created = 0;
    for chunk in subscribers.chunks(EXPAND_CHUNK) {
        // The insert's statement trigger fails it when the event is gone.
        created += sqlx::query(statement)
            .bind(event_id)
            .bind(due)
            .bind(chunk)
            .execute(&log.pool)
            .await
            .map_err(|error| missing_event(error, event_id))?
            .rows_affected();
    }
    Ok(created)
}

pub(super) async fn claim_lanes(
    log: &PostgresEventLog,
    lanes: &[(&str, usize)],
    now: DateTime<Utc>,
    visibility: Duration,
) -> Result<Vec<Claimed>, EventLogError> {
    let (names, counts): (Vec<&str>, Vec<i64>) = lanes
        .iter()
        .filter(|(_, count)| *count > 0)
        .map(|(lane, count)| (*lane, i64::try_from(*count).unwrap_or(i64::MAX)))
        .unzip();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query(CLAIM_LANES)
        .bind(now)
        .bind(stale_bound(now, visibility))
        .bind(names)
        .bind(counts)
        .bind(log.replica)
        .fetch_all(&log.pool)
        .await?
        .iter()
        .map(PostgresEventLog::claimed_of)
        .collect()
}

pub(super) async fn claim_ordered(
    log: &PostgresEventLog,
    lanes: &[&str],
    now: DateTime<Utc>,
    visibility: Duration,
) -> Result<Vec<Claimed>, EventLogError> {
    let stale = stale_bound(now, visibility);
    let mut claimed = Vec::new();
    // A statement of its own per lane: one head locked at a time, so
    // claimers of several lanes never wait on each other in a circle.
    for lane in lanes {
        if let Some(row) = sqlx::query(CLAIM_ORDERED)
            .bind(now)
            .bind(stale)
            .bind(*lane)
            .bind(log.replica)
            .fetch_optional(&log.pool)
            .await?
        {
            claimed.push(PostgresEventLog::claimed_of(&row)?);
        }
    }
    Ok(claimed)
}

pub(super) async fn complete(
    log: &PostgresEventLog,
    completions: &[Completion],
    now: DateTime<Utc>,
) -> Result<(), EventLogError> {
    if completions.is_empty() {
        return Ok(());
    }
    let columns = CompletionColumns::new(completions);
    sqlx::query(COMPLETE)
        .bind(&columns.event_ids)
        .bind(&columns.subscribers)
        .bind(&columns.kinds)
        .bind(&columns.errors)
        .bind(&columns.next_attempts)
        .bind(now)
        .bind(&columns.attempted_ats)
        .bind(&columns.durations)
        .bind(&columns.statuses)
        .bind(&columns.responses)
        .execute(&log.pool)
        .await?;
    Ok(())
}

/// Records held until their first outcome: the delivered ones inserted
/// closed, a row write each; the others written claimed, then completed.
pub(super) async fn complete_unwritten(
    log: &PostgresEventLog,
    completions: &[Completion],
    now: DateTime<Utc>,
) -> Result<(), EventLogError> {
    complete_unwritten_split(log, completions, now, |delivered| async move {
        let columns = CompletionColumns::new(delivered);
        sqlx::query(INSERT_DELIVERED)
            .bind(now)
            .bind(&columns.event_ids)
            .bind(&columns.subscribers)
            .bind(&columns.attempted_ats)
            .bind(&columns.durations)
            .bind(&columns.statuses)
            .bind(&columns.responses)
            .execute(&log.pool)
            .await?;
        Ok(())
    })
    .await
}

/// Takes `event_id`'s expansion for this replica, unless another live
/// replica has it.
pub(super) async fn take_expansion(
    log: &PostgresEventLog,
    event_id: Uuid,
) -> Result<ExpansionClaim, EventLogError> {
    let (mine, written): (bool, bool) = sqlx::query_as(TAKE_EXPANSION)
        .bind(event_id)
        .bind(log.replica)
        .fetch_one(&log.pool)
        .await?;
    Ok(if mine {
        ExpansionClaim::Taken { afresh: !written }
    } else {
        ExpansionClaim::Elsewhere
    })
}

/// An expansion with no subscribers writes nothing, so no trigger finds
/// its event missing: it looks.
async fn event_must_exist(log: &PostgresEventLog, event_id: Uuid) -> Result<(), EventLogError> {
    let exists: bool = sqlx::query_scalar(EVENT_EXISTS)
        .bind(event_id)
        .fetch_one(&log.pool)
        .await?;
    if exists {
        Ok(())
    } else {
        Err(EventLogError::UnknownEvent(event_id))
    }
}
