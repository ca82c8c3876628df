//! The SQLite log's writes on the delivery path: records written claimed
//! or waiting as an event is expanded, lanes' claims, and outcomes. Each is
//! one script in one round trip to the write connection
//! ([`SqliteEventLog::run_script`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::query::Query;
use sqlx::sqlite::{Sqlite, SqliteArguments, SqliteRow};
use uuid::Uuid;

use super::super::{
    Claimed, Completion, EventLogError, Outcome, complete_unwritten_split, count, invalid,
    is_unique_violation, sorted_unique,
};
use super::rows::{
    attempts_json, completions_json, delivered_by_event_json, delivered_json,
    is_foreign_key_violation,
};
use super::statements::{
    CLAIM_LANES_SCRIPTS, CLAIM_ORDERED_SCRIPTS, COMPLETE_DELIVERED_SCRIPT, COMPLETE_SCRIPT,
    EXPAND_CLAIMED_AGAIN_SCRIPT, EXPAND_CLAIMED_FIRST_SCRIPT, EXPAND_ORDERED_SCRIPT,
    EXPAND_WAITING_SCRIPT, INSERT_DELIVERED_SCRIPT, LANES_PER_SCRIPT,
};
use super::{EXPAND_CHUNK, SqlEventLog, SqliteEventLog, event_must_exist, json_chunks};

pub(super) async fn expand_claimed(
    log: &SqliteEventLog,
    event_id: Uuid,
    subscribers: &[&str],
    now: DateTime<Utc>,
) -> Result<Vec<String>, EventLogError> {
    let subscribers = sorted_unique(subscribers.iter().copied());
    let mut created = Vec::with_capacity(subscribers.len());
    for (part, json) in subscribers
        .chunks(EXPAND_CHUNK)
        .zip(json_chunks(&subscribers)?)
    {
        let written = |script: &'static str| {
            sqlx::query(script)
                .bind(event_id)
                .bind(now.timestamp_micros())
                .bind(json.clone())
        };
        match log
            .run_script(written(EXPAND_CLAIMED_FIRST_SCRIPT.as_str()))
            .await
        {
            Ok(_) => created.extend(part.iter().map(|subscriber| (*subscriber).to_owned())),
            Err(error) if is_unique_violation(&error) => {
                let again = written(EXPAND_CLAIMED_AGAIN_SCRIPT.as_str());
                for row in run_for_event(log, again, event_id).await? {
                    created.push(row.try_get("subscriber").map_err(invalid)?);
                }
            }
            Err(error) => return Err(unknown_event(log, error, event_id).await),
        }
    }
    if subscribers.is_empty() {
        event_must_exist(&log.pool, event_id).await?;
    }
    Ok(created)
}

pub(super) async fn expand_waiting(
    log: &SqliteEventLog,
    event_id: Uuid,
    subscribers: &[&str],
    due: DateTime<Utc>,
    ordered: bool,
) -> Result<u64, EventLogError> {
    let subscribers = sorted_unique(subscribers.iter().copied());
    let script = if ordered {
        EXPAND_ORDERED_SCRIPT.as_str()
    } else {
        EXPAND_WAITING_SCRIPT.as_str()
    };
    let mut created = 0;
    for json in json_chunks(&subscribers)? {
        let query = sqlx::query(script)
            .bind(event_id)
            .bind(due.timestamp_micros())
            .bind(json);
        for row in run_for_event(log, query, event_id).await? {
            created += count(row.try_get("created").map_err(invalid)?)?;
        }
    }
    if subscribers.is_empty() {
        event_must_exist(&log.pool, event_id).await?;
    }
    Ok(created)
}

pub(super) async fn claim_lanes(
    log: &SqliteEventLog,
    lanes: &[(&str, usize)],
    now: DateTime<Utc>,
    visibility: Duration,
) -> Result<Vec<Claimed>, EventLogError> {
    let lanes: Vec<(Option<&str>, i64)> = lanes
        .iter()
        .filter(|(_, count)| *count > 0)
        .map(|(lane, count)| (Some(*lane), i64::try_from(*count).unwrap_or(i64::MAX)))
        .collect();
    let (now, stale) = claim_times(now, visibility);
    claim_in_scripts(
        log,
        &CLAIM_LANES_SCRIPTS,
        &lanes,
        (None, 0),
        |query, (lane, count)| query.bind(now).bind(lane).bind(now).bind(stale).bind(count),
    )
    .await
}

pub(super) async fn claim_ordered(
    log: &SqliteEventLog,
    lanes: &[&str],
    now: DateTime<Utc>,
    visibility: Duration,
) -> Result<Vec<Claimed>, EventLogError> {
    let lanes: Vec<Option<&str>> = lanes.iter().copied().map(Some).collect();
    let (now, stale) = claim_times(now, visibility);
    claim_in_scripts(log, &CLAIM_ORDERED_SCRIPTS, &lanes, None, |query, lane| {
        query.bind(now).bind(lane).bind(now).bind(stale)
    })
    .await
}

pub(super) async fn complete(
    log: &SqliteEventLog,
    completions: &[Completion],
    now: DateTime<Utc>,
) -> Result<(), EventLogError> {
    if completions.is_empty() {
        return Ok(());
    }
    // Deliveries through their own statement, each with the attempt its
    // record keeps; every other outcome through the general one, its
    // attempt a row.
    let (delivered, others): (Vec<&Completion>, Vec<&Completion>) = completions
        .iter()
        .partition(|completion| completion.outcome == Outcome::Delivered);
    let delivered = if delivered.is_empty() {
        None
    } else {
        Some(delivered_json(&delivered)?)
    };
    let (others, attempts) = if others.is_empty() {
        (None, None)
    } else {
        (Some(completions_json(&others)?), attempts_json(&others)?)
    };
    let now = now.timestamp_micros();
    let query = match (others, attempts) {
        (None, _) => sqlx::query(COMPLETE_DELIVERED_SCRIPT.as_str())
            .bind(now)
            .bind(delivered),
        (others, attempts) => sqlx::query(COMPLETE_SCRIPT.as_str())
            .bind(now)
            .bind(delivered.unwrap_or_else(|| "[]".to_owned()))
            .bind(now)
            .bind(others)
            .bind(attempts.unwrap_or_else(|| "[]".to_owned())),
    };
    log.run_script(query).await?;
    Ok(())
}

pub(super) async fn complete_unwritten(
    log: &SqliteEventLog,
    completions: &[Completion],
    now: DateTime<Utc>,
) -> Result<(), EventLogError> {
    complete_unwritten_split(log, completions, now, |delivered| async move {
        let query = sqlx::query(INSERT_DELIVERED_SCRIPT.as_str())
            .bind(now.timestamp_micros())
            .bind(delivered_by_event_json(&delivered)?);
        log.run_script(query).await?;
        Ok(())
    })
    .await
}

/// A claim's now and stale bound, in µs: the bound is `None` when the
/// visibility timeout reaches before the epoch (then no claim is stale).
pub(super) fn claim_times(now: DateTime<Utc>, visibility: Duration) -> (i64, Option<i64>) {
    let stale = super::super::stale_bound(now, visibility).map(|bound| bound.timestamp_micros());
    (now.timestamp_micros(), stale)
}

/// Claims `lanes` in chunks of at most the largest of [`LANES_PER_SCRIPT`],
/// each with the script of its size (from `scripts`, one per size) and
/// padded up to it with `nothing`, which claims nothing; `bind` gives a
/// lane's values to its claim.
async fn claim_in_scripts<'q, T: Copy + 'q>(
    log: &SqliteEventLog,
    scripts: &'static [String],
    lanes: &[T],
    nothing: T,
    bind: impl Fn(Query<'q, Sqlite, SqliteArguments>, T) -> Query<'q, Sqlite, SqliteArguments>,
) -> Result<Vec<Claimed>, EventLogError> {
    let most = LANES_PER_SCRIPT[LANES_PER_SCRIPT.len() - 1];
    let mut claimed = Vec::new();
    for chunk in lanes.chunks(most) {
        let size = LANES_PER_SCRIPT
            .iter()
            .position(|size| *size >= chunk.len())
            .unwrap_or(LANES_PER_SCRIPT.len() - 1);
        let padding = std::iter::repeat_n(nothing, LANES_PER_SCRIPT[size] - chunk.len());
        let query = chunk
            .iter()
            .copied()
            .chain(padding)
            .fold(sqlx::query(scripts[size].as_str()), &bind);
        for row in log.run_script(query).await? {
            claimed.push(SqliteEventLog::claimed_of(&row)?);
        }
    }
    Ok(claimed)
}

/// Runs `script`, which writes records of `event_id`, telling a missing
/// event apart.
async fn run_for_event(
    log: &SqliteEventLog,
    script: Query<'_, Sqlite, SqliteArguments>,
    event_id: Uuid,
) -> Result<Vec<SqliteRow>, EventLogError> {
    match log.run_script(script).await {
        Ok(rows) => Ok(rows),
        Err(error) => Err(unknown_event(log, error, event_id).await),
    }
}

/// `error`, from writing records of `event_id`: a missing event is
/// [`EventLogError::UnknownEvent`] rather than a foreign-key failure.
async fn unknown_event(log: &SqliteEventLog, error: sqlx::Error, event_id: Uuid) -> EventLogError {
    if is_foreign_key_violation(&error)
        && matches!(
            event_must_exist(&log.pool, event_id).await,
            Err(EventLogError::UnknownEvent(_))
        )
    {
        EventLogError::UnknownEvent(event_id)
    } else {
        error.into()
    }
}
