//! The PostgreSQL event log's statements, apart from the code that runs
//! them; each says why it is written as it is.

/// The table the hub's migrations are recorded in; see the log's module doc.
pub(super) const MIGRATIONS_TABLE: &str = "websub_hub_migrations";

/// Stated rather than inherited from the server's
/// `default_transaction_isolation`: expansion and purging rely on each
/// statement seeing what committed before it (see the migration).
pub(super) const READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

pub(super) const INSERT_EVENT: &str = "INSERT INTO websub_events (id, topic, content_type, body, created_at) \
     VALUES ($1, $2, $3, $4, $5)";

// A concurrent insert of the same id makes this one wait for its commit,
// then do nothing (or insert, had it rolled back): at READ COMMITTED the
// next statement sees whichever row is there.
pub(super) const INSERT_EVENT_ONCE: &str = "INSERT INTO websub_events \
     (id, topic, content_type, body, created_at) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (id) DO NOTHING";

// Marks the event expanded only if it was not: one row affected means this
// transaction expands it first, so it has no delivery records yet (only
// expand writes them, and it marks the event in the same transaction).
pub(super) const MARK_EXPANDED: &str =
    "UPDATE websub_events SET expanded_at = $2 WHERE id = $1 AND expanded_at IS NULL";

pub(super) const EVENT_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM websub_events WHERE id = $1)";

pub(super) const HAS_RECORDS: &str =
    "SELECT EXISTS (SELECT 1 FROM websub_deliveries WHERE event_id = $1)";

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

pub(super) const UNEXPANDED: &str = "SELECT id, topic, content_type, body, created_at, original_id FROM websub_events \
     WHERE expanded_at IS NULL ORDER BY created_at, id LIMIT $1";

pub(super) const EVENT: &str = "SELECT id, topic, content_type, body, created_at, original_id FROM websub_events \
     WHERE id = $1";

// Both are functions in the migration, so that their plans cannot depend on
// stale statistics (see `0001_events.sql`). `$2` is NULL when the visibility
// timeout reaches before the Unix epoch: then no claim is ever stale. The
// last argument is the claiming replica (`0011_replicas.sql`).
pub(super) const CLAIM: &str =
    "SELECT event_id, topic, subscriber, retry_count FROM websub_claim_deliveries($1, $2, $3, $4)";

pub(super) const COMPLETE: &str =
    "SELECT websub_complete_attempts($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

// The attempts' rows and the successful attempt its record keeps.
pub(super) const ATTEMPTS: &str = "SELECT attempted_at, duration_us, status, error, response \
     FROM websub_attempts WHERE event_id = $1 AND subscriber = $2 \
     UNION ALL \
     SELECT delivered_attempt_at, delivered_duration_us, delivered_status, NULL, \
            delivered_response \
     FROM websub_deliveries WHERE event_id = $1 AND subscriber = $2 \
       AND delivered_attempt_at IS NOT NULL \
     ORDER BY attempted_at";

pub(super) const WEBHOOK_ATTEMPTS: &str = "SELECT attempted_at, duration_us, status, error, response \
     FROM websub_webhook_attempts WHERE event_id = $1 AND subscriber = $2 \
     ORDER BY attempted_at";

// The age index bounds the work to the window since the webhook began
// failing.
pub(super) const WEBHOOK_EVENTS_SINCE: &str = "SELECT DISTINCT event_id \
     FROM websub_webhook_attempts WHERE attempted_at >= $2 AND subscriber = $1 LIMIT $3";

// Webhook attempts have no event here to go with: they go by age.
pub(super) const PURGE_WEBHOOK_ATTEMPTS: &str =
    "DELETE FROM websub_webhook_attempts WHERE attempted_at < $1";

pub(super) const DELIVERY: &str = "SELECT event_id, subscriber, processed_at, retry_count, last_error, \
     processing_since, next_attempt_at, outcome FROM websub_deliveries \
     WHERE event_id = $1 AND subscriber = $2";

pub(super) const DELIVERIES: &str = "SELECT event_id, subscriber, processed_at, retry_count, last_error, \
     processing_since, next_attempt_at, outcome FROM websub_deliveries \
     WHERE event_id = $1 ORDER BY subscriber";

pub(super) const LATEST: &str = "SELECT id, topic, content_type, body, created_at, original_id FROM websub_events \
     WHERE topic = $1 AND original_id IS NULL ORDER BY created_at DESC, id DESC LIMIT 1";

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

// The pending index's entries with a `next_attempt_at`: everything not
// processed and not exhausted.
pub(super) const UNDELIVERED: &str = "SELECT count(*) AS records, min(e.created_at) AS oldest \
     FROM websub_deliveries AS d JOIN websub_events AS e ON e.id = d.event_id \
     WHERE d.processed_at IS NULL AND d.next_attempt_at IS NOT NULL";

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

// Successful attempts: those their records keep, and (from before the
// records kept them, or closed before the answer came) attempts' rows
// without an error. The events' time index bounds the work to the window.
pub(super) const DELIVERED_SINCE: &str = "SELECT \
     (SELECT count(*) FROM websub_events AS e \
      JOIN websub_deliveries AS d ON d.event_id = e.id \
      WHERE e.created_at >= $1 AND d.delivered_attempt_at >= $1) \
     + (SELECT count(*) FROM websub_events AS e \
        JOIN websub_attempts AS a ON a.event_id = e.id \
        WHERE e.created_at >= $1 AND a.attempted_at >= $1 AND a.error IS NULL) \
     AS delivered";

pub(super) const DELIVER_SINCE: &str = "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at) \
     SELECT id, $2, $4 FROM websub_events \
     WHERE topic = $1 AND created_at >= $3 AND original_id IS NULL \
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

pub(super) const ORDER: &str = "INSERT INTO websub_ordered_subscriptions (topic, callback, since) \
     VALUES ($1, $2, $3) ON CONFLICT (topic, callback) DO NOTHING";

pub(super) const UNORDER: &str =
    "DELETE FROM websub_ordered_subscriptions WHERE topic = $1 AND callback = $2";

pub(super) const ORDERED_SUBSCRIPTIONS: &str = "SELECT topic, callback, since \
     FROM websub_ordered_subscriptions ORDER BY topic, callback LIMIT $1";

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

// As the SQLite log's.
pub(super) const DROP_SINCE: &str = "UPDATE websub_deliveries SET \
         processed_at = $5, next_attempt_at = NULL, processing_since = NULL, \
         outcome = 'dropped', last_error = $4 \
     WHERE subscriber = $2 AND processed_at IS NULL \
       AND event_id IN (SELECT id FROM websub_events WHERE topic = $1 AND created_at >= $3)";
