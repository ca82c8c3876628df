//! The statements of the event log that SQLite and PostgreSQL spell the
//! same, written once; each backend's `statements` module re-exports them
//! beside the ones its dialect spells its own way (times as microseconds
//! or `TIMESTAMPTZ`, JSON or arrays for batches, the claims).

/// The table the hub's migrations are recorded in; see the log's module doc.
pub(super) const MIGRATIONS_TABLE: &str = "websub_hub_migrations";

/// The versions of the migrations applied to the log.
pub(super) const APPLIED_MIGRATIONS: &str =
    "SELECT version FROM websub_hub_migrations WHERE success";

pub(super) const INSERT_EVENT: &str = "INSERT INTO websub_events (id, topic, content_type, body, created_at, trace_context) \
     VALUES ($1, $2, $3, $4, $5, $6)";

// On PostgreSQL a concurrent insert of the same id makes this one wait for
// its commit, then do nothing (or insert, had it rolled back): at READ
// COMMITTED the next statement sees whichever row is there. SQLite has one
// writer at a time.
pub(super) const INSERT_EVENT_ONCE: &str = "INSERT INTO websub_events \
     (id, topic, content_type, body, created_at, trace_context) VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (id) DO NOTHING";

pub(super) const EVENT_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM websub_events WHERE id = $1)";

pub(super) const HAS_RECORDS: &str =
    "SELECT EXISTS (SELECT 1 FROM websub_deliveries WHERE event_id = $1)";

pub(super) const EVENT: &str = "SELECT id, topic, content_type, body, created_at, original_id, trace_context FROM websub_events \
     WHERE id = $1";

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

pub(super) const LATEST: &str = "SELECT id, topic, content_type, body, created_at, original_id, trace_context FROM websub_events \
     WHERE topic = $1 AND original_id IS NULL ORDER BY created_at DESC, id DESC LIMIT 1";

// The pending index's entries with a `next_attempt_at`: everything not
// processed and not exhausted.
pub(super) const UNDELIVERED: &str = "SELECT count(*) AS records, min(e.created_at) AS oldest \
     FROM websub_deliveries AS d JOIN websub_events AS e ON e.id = d.event_id \
     WHERE d.processed_at IS NULL AND d.next_attempt_at IS NOT NULL";

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

pub(super) const ORDER: &str = "INSERT INTO websub_ordered_subscriptions (topic, callback, since) \
     VALUES ($1, $2, $3) ON CONFLICT (topic, callback) DO NOTHING";

pub(super) const UNORDER: &str =
    "DELETE FROM websub_ordered_subscriptions WHERE topic = $1 AND callback = $2";

pub(super) const ORDERED_SUBSCRIPTIONS: &str = "SELECT topic, callback, since \
     FROM websub_ordered_subscriptions ORDER BY topic, callback LIMIT $1";

// The (topic, created_at) index finds the events; each is one primary-key
// probe for the subscriber's record.
pub(super) const DROP_SINCE: &str = "UPDATE websub_deliveries SET \
         processed_at = $5, next_attempt_at = NULL, processing_since = NULL, \
         outcome = 'dropped', last_error = $4 \
     WHERE subscriber = $2 AND processed_at IS NULL \
       AND event_id IN (SELECT id FROM websub_events WHERE topic = $1 AND created_at >= $3)";

/// The history of endpoint changes.
pub(super) mod changes {
    pub(in crate::storage::events) const COLUMNS: &str = "id, channel, endpoint, state, at, failures, since, reason, source, \
         webhook_state, retry_count, last_error, delivered_at";

    pub(in crate::storage::events) const TRIM: &str = "DELETE FROM websub_endpoint_changes \
         WHERE id <= (SELECT max(id) FROM websub_endpoint_changes) - $1";

    pub(in crate::storage::events) const DELIVERED: &str = "UPDATE websub_endpoint_changes \
         SET webhook_state = 'delivered', delivered_at = $2, next_attempt_at = NULL, \
             claimed_until = NULL \
         WHERE id = $1";

    pub(in crate::storage::events) const RETRY: &str = "UPDATE websub_endpoint_changes \
         SET next_attempt_at = $2, last_error = $3, retry_count = retry_count + $4, \
             claimed_until = NULL \
         WHERE id = $1";

    pub(in crate::storage::events) const FAILED: &str = "UPDATE websub_endpoint_changes \
         SET webhook_state = 'failed', last_error = $2, retry_count = retry_count + 1, \
             next_attempt_at = NULL, claimed_until = NULL \
         WHERE id = $1";

    pub(in crate::storage::events) const RELEASED: &str =
        "UPDATE websub_endpoint_changes SET claimed_until = NULL WHERE id = $1";

    // OFFSET counts from the newest pending change: what lies beyond `keep`
    // of them goes, with whatever is older than the cutoff.
    pub(in crate::storage::events) const SHED: &str = "UPDATE websub_endpoint_changes \
         SET webhook_state = 'dropped', next_attempt_at = NULL, claimed_until = NULL \
         WHERE webhook_state = 'pending' \
           AND (at < $2 OR id <= (SELECT id FROM websub_endpoint_changes \
                                  WHERE webhook_state = 'pending' \
                                  ORDER BY id DESC LIMIT 1 OFFSET $1))";

    pub(in crate::storage::events) const PURGE: &str =
        "DELETE FROM websub_endpoint_changes WHERE at < $1";
}

/// What operators do: endpoints disabled and enabled.
pub(super) mod operate {
    pub(in crate::storage::events) const DISABLE_TALLIED: &str = "UPDATE websub_endpoints \
         SET disabled_at = $2, disabled_reason = $3 \
         WHERE channel = $4 AND endpoint = $1 AND disabled_at IS NULL";

    pub(in crate::storage::events) const DISABLE: &str = "INSERT INTO websub_endpoints AS w \
         (channel, endpoint, disabled_at, disabled_reason) \
         VALUES ($4, $1, $2, $3) ON CONFLICT (channel, endpoint) DO UPDATE \
         SET disabled_at = excluded.disabled_at, disabled_reason = excluded.disabled_reason \
         WHERE w.disabled_at IS NULL";

    pub(in crate::storage::events) const ENABLE: &str =
        "DELETE FROM websub_endpoints WHERE channel = $2 AND endpoint = $1";

    // The endpoints failing or disabled, disabled first; and one of them.
    pub(in crate::storage::events) const ENDPOINTS: &str = "SELECT channel, endpoint, failures, last_failure_at, last_error, \
         disabled_at, disabled_reason FROM websub_endpoints WHERE channel = $1 \
         ORDER BY disabled_at IS NULL, failures DESC, endpoint LIMIT $2";

    pub(in crate::storage::events) const ENDPOINT: &str = "SELECT channel, endpoint, failures, last_failure_at, last_error, \
         disabled_at, disabled_reason FROM websub_endpoints WHERE channel = $1 AND endpoint = $2";
}

/// The attempts of a window of time, for the admin page's charts: `$1` its
/// start, `$2` its end. Written once but for one piece, the number of
/// microseconds from `$1` to an attempt, which each dialect spells its own
/// way (times are integers on SQLite, `TIMESTAMPTZ` on PostgreSQL).
pub(super) mod activity {
    use std::sync::LazyLock;

    // Successful attempts are kept in the records they closed, failed ones
    // are rows of their own; an attempt row without an error is a success
    // from before records kept them. As in DELIVERED_SINCE, the events'
    // time index bounds the work to the window: an older event's late
    // attempts are not counted.
    const ATTEMPTS: &str = "WITH attempts AS ( \
         SELECT d.subscriber AS subscriber, d.delivered_attempt_at AS at, \
                COALESCE(d.delivered_duration_us, 0) AS duration_us, 1 AS ok \
         FROM websub_events AS e JOIN websub_deliveries AS d ON d.event_id = e.id \
         WHERE e.created_at >= $1 AND e.created_at < $2 \
           AND d.delivered_attempt_at >= $1 AND d.delivered_attempt_at < $2 \
         UNION ALL \
         SELECT a.subscriber, a.attempted_at, a.duration_us, \
                CASE WHEN a.error IS NULL THEN 1 ELSE 0 END \
         FROM websub_events AS e JOIN websub_attempts AS a ON a.event_id = e.id \
         WHERE e.created_at >= $1 AND e.created_at < $2 \
           AND a.attempted_at >= $1 AND a.attempted_at < $2)";

    /// Per bucket of `$3` microseconds: attempts delivered and failed, and
    /// the durations at the 50th and 99th percentiles by nearest rank
    /// (the rank is ceil(p × n / 100), in integers both dialects divide
    /// alike), so that the 99th is never below the median. `micros_since`
    /// is the dialect's spelling of the microseconds from `$1` to `at`.
    pub(in crate::storage::events) fn buckets(micros_since: &str) -> String {
        format!(
            "{ATTEMPTS}, \
             ranked AS ( \
                 SELECT {micros_since} / $3 AS bucket, ok, duration_us, \
                        row_number() OVER (PARTITION BY {micros_since} / $3 \
                                           ORDER BY duration_us) AS place, \
                        count(*) OVER (PARTITION BY {micros_since} / $3) AS total \
                 FROM attempts) \
             SELECT bucket, sum(ok) AS delivered, count(*) - sum(ok) AS failed, \
                    max(CASE WHEN place = (total * 50 + 99) / 100 THEN duration_us END) AS p50, \
                    max(CASE WHEN place = (total * 99 + 99) / 100 THEN duration_us END) AS p99 \
             FROM ranked GROUP BY bucket ORDER BY bucket"
        )
    }

    /// The `$3` endpoints with the most attempts answered 2xx.
    pub(in crate::storage::events) static BUSIEST: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{ATTEMPTS} \
             SELECT subscriber, sum(ok) AS delivered, count(*) - sum(ok) AS failed \
             FROM attempts GROUP BY subscriber HAVING sum(ok) > 0 \
             ORDER BY delivered DESC, subscriber LIMIT $3"
        )
    });

    /// The `$3` endpoints with the most failed attempts.
    pub(in crate::storage::events) static FAILING: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{ATTEMPTS} \
             SELECT subscriber, sum(ok) AS delivered, count(*) - sum(ok) AS failed \
             FROM attempts GROUP BY subscriber HAVING count(*) - sum(ok) > 0 \
             ORDER BY failed DESC, subscriber LIMIT $3"
        )
    });
}

/// The conflict clause of both logs' `INSERT_DELIVERED` (a record written
/// only with its first outcome, delivered): one that exists meanwhile (an
/// operator's resend, a catch-up) is closed as a completion closes it, and
/// one closed already is left as it is. The insert's alias is `d`.
macro_rules! close_delivered_on_conflict {
    () => {
        " ON CONFLICT (event_id, subscriber) DO UPDATE SET \
             processed_at = excluded.processed_at, processing_since = NULL, \
             next_attempt_at = NULL, outcome = 'delivered', \
             delivered_attempt_at = excluded.delivered_attempt_at, \
             delivered_duration_us = excluded.delivered_duration_us, \
             delivered_status = excluded.delivered_status, \
             delivered_response = excluded.delivered_response \
         WHERE d.processed_at IS NULL"
    };
}
pub(super) use close_delivered_on_conflict;
