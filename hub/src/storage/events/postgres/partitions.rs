//! The partitions of the event log, its delivery records and their
//! attempts (migration `0016_partitions.sql`): created ahead of the clock,
//! and dropped whole by retention once every event in them is older than
//! the cutoff.
//!
//! A partition covers a range of event ids, which are UUIDv7: the range
//! from millisecond `a` to millisecond `b` holds the events recorded in
//! that time, and the three tables each have a partition of it, named
//! alike. Replicas sharing the database take turns through an advisory
//! lock; one that finds it taken leaves the work to the other.
//!
//! Creating or dropping a partition locks its parent table for a moment.
//! Each one is a statement of its own, holding no other lock while it
//! waits: the delivery path takes the three tables' locks in more than one
//! order (an expansion inserts records, whose trigger then locks their
//! events; a purge deletes events, whose trigger then deletes records), so
//! a transaction holding one parent while waiting for another would
//! deadlock with it. Each waits at most [`LOCK_TIMEOUT`], so that upkeep
//! never holds deliveries up for long; what it could not do is done at the
//! next sweep, well before it is needed. Ranges are made ahead of any
//! event in them, the records' and attempts' partitions first; they are
//! dropped attempts and records first, then the events, so that a sweep
//! cut short leaves at worst events without records, which the next sweep
//! finds and drops.

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection, Row};
use uuid::Uuid;

use super::PostgresEventLog;
use crate::storage::events::EventLogError;

/// Spans of time the partitions ahead of the clock cover, besides the
/// current one.
const AHEAD: i64 = 4;

/// How long creating or dropping a partition waits for its table's lock:
/// statements that wait for a lock behind it wait no longer than this.
const LOCK_TIMEOUT: &str = "SET lock_timeout = '200ms'";

/// The advisory lock upkeep is serialised on, across replicas: held by a
/// connection of upkeep's own, for as long as it lives. One per schema, as
/// the tables are.
const UPKEEP_LOCK: &str = "SELECT pg_try_advisory_lock(1935831154, hashtext(current_schema()))";

/// Lets the lock go at once: a closed connection's server process lets it
/// go only as it exits, a moment after the close.
const UPKEEP_UNLOCK: &str = "SELECT pg_advisory_unlock(1935831154, hashtext(current_schema()))";

/// The partitioned tables, in the order their partitions of a range are
/// made (and the reverse of the order they are dropped in); each partition
/// is named after its events'.
const TABLES: [&str; 3] = ["websub_attempts", "websub_deliveries", "websub_events"];

/// The partitions of `websub_events` with their bounds.
const RANGES: &str = "SELECT c.relname::TEXT AS name, \
         pg_get_expr(c.relpartbound, c.oid) AS bound \
     FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid \
     WHERE i.inhparent = 'websub_events'::regclass";

/// One range partition of the three tables.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Range {
    /// Its name in `websub_events`; the other tables' are the same with
    /// their own prefix.
    name: String,
    /// The first millisecond past it.
    to_ms: i64,
}

impl Range {
    fn in_table(&self, table: &str) -> String {
        format!(
            "{table}{}",
            self.name
                .strip_prefix("websub_events")
                .unwrap_or(&self.name)
        )
    }
}

/// The smallest UUIDv7 of millisecond `ms`: every id recorded in it or
/// later is at least this.
fn id_floor(ms: i64) -> Uuid {
    Uuid::from_u128((u128::from(ms.max(0).unsigned_abs()) & ((1 << 48) - 1)) << 80)
}

/// The millisecond of a UUIDv7 written as text.
fn ms_of(id: &str) -> Option<i64> {
    let hex: String = id.chars().filter(|c| *c != '-').take(12).collect();
    i64::from_str_radix(&hex, 16).ok()
}

/// A partition bound as `pg_get_expr` writes it: `FOR VALUES FROM
/// (MINVALUE) TO ('…')`, `FOR VALUES FROM ('…') TO ('…')`, or `DEFAULT`.
fn parse_bound(name: String, bound: &str) -> Option<Range> {
    let (_, to) = bound
        .strip_prefix("FOR VALUES FROM (")?
        .split_once(") TO (")?;
    let to = to.strip_suffix(')')?.trim_matches('\'');
    Some(Range {
        name,
        to_ms: ms_of(to)?,
    })
}

async fn ranges(connection: &mut PgConnection) -> Result<Vec<Range>, EventLogError> {
    let rows = sqlx::query(RANGES).fetch_all(&mut *connection).await?;
    let mut ranges = Vec::with_capacity(rows.len());
    for row in rows {
        let name: String = row.try_get("name")?;
        let bound: String = row.try_get("bound")?;
        if let Some(range) = parse_bound(name, &bound) {
            ranges.push(range);
        }
    }
    Ok(ranges)
}

/// A connection of upkeep's own, with the advisory lock and the lock
/// timeout: closed when dropped, and the lock with it. `None` when another
/// replica holds the lock.
async fn upkeep_connection(log: &PostgresEventLog) -> Result<Option<PgConnection>, EventLogError> {
    let mut connection = log.pool.connect_options().connect().await?;
    let locked: bool = sqlx::query_scalar(UPKEEP_LOCK)
        .fetch_one(&mut connection)
        .await?;
    if !locked {
        return Ok(None);
    }
    sqlx::query(LOCK_TIMEOUT).execute(&mut connection).await?;
    Ok(Some(connection))
}

/// Whether a statement gave way to the queries holding its table (its
/// lock timed out): the sweep stops there and the next one goes on.
fn gave_way(
    result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>,
) -> Result<bool, EventLogError> {
    match result {
        Ok(_) => Ok(false),
        Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("55P03") => Ok(true),
        Err(error) => Err(error.into()),
    }
}

/// Lets the lock go and closes the connection; a failure leaves both to
/// the server, which ends them with the connection.
async fn finish(mut connection: PgConnection) {
    let _ = sqlx::query(UPKEEP_UNLOCK).execute(&mut connection).await;
    let _ = connection.close().await;
}

/// See [`LogUpkeep::partition_ahead`](crate::storage::events::LogUpkeep::partition_ahead).
pub(super) async fn partition_ahead(
    log: &PostgresEventLog,
    span: std::time::Duration,
    now: DateTime<Utc>,
) -> Result<u64, EventLogError> {
    let span_ms = i64::try_from(span.as_millis()).unwrap_or(i64::MAX).max(1);
    let now_ms = now.timestamp_millis();
    let current = now_ms - now_ms.rem_euclid(span_ms);
    let until = current.saturating_add(span_ms.saturating_mul(AHEAD + 1));
    let Some(mut connection) = upkeep_connection(log).await? else {
        return Ok(0);
    };
    let covered = ranges(&mut connection)
        .await?
        .iter()
        .map(|range| range.to_ms)
        .max();
    let mut from = covered.map_or(current, |covered| covered.max(current));
    let mut created = 0;
    while from < until {
        // The first may be short, to meet the grid the others are on.
        let to = from - from.rem_euclid(span_ms) + span_ms;
        if let Some(newest) = newest_in_default(&mut connection, from, to).await? {
            // Ids of the range are in the DEFAULT partition already
            // (recorded before upkeep ran): they stay there, deleted by age,
            // and the partition starts past them.
            from = newest + 1;
            continue;
        }
        let range = Range {
            name: format!("websub_events_p{from}"),
            to_ms: to,
        };
        for table in TABLES {
            let storage = if table == "websub_deliveries" {
                // As the table was made (0001): room on each page for a
                // claim's new row version.
                " WITH (fillfactor = 50)"
            } else {
                ""
            };
            // IF NOT EXISTS: the same range of a sweep cut short.
            let made = sqlx::query(AssertSqlSafe(format!(
                "CREATE TABLE IF NOT EXISTS {} PARTITION OF {table} \
                 FOR VALUES FROM ('{}') TO ('{}'){storage}",
                range.in_table(table),
                id_floor(from),
                id_floor(to),
            )))
            .execute(&mut connection)
            .await;
            if gave_way(made)? {
                finish(connection).await;
                return Ok(created);
            }
        }
        created += 1;
        from = to;
    }
    finish(connection).await;
    Ok(created)
}

/// The millisecond of the newest id from `from` to `to` that the DEFAULT
/// partitions hold, if any.
async fn newest_in_default(
    connection: &mut PgConnection,
    from: i64,
    to: i64,
) -> Result<Option<i64>, EventLogError> {
    let newest: Option<Uuid> = sqlx::query_scalar(
        "SELECT greatest( \
             (SELECT id FROM websub_events_default \
              WHERE id >= $1 AND id < $2 ORDER BY id DESC LIMIT 1), \
             (SELECT event_id FROM websub_deliveries_default \
              WHERE event_id >= $1 AND event_id < $2 ORDER BY event_id DESC LIMIT 1), \
             (SELECT event_id FROM websub_attempts_default \
              WHERE event_id >= $1 AND event_id < $2 ORDER BY event_id DESC LIMIT 1))",
    )
    .bind(id_floor(from))
    .bind(id_floor(to))
    .fetch_one(&mut *connection)
    .await?;
    Ok(newest.and_then(|id| ms_of(&id.to_string())))
}

/// Drops the partitions whose range ends at or before `cutoff` and whose
/// events were all recorded before it, with their records and attempts.
/// Returns how many events went with them.
pub(super) async fn drop_before(
    log: &PostgresEventLog,
    cutoff: DateTime<Utc>,
) -> Result<u64, EventLogError> {
    let cutoff_ms = cutoff.timestamp_millis();
    let Some(mut connection) = upkeep_connection(log).await? else {
        return Ok(0);
    };
    let mut dropped = 0;
    for range in ranges(&mut connection).await? {
        if range.to_ms > cutoff_ms {
            continue;
        }
        // An id is the time it was recorded; `created_at` is the time the
        // caller said. They agree but in tests and imports, where the
        // cutoff is the caller's time: a partition holding a newer event
        // is left to the row deletes.
        let (newest, events): (Option<DateTime<Utc>>, i64) = sqlx::query_as(AssertSqlSafe(
            format!("SELECT max(created_at), count(*) FROM {}", range.name),
        ))
        .fetch_one(&mut connection)
        .await?;
        if newest.is_some_and(|newest| newest >= cutoff) {
            continue;
        }
        for table in TABLES {
            let gone = sqlx::query(AssertSqlSafe(format!(
                "DROP TABLE IF EXISTS {}",
                range.in_table(table)
            )))
            .execute(&mut connection)
            .await;
            if gave_way(gone)? {
                finish(connection).await;
                return Ok(dropped);
            }
        }
        dropped += u64::try_from(events).unwrap_or(0);
    }
    finish(connection).await;
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_floor_is_the_first_uuid_v7_of_its_millisecond() {
        let ms = 1_733_400_000_123;
        let floor = id_floor(ms);
        assert_eq!(ms_of(&floor.to_string()), Some(ms));
        let timestamp = uuid::Timestamp::from_unix(uuid::NoContext, 1_733_400_000, 123_000_000);
        let id = Uuid::new_v7(timestamp);
        assert!(id >= floor && id < id_floor(ms + 1));
    }

    #[test]
    fn bounds_are_read_as_postgresql_writes_them() {
        let low = id_floor(1_000);
        let high = id_floor(2_000);
        assert_eq!(
            parse_bound(
                "websub_events_p1000".to_owned(),
                &format!("FOR VALUES FROM ('{low}') TO ('{high}')")
            ),
            Some(Range {
                name: "websub_events_p1000".to_owned(),
                to_ms: 2_000,
            })
        );
        let legacy = parse_bound(
            "websub_events_legacy".to_owned(),
            &format!("FOR VALUES FROM (MINVALUE) TO ('{high}')"),
        )
        .expect("the legacy range");
        assert_eq!(legacy.to_ms, 2_000);
        assert_eq!(legacy.in_table("websub_attempts"), "websub_attempts_legacy");
        assert_eq!(
            parse_bound("websub_events_default".to_owned(), "DEFAULT"),
            None
        );
    }
}
