//! The SQLite event log's statements, apart from the code that runs
//! them; each says why it is written as it is.

pub(super) use super::super::sql::*;

use std::sync::LazyLock;

/// The SQL spelling of `websub_hub::delivery::websub::lane_of` for the subscriber
/// `$subscriber` (a column or a value): the authority after `://` without
/// its user info, or the whole subscriber when it is no URL. Every statement
/// that inserts a record writes its lane with it, once.
macro_rules! lane_of {
    ($subscriber:literal) => {
        concat!(
            "CASE WHEN instr(",
            $subscriber,
            ", '://') = 0 THEN ",
            $subscriber,
            " ELSE substr(",
            $crate::storage::events::sqlite::statements::authority_of!($subscriber),
            ", instr(",
            $crate::storage::events::sqlite::statements::authority_of!($subscriber),
            ", '@') + 1) END"
        )
    };
}

/// What follows `://` in `$subscriber` up to its path, query or fragment:
/// user info included, which [`lane_of`] strips.
macro_rules! authority_of {
    ($subscriber:literal) => {
        concat!(
            "substr(",
            $crate::storage::events::sqlite::statements::after_scheme!($subscriber),
            ", 1, instr(replace(replace(",
            $crate::storage::events::sqlite::statements::after_scheme!($subscriber),
            ", '?', '/'), '#', '/') || '/', '/') - 1)"
        )
    };
}
pub(super) use authority_of;

/// What follows `://` in `$subscriber`.
macro_rules! after_scheme {
    ($subscriber:literal) => {
        concat!(
            "substr(",
            $subscriber,
            ", instr(",
            $subscriber,
            ", '://') + 3)"
        )
    };
}
pub(super) use after_scheme;

/// `statements` as one transaction, sent in one round trip (see
/// `SqliteEventLog::run_script`): the write lock is taken at `BEGIN
/// IMMEDIATE`, so that no statement meets a snapshot another write made
/// stale.
///
/// Statements that share a script take their parameters by position (`?`),
/// each the next of the script's values in the order written: sqlx binds a
/// numbered parameter (`$3`) to the script's value of that number, and
/// numbers missing from a statement shift the values it gives by position
/// to the statements after. The one statement of a script with values may
/// number them.
pub(super) fn script(statements: &[&str]) -> String {
    format!("BEGIN IMMEDIATE; {}; COMMIT", statements.join("; "))
}

/// How many lanes a claim's script serves, the last of a claim's chunks
/// padded up to the next size: a few scripts, each prepared once.
pub(super) const LANES_PER_SCRIPT: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// A [`script`] of `claim`, the claim of one lane, for each size of
/// [`LANES_PER_SCRIPT`].
fn lanes_scripts(claim: &str) -> Vec<String> {
    LANES_PER_SCRIPT
        .iter()
        .map(|lanes| script(&vec![claim; *lanes]))
        .collect()
}

/// [`EXPAND_CLAIMED_FIRST`], alone in its transaction.
pub(super) static EXPAND_CLAIMED_FIRST_SCRIPT: LazyLock<String> =
    LazyLock::new(|| script(&[EXPAND_CLAIMED_FIRST]));

/// [`EXPAND_CLAIMED_AGAIN`], alone in its transaction.
pub(super) static EXPAND_CLAIMED_AGAIN_SCRIPT: LazyLock<String> =
    LazyLock::new(|| script(&[EXPAND_CLAIMED_AGAIN]));

/// [`EXPAND`] in its transaction: records that wait for their lane. Its
/// one row is how many it created.
pub(super) static EXPAND_WAITING_SCRIPT: LazyLock<String> =
    LazyLock::new(|| script(&[EXPAND, CREATED]));

/// [`EXPAND_ORDERED`] in its transaction; its one row is how many it created.
pub(super) static EXPAND_ORDERED_SCRIPT: LazyLock<String> =
    LazyLock::new(|| script(&[EXPAND_ORDERED, CREATED]));

/// How many rows the statement before wrote. A script's statements count
/// as one execution, whose total would count each of them again at every
/// statement after it (SQLite's count of changes stays until the next
/// write).
const CREATED: &str = "SELECT changes() AS created";

/// [`CLAIM_LANE`] for as many lanes as each size of [`LANES_PER_SCRIPT`].
pub(super) static CLAIM_LANES_SCRIPTS: LazyLock<Vec<String>> =
    LazyLock::new(|| lanes_scripts(CLAIM_LANE));

/// [`CLAIM_ORDERED`] for as many lanes as each size of [`LANES_PER_SCRIPT`].
pub(super) static CLAIM_ORDERED_SCRIPTS: LazyLock<Vec<String>> =
    LazyLock::new(|| lanes_scripts(CLAIM_ORDERED));

/// Outcomes that are all deliveries.
pub(super) static COMPLETE_DELIVERED_SCRIPT: LazyLock<String> =
    LazyLock::new(|| script(&[COMPLETE_DELIVERED]));

/// First outcomes of records not written before, all deliveries.
pub(super) static INSERT_DELIVERED_SCRIPT: LazyLock<String> =
    LazyLock::new(|| script(&[INSERT_DELIVERED]));

/// Any outcomes: the deliveries ([`COMPLETE_DELIVERED`]), the others
/// ([`COMPLETE`]) and their attempts ([`RECORD_ATTEMPTS`]), each `[]` when
/// there is none.
pub(super) static COMPLETE_SCRIPT: LazyLock<String> =
    LazyLock::new(|| script(&[COMPLETE_DELIVERED, COMPLETE, RECORD_ATTEMPTS]));

// One process expands every event (PostgreSQL's replicas leave out each
// other's: UNEXPANDED_FREE there).
pub(super) const UNEXPANDED: &str = "SELECT id, topic, content_type, body, created_at, original_id, trace_context FROM websub_events \
     WHERE expanded_at IS NULL ORDER BY created_at, id LIMIT $1";

pub(super) const MARK_EXPANDED: &str =
    "UPDATE websub_events SET expanded_at = COALESCE(expanded_at, $2) WHERE id = $1";

// `WHERE true` is SQLite's required disambiguation between an upsert's ON and
// a join's ON after INSERT … SELECT. `$1` is the event, `$2` when the
// records are due, `$3` the subscribers as JSON.
pub(super) const EXPAND: &str = concat!(
    "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at, lane) \
     SELECT $1, value, $2, ",
    lane_of!("value"),
    " FROM json_each($3) WHERE true ON CONFLICT DO NOTHING"
);

// Records claimed for their first attempt as they are written: `$1` the
// event, `$2` now (due and claimed), `$3` the subscribers as JSON. The
// first try has no ON CONFLICT: nothing conflicts unless the event is
// being (or was) expanded elsewhere, and then every row went in and none
// need be read back. On a conflict the script is rolled back and
// EXPAND_CLAIMED_AGAIN runs; its RETURNING reports only the rows it
// inserted, not those it skipped.
macro_rules! expand_claimed {
    ($tail:literal) => {
        concat!(
            "INSERT INTO websub_deliveries \
             (event_id, subscriber, next_attempt_at, processing_since, lane) \
             SELECT $1, value, $2, $2, ",
            lane_of!("value"),
            " FROM json_each($3)",
            $tail
        )
    };
}

pub(super) const EXPAND_CLAIMED_FIRST: &str = expand_claimed!("");

pub(super) const EXPAND_CLAIMED_AGAIN: &str =
    expand_claimed!(" WHERE true ON CONFLICT DO NOTHING RETURNING subscriber");

// Records written only now, delivered at their first attempt: one insert
// each, with the outcome and the attempt its record keeps, as
// COMPLETE_DELIVERED would leave it. Its values: now, and the records
// grouped by event (`rows::delivered_by_event_json`), so that an event's id
// is decoded and checked once, not once a record: an event purged
// meanwhile is skipped. A processed record needs no lane (it leaves the
// lane indexes). One that exists meanwhile (an operator's resend) is
// completed as COMPLETE_DELIVERED completes it.
pub(super) const INSERT_DELIVERED: &str = concat!(
    "WITH e AS MATERIALIZED ( \
       SELECT unhex(value ->> 0) AS event_id, jsonb_extract(value, '$[1]') AS records \
       FROM jsonb_each($2) \
       WHERE EXISTS (SELECT 1 FROM websub_events WHERE id = unhex(value ->> 0))) \
     INSERT INTO websub_deliveries AS d \
     (event_id, subscriber, processed_at, outcome, delivered_attempt_at, \
      delivered_duration_us, delivered_status, delivered_response) \
     SELECT e.event_id, r.value ->> 0, $1, 'delivered', r.value ->> 1, r.value ->> 2, \
            r.value ->> 3, unhex(r.value ->> 4) \
     FROM e, jsonb_each(e.records) AS r WHERE true",
    close_delivered_on_conflict!()
);

// RETURNING may read only the updated table, so the topic comes from a scalar
// subquery (a primary-key lookup) rather than a join. `$2` is NULL when the
// visibility timeout reaches before the epoch: then no claim is stale.
//
// A bare `LIMIT ?n` is planned with the value bound at the time, and SQLite
// prepares the statement again whenever another value is bound: once per
// claim, since each asks for as many as there is room for. The CAST keeps
// the limit a run-time value, so the statement is prepared once.
pub(super) const CLAIM: &str = "UPDATE websub_deliveries SET processing_since = $1 \
     WHERE rowid IN ( \
         SELECT rowid FROM websub_deliveries \
         WHERE processed_at IS NULL AND next_attempt_at <= $1 \
           AND (processing_since IS NULL OR processing_since < $2) \
         ORDER BY next_attempt_at \
         LIMIT CAST($3 AS INTEGER)) \
     RETURNING event_id, \
         (SELECT topic FROM websub_events WHERE id = websub_deliveries.event_id) AS topic, \
         subscriber, retry_count";

// The statements that read several fields of each element walk the array
// with jsonb_each, whose elements come out as SQLite's binary JSON: with
// json_each each element is printed back to text, and each `->>` parses
// that text again.
//
// The usual outcome, delivered, with its attempt, in a script; its values:
// now, and the records as JSON, one row per record, [event id as hex,
// subscriber, attempted at in µs, duration in µs, status, response as hex]. The attempt stays in the record (no row of
// websub_attempts): closing the record is the delivery's only write. Each
// row names its event so that the planner walks the JSON and probes the
// primary key; with the event bound once it would walk the event's records
// instead, all of them for every batch. Otherwise as COMPLETE does for a
// `Delivered` outcome.
pub(super) const COMPLETE_DELIVERED: &str = "UPDATE websub_deliveries AS d \
     SET processed_at = ?, processing_since = NULL, next_attempt_at = NULL, \
         outcome = 'delivered', delivered_attempt_at = c.attempted_at, \
         delivered_duration_us = c.duration_us, delivered_status = c.status, \
         delivered_response = unhex(c.response) \
     FROM (SELECT unhex(value ->> 0) AS event_id, value ->> 1 AS subscriber, \
                  value ->> 2 AS attempted_at, value ->> 3 AS duration_us, \
                  value ->> 4 AS status, value ->> 5 AS response \
           FROM jsonb_each(?)) AS c \
     WHERE d.event_id = c.event_id AND d.subscriber = c.subscriber \
       AND d.processed_at IS NULL";

// Any outcome, in a script; its values: now, and the completions as JSON,
// one row per completion, [event id as hex, subscriber, kind, error, next
// attempt in µs]. `processed_at IS NULL` keeps a late completion (from a
// dispatcher whose claim went stale and was taken over) from reopening or
// re-counting a closed record. A `Delivered` outcome carries no error, so the
// last failure stays in `last_error` for inspection.
pub(super) const COMPLETE: &str = "UPDATE websub_deliveries AS d SET \
     processed_at = CASE WHEN c.kind IN ('delivered', 'dropped', 'skipped') THEN ? ELSE NULL END, \
     outcome = c.kind, \
     retry_count = d.retry_count + CASE WHEN c.kind IN ('retry', 'exhausted') THEN 1 ELSE 0 END, \
     last_error = COALESCE(c.error, d.last_error), \
     processing_since = NULL, \
     next_attempt_at = c.next_attempt_at \
     FROM (SELECT unhex(value ->> 0) AS event_id, value ->> 1 AS subscriber, \
                  value ->> 2 AS kind, value ->> 3 AS error, value ->> 4 AS next_attempt_at \
           FROM jsonb_each(?)) AS c \
     WHERE d.event_id = c.event_id AND d.subscriber = c.subscriber \
       AND d.processed_at IS NULL";

// In a script; its value: the attempts as JSON, one row per attempt, [event
// id as hex, subscriber, attempted at in µs, duration in µs, status, error,
// response as hex].
pub(super) const RECORD_ATTEMPTS: &str = "INSERT INTO websub_attempts \
     (event_id, subscriber, attempted_at, duration_us, status, error, response) \
     SELECT unhex(value ->> 0), value ->> 1, value ->> 2, value ->> 3, value ->> 4, \
            value ->> 5, unhex(value ->> 6) \
     FROM jsonb_each(?)";

// The window walks the (topic, created_at) index backwards; each of its
// events is one primary-key probe for the subscriber's record.
pub(super) const HEALTH: &str = "WITH recent AS ( \
         SELECT id, created_at FROM websub_events WHERE topic = $1 \
         ORDER BY created_at DESC LIMIT $3), \
     records AS ( \
         SELECT r.created_at, d.processed_at, d.last_error, d.next_attempt_at \
         FROM recent AS r \
         JOIN websub_deliveries AS d ON d.event_id = r.id AND d.subscriber = $2) \
     SELECT (SELECT max(processed_at) FROM records) AS last_success, \
            (SELECT last_error FROM records WHERE last_error IS NOT NULL \
             ORDER BY created_at DESC LIMIT 1) AS last_error, \
            (SELECT count(*) FROM records \
             WHERE processed_at IS NULL AND next_attempt_at IS NOT NULL) AS pending, \
            (SELECT count(*) FROM records \
             WHERE processed_at IS NULL AND next_attempt_at IS NULL) AS failed";

// Exhausted records are the pending index's NULL `next_attempt_at` entries.
pub(super) const FAILED: &str = "SELECT d.event_id, e.topic, d.subscriber, e.created_at, \
            d.retry_count, d.last_error \
     FROM websub_deliveries AS d JOIN websub_events AS e ON e.id = d.event_id \
     WHERE d.processed_at IS NULL AND d.next_attempt_at IS NULL \
       AND ($1 IS NULL OR e.topic = $1) \
       AND ($2 IS NULL OR d.subscriber = $2) \
       AND ($4 IS NULL OR d.event_id = $4) \
     ORDER BY e.created_at DESC LIMIT $3";

pub(super) const RETRY_FAILED: &str = "UPDATE websub_deliveries \
     SET next_attempt_at = $3, retry_count = 0, processing_since = NULL \
     WHERE processed_at IS NULL AND next_attempt_at IS NULL \
       AND ($2 IS NULL OR subscriber = $2) \
       AND ($1 IS NULL OR event_id IN (SELECT id FROM websub_events WHERE topic = $1)) \
       AND ($4 IS NULL OR event_id = $4)";

pub(super) const PURGE: &str = "DELETE FROM websub_events WHERE rowid IN ( \
     SELECT rowid FROM websub_events WHERE created_at < $1 \
     ORDER BY created_at LIMIT $2)";

// Which of a group of owed subscriptions ($1: a JSON array of [topic,
// since] pairs) DELIVER_SINCE would find an event for: their positions.
pub(super) const ANY_SINCE: &str = "SELECT CAST(owed.key AS INTEGER) FROM json_each($1) AS owed \
     WHERE EXISTS (SELECT 1 FROM websub_events \
         WHERE topic = owed.value ->> 0 AND created_at >= owed.value ->> 1 \
           AND original_id IS NULL)";

pub(super) const DELIVER_SINCE: &str = concat!(
    "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at, lane) \
     SELECT id, $2, $4, ",
    lane_of!("$2"),
    " FROM websub_events \
     WHERE topic = $1 AND created_at >= $3 AND original_id IS NULL \
     ON CONFLICT DO NOTHING"
);

// EXPAND (records due, not claimed) for ordered subscriptions: each record
// takes its place in its callback's line, the event's recording time; its
// lane is the callback, whole (`websub_hub::delivery::websub::ordered_lane_of`).
// Its values as EXPAND's.
pub(super) const EXPAND_ORDERED: &str = "INSERT INTO websub_deliveries \
     (event_id, subscriber, next_attempt_at, order_key, lane) \
     SELECT $1, value, $2, (SELECT created_at FROM websub_events WHERE id = $1), value \
     FROM json_each($3) WHERE true \
     ON CONFLICT DO NOTHING";

// The head of an ordered lane, through its index in recording order; taken
// only when due and free. Exhausted records (no `next_attempt_at`) have left
// the line. In a script; its values: now, the lane, now, the stale bound.
pub(super) const CLAIM_ORDERED: &str = "UPDATE websub_deliveries SET processing_since = ? \
     WHERE rowid = ( \
         SELECT rowid FROM websub_deliveries \
         WHERE lane = ? AND order_key IS NOT NULL AND processed_at IS NULL \
           AND next_attempt_at IS NOT NULL \
         ORDER BY order_key, event_id \
         LIMIT 1) \
       AND next_attempt_at <= ? \
       AND (processing_since IS NULL OR processing_since < ?) \
     RETURNING event_id, \
         (SELECT topic FROM websub_events WHERE id = websub_deliveries.event_id) AS topic, \
         subscriber, retry_count";

// CLAIM, for one lane, in a script: the lane index gives its due records
// in due order. Its values: now, the lane, now, the stale bound, how many.
pub(super) const CLAIM_LANE: &str = "UPDATE websub_deliveries SET processing_since = ? \
     WHERE rowid IN ( \
         SELECT rowid FROM websub_deliveries \
         WHERE lane = ? AND processed_at IS NULL AND next_attempt_at <= ? \
           AND (processing_since IS NULL OR processing_since < ?) \
         ORDER BY next_attempt_at \
         LIMIT CAST(? AS INTEGER)) \
     RETURNING event_id, \
         (SELECT topic FROM websub_events WHERE id = websub_deliveries.event_id) AS topic, \
         subscriber, retry_count";

// A loose scan of the lane index: each step seeks the next lane, so the
// cost is the number of lanes, not of records. Exhausted records (no
// `next_attempt_at`) keep a lane in the walk but give it no due time.
pub(super) const DUE_LANES: &str = "WITH RECURSIVE lanes (lane) AS ( \
         SELECT (SELECT lane FROM websub_deliveries WHERE processed_at IS NULL \
                 AND lane IS NOT NULL ORDER BY lane LIMIT 1) \
         UNION ALL \
         SELECT (SELECT d.lane FROM websub_deliveries AS d WHERE d.processed_at IS NULL \
                 AND d.lane > lanes.lane ORDER BY d.lane LIMIT 1) \
         FROM lanes WHERE lanes.lane IS NOT NULL) \
     SELECT lane, due FROM ( \
         SELECT lane, (SELECT min(d.next_attempt_at) FROM websub_deliveries AS d \
                       WHERE d.processed_at IS NULL AND d.lane = lanes.lane \
                         AND d.next_attempt_at IS NOT NULL) AS due \
         FROM lanes WHERE lane IS NOT NULL) \
     WHERE due IS NOT NULL LIMIT $1";

pub(super) const RELEASE_CLAIMS: &str = "UPDATE websub_deliveries SET processing_since = NULL \
     WHERE processing_since IS NOT NULL AND processed_at IS NULL";

// The lane index narrows to the subscriber's host, or to its own line when
// ordered; exhausted records keep their attempts, which say whether they
// failed during the outage.
pub(super) const RELEASE_ENDPOINT: &str = "UPDATE websub_deliveries SET \
         retry_count = CASE WHEN next_attempt_at IS NULL THEN 0 ELSE retry_count END, \
         outcome = CASE WHEN next_attempt_at IS NULL THEN 'retry' ELSE outcome END, \
         next_attempt_at = $3 \
     WHERE lane IN ($1, $2) AND subscriber = $2 AND processed_at IS NULL \
       AND processing_since IS NULL \
       AND (next_attempt_at > $3 \
            OR (next_attempt_at IS NULL AND EXISTS ( \
                SELECT 1 FROM websub_attempts AS a \
                WHERE a.event_id = websub_deliveries.event_id \
                  AND a.subscriber = websub_deliveries.subscriber AND a.attempted_at >= $4)))";
