//! The PostgreSQL event log's statements, apart from the code that runs
//! them; each says why it is written as it is.

pub(super) use super::super::sql::*;

/// Stated rather than inherited from the server's
/// `default_transaction_isolation`: expansion and purging rely on each
/// statement seeing what committed before it (see the migration).
pub(super) const READ_COMMITTED: &str =
    <sqlx::Postgres as crate::storage::dialect::Dialect>::BEGIN_WRITE;

// Marks the event expanded only if it was not: one row affected means this
// transaction expands it first, so it has no delivery records yet (only
// expand writes them, and it marks the event in the same transaction).
pub(super) const MARK_EXPANDED: &str =
    "UPDATE websub_events SET expanded_at = $2 WHERE id = $1 AND expanded_at IS NULL";

// The first expansion of an event: nothing can conflict unless parts were
// written before a crash (then it fails and is retried as EXPAND_AGAIN), and leaving out
// ON CONFLICT saves its speculative-insertion work on every row (a quarter
// of the statement's time at 100 000 rows).
pub(super) const EXPAND_FIRST: &str = "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at) \
     SELECT $1, subscriber, $2 FROM unnest($3::text[]) AS s(subscriber)";

// Any later one: records that exist are left as they are.
pub(super) const EXPAND_AGAIN: &str = "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at) \
     SELECT $1, subscriber, $2 FROM unnest($3::text[]) AS s(subscriber) \
     ON CONFLICT DO NOTHING";

// Records claimed for their first attempt as they are written. The first
// try leaves out ON CONFLICT, as EXPAND_FIRST does: nothing conflicts unless
// the event is being (or was) expanded elsewhere, and then every row was
// inserted, so none need be returned. On a conflict the statement fails as a
// whole and EXPAND_CLAIMED_AGAIN runs instead, whose RETURNING reports only
// the rows it inserted, not those it skipped.
pub(super) const EXPAND_CLAIMED_FIRST: &str = "INSERT INTO websub_deliveries \
     (event_id, subscriber, next_attempt_at, processing_since, claimed_by) \
     SELECT $1, subscriber, $2, $2, $4 FROM unnest($3::text[]) AS s(subscriber)";

pub(super) const EXPAND_CLAIMED_AGAIN: &str = "INSERT INTO websub_deliveries \
     (event_id, subscriber, next_attempt_at, processing_since, claimed_by) \
     SELECT $1, subscriber, $2, $2, $4 FROM unnest($3::text[]) AS s(subscriber) \
     ON CONFLICT DO NOTHING RETURNING subscriber::TEXT";

// The unexpanded events no other live replica is expanding (`$2` is this
// one; see `0022_expansion_owner.sql`): the partial index of unexpanded
// events in order, each owner looked up in the registry.
pub(super) const UNEXPANDED_FREE: &str = "SELECT id, topic, content_type, body, created_at, original_id, \
            trace_context \
     FROM websub_events AS e \
     WHERE expanded_at IS NULL \
       AND (expanding_by IS NULL OR expanding_by = $2 \
            OR NOT EXISTS (SELECT 1 FROM websub_replicas AS r WHERE r.id = e.expanding_by)) \
     ORDER BY created_at, id LIMIT $1";

// Takes an unexpanded event's expansion for `$2` if it is free (nobody's,
// or a replica's no longer registered), and reads whether it is `$2`'s now
// and whether any of its records is written. One already `$2`'s is not
// written again. The row lock orders two replicas taking one event at
// once: the second sees the first's id, live, and takes nothing.
pub(super) const TAKE_EXPANSION: &str = "WITH taken AS ( \
         UPDATE websub_events AS e SET expanding_by = $2 \
         WHERE e.id = $1 AND e.expanded_at IS NULL \
           AND (e.expanding_by IS NULL \
                OR NOT EXISTS (SELECT 1 FROM websub_replicas AS r WHERE r.id = e.expanding_by)) \
         RETURNING e.id) \
     SELECT EXISTS (SELECT 1 FROM taken) \
            OR EXISTS (SELECT 1 FROM websub_events \
                       WHERE id = $1 AND expanded_at IS NULL AND expanding_by = $2) AS mine, \
            EXISTS (SELECT 1 FROM websub_deliveries WHERE event_id = $1) AS written";

// Records written only now, delivered at their first attempt: one insert
// each, with the outcome and the attempt its record keeps, as
// websub_complete_attempts would leave it; an event purged meanwhile is
// skipped. Its values: now, then the records' event ids, subscribers,
// attempt times, durations, statuses and responses.
pub(super) const INSERT_DELIVERED: &str = concat!(
    "INSERT INTO websub_deliveries AS d \
         (event_id, subscriber, processed_at, outcome, delivered_attempt_at, \
          delivered_duration_us, delivered_status, delivered_response) \
     SELECT c.event_id, c.subscriber, $1, 'delivered', c.attempted_at, c.duration_us, \
            c.status, c.response \
     FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::bigint[], $6::smallint[], \
                 $7::bytea[]) \
         AS c (event_id, subscriber, attempted_at, duration_us, status, response) \
     WHERE EXISTS (SELECT 1 FROM websub_events WHERE id = c.event_id)",
    close_delivered_on_conflict!()
);

// Both are functions in the migration, so that their plans cannot depend on
// stale statistics (see `0001_events.sql`). `$2` is NULL when the visibility
// timeout reaches before the Unix epoch: then no claim is ever stale. The
// last argument is the claiming replica (`0011_replicas.sql`).
pub(super) const CLAIM: &str =
    "SELECT event_id, topic, subscriber, retry_count FROM websub_claim_deliveries($1, $2, $3, $4)";

pub(super) const COMPLETE: &str =
    "SELECT websub_complete_attempts($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

// The window walks the (topic, created_at) index backwards; each of its
// events is one primary-key probe for the subscriber's record.
pub(super) const HEALTH: &str = "WITH recent AS ( \
         SELECT id, created_at FROM websub_events WHERE topic = $1 \
         ORDER BY created_at DESC LIMIT $3) \
     SELECT max(d.processed_at) AS last_success, \
            (array_agg(d.last_error ORDER BY r.created_at DESC) \
                FILTER (WHERE d.last_error IS NOT NULL))[1] AS last_error, \
            count(*) FILTER (WHERE d.processed_at IS NULL AND d.next_attempt_at IS NOT NULL) \
                AS pending, \
            count(*) FILTER (WHERE d.processed_at IS NULL AND d.next_attempt_at IS NULL) \
                AS failed \
     FROM recent AS r \
     JOIN websub_deliveries AS d ON d.event_id = r.id AND d.subscriber = $2";

// Exhausted records are the pending index's NULL `next_attempt_at` entries.
pub(super) const FAILED: &str = "SELECT d.event_id, e.topic, d.subscriber::TEXT AS subscriber, e.created_at, \
            d.retry_count, d.last_error \
     FROM websub_deliveries AS d JOIN websub_events AS e ON e.id = d.event_id \
     WHERE d.processed_at IS NULL AND d.next_attempt_at IS NULL \
       AND ($1::TEXT IS NULL OR e.topic = $1) \
       AND ($2::TEXT IS NULL OR d.subscriber = $2) \
       AND ($4::UUID IS NULL OR d.event_id = $4) \
     ORDER BY e.created_at DESC LIMIT $3";

pub(super) const RETRY_FAILED: &str = "UPDATE websub_deliveries AS d \
     SET next_attempt_at = $3, retry_count = 0, processing_since = NULL \
     FROM websub_events AS e \
     WHERE e.id = d.event_id \
       AND d.processed_at IS NULL AND d.next_attempt_at IS NULL \
       AND ($1::TEXT IS NULL OR e.topic = $1) \
       AND ($2::TEXT IS NULL OR d.subscriber = $2) \
       AND ($4::UUID IS NULL OR d.event_id = $4)";

// SKIP LOCKED lets two replicas purge at once, each taking its own chunk.
pub(super) const PURGE: &str = "DELETE FROM websub_events WHERE id IN ( \
     SELECT id FROM websub_events WHERE created_at < $1 \
     ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)";

// Each subscription's events are read through its own index range (the
// LATERAL subquery, kept apart by OFFSET 0 so the planner cannot flatten
// it into a join that a generic plan would hash over the whole log).
pub(super) const DELIVER_SINCE: &str = "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at) \
     SELECT owed.id, s.subscriber, $4 \
     FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS s (topic, subscriber, since), \
     LATERAL (SELECT id FROM websub_events \
              WHERE topic = s.topic AND created_at >= s.since AND original_id IS NULL \
              OFFSET 0) AS owed \
     ON CONFLICT DO NOTHING";

// EXPAND_AGAIN for ordered subscriptions: each record takes its place in
// its callback's line, the event's recording time.
pub(super) const EXPAND_ORDERED: &str = "INSERT INTO websub_deliveries \
         (event_id, subscriber, next_attempt_at, order_key) \
     SELECT $1, subscriber, $2, (SELECT created_at FROM websub_events WHERE id = $1) \
     FROM unnest($3::text[]) AS s(subscriber) \
     ON CONFLICT DO NOTHING";

// The head of an ordered lane, locked in recording order, then taken only
// when due and free. Claimers of one lane queue on its head rather than
// skip it: a claimer that finds the head done meanwhile moves to the next
// one, and one that finds it claimed takes nothing. Exhausted records (no
// `next_attempt_at`) have left the line.
pub(super) const CLAIM_ORDERED: &str = "WITH head AS ( \
         SELECT event_id, subscriber FROM websub_deliveries \
         WHERE lane = $3 AND order_key IS NOT NULL AND processed_at IS NULL \
           AND next_attempt_at IS NOT NULL \
         ORDER BY lane, order_key, event_id \
         LIMIT 1 \
         FOR UPDATE) \
     UPDATE websub_deliveries AS d SET processing_since = $1, claimed_by = $4 \
     FROM head, websub_events AS e \
     WHERE d.event_id = head.event_id AND d.subscriber = head.subscriber \
       AND d.next_attempt_at <= $1 \
       AND (d.processing_since IS NULL OR d.processing_since < $2) \
       AND e.id = d.event_id \
     RETURNING d.event_id, e.topic, d.subscriber::TEXT AS subscriber, d.retry_count";

pub(super) const CLAIM_LANES: &str =
    "SELECT event_id, topic, subscriber, retry_count FROM websub_claim_lanes($1, $2, $3, $4, $5)";

// A loose scan of the lane index, as the SQLite log's: each step seeks the
// next lane, so the cost is the number of lanes, not of records.
pub(super) const DUE_LANES: &str = "WITH RECURSIVE lanes (lane) AS ( \
         SELECT (SELECT lane FROM websub_deliveries WHERE processed_at IS NULL \
                 AND lane IS NOT NULL ORDER BY lane LIMIT 1) \
         UNION ALL \
         SELECT (SELECT d.lane FROM websub_deliveries AS d WHERE d.processed_at IS NULL \
                 AND d.lane > lanes.lane ORDER BY d.lane LIMIT 1) \
         FROM lanes WHERE lanes.lane IS NOT NULL) \
     SELECT lane::TEXT AS lane, due FROM ( \
         SELECT lane, (SELECT min(d.next_attempt_at) FROM websub_deliveries AS d \
                       WHERE d.processed_at IS NULL AND d.lane = lanes.lane \
                         AND d.next_attempt_at IS NOT NULL) AS due \
         FROM lanes WHERE lane IS NOT NULL) AS found \
     WHERE due IS NOT NULL LIMIT $1";

// As the SQLite log's: the lane index narrows to the subscriber's host.
pub(super) const RELEASE_ENDPOINT: &str = "UPDATE websub_deliveries AS d SET \
         retry_count = CASE WHEN d.next_attempt_at IS NULL THEN 0 ELSE d.retry_count END, \
         outcome = CASE WHEN d.next_attempt_at IS NULL THEN 'retry' ELSE d.outcome END, \
         next_attempt_at = $3 \
     WHERE d.lane IN ($1, $2) AND d.subscriber = $2 AND d.processed_at IS NULL \
       AND d.processing_since IS NULL \
       AND (d.next_attempt_at > $3 \
            OR (d.next_attempt_at IS NULL AND EXISTS ( \
                SELECT 1 FROM websub_attempts AS a \
                WHERE a.event_id = d.event_id AND a.subscriber = d.subscriber \
                  AND a.attempted_at >= $4)))";
