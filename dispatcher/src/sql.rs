//! The dispatcher's statements against a producer's outbox tables: expand,
//! claim and record outcomes. Each is one set-based statement whatever the
//! number of subscribers or rows (arrays travel as single parameters through
//! `unnest`), and every time comes from the database's clock in UTC, the
//! clock `created_at` is written with, so that processes with skewed clocks
//! agree on what is due.

use std::sync::Arc;
use std::time::Duration;
use websub_delivery::health::SKIPPED_REASON;

use chrono::NaiveDateTime;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use uuid::Uuid;
use websub_delivery::state::bounded;

use super::OutboxTables;
use super::rows::{
    ClaimedRow, ClaimingExpansion, NewEvents, RowCompletion, RowOutcome, claimed_row,
};

/// A statement with its parameters bound so far.
type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// The database's current time in UTC, as the tables store it.
const NOW: &str = "timezone('utc', now())";

/// Statements built once for one pair of tables.
#[derive(Debug)]
pub(crate) struct Queries {
    /// How long any one statement may take; see
    /// `DispatcherConfig::query_timeout`.
    timeout: Duration,
    expand_since: Arc<str>,
    expand_ids: Arc<str>,
    expand_newest: Arc<str>,
    claim: Arc<str>,
    claim_head: Arc<str>,
    complete: Arc<str>,
    release_subscriber: Arc<str>,
}

/// Who is subscribed to what, as expansion and claims need it: parallel
/// arrays, one element per (subscriber, event name) registration.
#[derive(Debug, Default, Clone)]
pub(crate) struct Registrations {
    pub(crate) subscribers: Vec<String>,
    pub(crate) apps: Vec<Option<String>>,
    pub(crate) event_names: Vec<String>,
    /// Subscribers of every event name (the catch-all handler).
    pub(crate) every_event: Vec<String>,
    /// The subscriber that takes only the events `matches` describes (a
    /// restricted catch-all handler), if there is one.
    pub(crate) matching: Option<String>,
    pub(crate) matches: MatchColumns,
}

/// Descriptions of events, as parallel arrays: an event fits one when it
/// has every value given (`None` takes any) and was created at or after its
/// `since`. An event without an app has the app `""` here.
#[derive(Debug, Default, Clone)]
pub(crate) struct MatchColumns {
    pub(crate) event_names: Vec<Option<String>>,
    pub(crate) apps: Vec<Option<String>>,
    pub(crate) resource_types: Vec<Option<String>>,
    pub(crate) event_types: Vec<Option<String>>,
    pub(crate) since: Vec<Option<NaiveDateTime>>,
}

impl Registrations {
    pub(crate) fn is_empty(&self) -> bool {
        self.subscribers.is_empty() && self.every_event.is_empty() && self.matching.is_none()
    }

    /// Binds the registrations as the `fresh` fragment reads them: $1-$3
    /// (subscriber, app, event name) pair by pair, $4 the catch-all
    /// subscribers.
    fn bind_to<'q>(&'q self, query: PgQuery<'q>) -> PgQuery<'q> {
        query
            .bind(&self.subscribers)
            .bind(&self.apps)
            .bind(&self.event_names)
            .bind(&self.every_event)
    }

    /// Binds the matching subscriber and its descriptions as the `fresh`
    /// fragment reads them, after every other parameter of the statement.
    fn bind_matches_to<'q>(&'q self, query: PgQuery<'q>) -> PgQuery<'q> {
        query
            .bind(self.matching.as_deref())
            .bind(&self.matches.event_names)
            .bind(&self.matches.apps)
            .bind(&self.matches.resource_types)
            .bind(&self.matches.event_types)
            .bind(&self.matches.since)
    }

    /// The subscribers whose rows are claimed whatever their event's name:
    /// the catch-all ones, and the matching one, whose rows were written
    /// only for events it takes.
    fn claimed_whatever_the_name(&self) -> Vec<&str> {
        self.every_event
            .iter()
            .chain(&self.matching)
            .map(String::as_str)
            .collect()
    }

    /// Every subscriber named, once each, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .subscribers
            .iter()
            .chain(&self.every_event)
            .chain(&self.matching)
            .cloned()
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// How many rows each subscriber may be given by a claim, and how many in
/// all. Only subscribers already holding rows have a room of their own
/// (parallel arrays, zero for none), so the arrays stay small however many
/// subscribers there are.
#[derive(Debug, Default)]
pub(crate) struct Rooms {
    /// The room of every subscriber not listed.
    pub(crate) default: i64,
    pub(crate) subscribers: Vec<String>,
    pub(crate) rows: Vec<i64>,
    pub(crate) total: usize,
}

impl Rooms {
    /// The listed subscribers with no room.
    pub(crate) fn saturated(&self) -> Vec<&str> {
        self.subscribers
            .iter()
            .zip(&self.rows)
            .filter(|(_, rows)| **rows <= 0)
            .map(|(subscriber, _)| subscriber.as_str())
            .collect()
    }
}

impl Queries {
    pub(crate) fn new(tables: &OutboxTables, timeout: Duration) -> Self {
        let outbox = tables.outbox_sql();
        let deliveries = tables.deliveries_sql();
        // The events a registration covers: every registration joined with
        // the events of its name ($1-$3, honouring app scoping), plus the
        // catch-all subscribers ($4) with every event, plus the matching
        // subscriber (${m}, none when NULL) with every event one of its
        // descriptions (${m + 1}-${m + 5}) fits, minus the pairs that
        // already have a row. `{scope}` limits the events looked at. The
        // descriptions are few (a feed's subscribed topics), so an event is
        // checked against each in turn; with no matching subscriber the
        // third part is skipped before it reads anything. `{probe}` is
        // `OFFSET 0` for a few events: it keeps the planner from turning
        // the check for existing rows into a join, so that each candidate
        // probes the deliveries' primary key instead. A generic plan,
        // which cannot tell how many events a window holds, otherwise
        // reads the whole deliveries table to hash it.
        let fresh = |scope: &str, m: usize, probe: &str| {
            format!(
                "candidates AS ( \
                     SELECT o.id, r.subscriber \
                     FROM {outbox} AS o \
                     JOIN unnest($1::text[], $2::text[], $3::text[]) AS r (subscriber, app, event_name) \
                       ON r.event_name = o.event_name \
                      AND (r.app IS NULL OR o.app IS NULL OR o.app = r.app) \
                     WHERE {scope} \
                     UNION ALL \
                     SELECT o.id, c.subscriber \
                     FROM {outbox} AS o \
                     CROSS JOIN unnest($4::text[]) AS c (subscriber) \
                     WHERE {scope} \
                     UNION ALL \
                     SELECT o.id, ${m}::text \
                     FROM {outbox} AS o \
                     WHERE ${m}::text IS NOT NULL AND {scope} AND EXISTS ( \
                         SELECT 1 FROM unnest(${}::text[], ${}::text[], ${}::text[], \
                                              ${}::text[], ${}::timestamp[]) \
                             AS m (event_name, app, resource_type, event_type, since) \
                         WHERE (m.event_name IS NULL OR m.event_name = o.event_name) \
                           AND (m.app IS NULL OR m.app = COALESCE(o.app, '')) \
                           AND (m.resource_type IS NULL OR m.resource_type = o.resource_type) \
                           AND (m.event_type IS NULL OR m.event_type = o.event_type) \
                           AND (m.since IS NULL OR o.created_at >= m.since)) \
                 ), fresh AS ( \
                     SELECT c.id, c.subscriber \
                     FROM candidates AS c \
                     WHERE NOT EXISTS ( \
                         SELECT 1 FROM {deliveries} AS d \
                         WHERE d.event_id = c.id AND d.subscriber = c.subscriber {probe}) \
                 )",
                m + 1,
                m + 2,
                m + 3,
                m + 4,
                m + 5
            )
        };
        // A scan: writes the rows, returns how many and the database time
        // the statement ran at (the next scan's watermark). Events younger
        // than $6 seconds are left to their notification (and the next
        // scan): a scan writing a row first would leave it unclaimed, and
        // hold up the notified expansion of the same event until it ends.
        let expand_since = format!(
            "WITH {}, inserted AS ( \
                 INSERT INTO {deliveries} (event_id, subscriber, next_attempt_at) \
                 SELECT f.id, f.subscriber, {NOW} FROM fresh AS f \
                 ON CONFLICT DO NOTHING \
                 RETURNING 1 \
             ) \
             SELECT (SELECT count(*) FROM inserted), {NOW}",
            fresh(
                &format!("o.created_at >= $5 AND o.created_at < {NOW} - make_interval(secs => $6)"),
                7,
                ""
            )
        );
        // Each of `rows` (with a `subscriber` column), and whether it is
        // within its subscriber's room: the room listed for it in ${p},
        // ${p + 1} (names and rows), or ${p + 2}, its rows taken in `order`.
        let within_room = |rows: &str, order: &str, p: usize| {
            format!(
                "SELECT x.*, \
                     row_number() OVER (PARTITION BY x.subscriber {order}) \
                         <= COALESCE(r.room, ${}) AS within_room \
                 FROM {rows} AS x \
                 LEFT JOIN unnest(${p}::text[], ${}::int8[]) AS r (subscriber, room) \
                   ON r.subscriber = x.subscriber",
                p + 2,
                p + 1
            )
        };
        // New rows of the events in `scope` are written already claimed,
        // within each subscriber's room ($7, $8: name and rows, $9 for the
        // rest) and $10 in all, and come back with their event, ready to
        // attempt, so that a new event costs one round trip before its
        // delivery starts. Rows left unclaimed come back without their
        // event. `{scope}` reads $5 (`start_from`) and $6.
        let expand_claiming = |scope: &str| {
            format!(
                "WITH {}, ranked AS ({}), chosen AS ( \
                     SELECT k.id, k.subscriber, k.within_room \
                         AND sum(k.within_room::int) OVER (ROWS UNBOUNDED PRECEDING) <= $10 AS claimed \
                     FROM ranked AS k \
                 ), inserted AS ( \
                     INSERT INTO {deliveries} (event_id, subscriber, next_attempt_at, processing_since) \
                     SELECT c.id, c.subscriber, {NOW}, CASE WHEN c.claimed THEN {NOW} END \
                     FROM chosen AS c \
                     ON CONFLICT DO NOTHING \
                     RETURNING event_id, subscriber, retry_count, processing_since \
                 ), written AS ( \
                     SELECT i.event_id, i.subscriber, i.retry_count, i.processing_since, \
                         o.event_name, o.resource_type, o.resource_id, o.event_type, o.app, \
                         o.payload::text AS payload, o.created_at \
                     FROM inserted AS i \
                     LEFT JOIN {outbox} AS o ON o.id = i.event_id AND i.processing_since IS NOT NULL \
                 )",
                fresh(scope, 11, "OFFSET 0"),
                within_room("fresh", "", 7)
            )
        };
        // Every expansion that claims returns one row more, without an
        // event: the database time the statement ran at (the mark of the
        // next expansion of the newest events) and how many of the notified
        // ids name no event (a payload that only looked like an id).
        let with_marker = |scope: &str, unknown: &str| {
            format!(
                "{} SELECT w.*, NULL::timestamp AS ran_at, NULL::int8 AS unknown FROM written AS w \
                 UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
                     {NOW}, {unknown}",
                expand_claiming(scope)
            )
        };
        // Notified events ($6, their ids).
        let expand_ids = with_marker(
            "o.id = ANY($6::uuid[]) AND o.created_at >= $5",
            &format!(
                "(SELECT count(*) FROM unnest($6::uuid[]) AS n (id) \
                  WHERE NOT EXISTS (SELECT 1 FROM {outbox} AS o WHERE o.id = n.id))"
            ),
        );
        // The newest events, created at or after $6: what a notification
        // that names no event asks for. The upper bound, always true of a
        // committed event, is there for the planner: a generic plan cannot
        // tell how recent $6 is, and reads a range with both ends (not an
        // open one) through an index on `created_at`.
        let expand_newest = with_marker(
            &format!(
                "o.created_at >= $6::timestamp AND o.created_at >= $5 AND o.created_at <= {NOW}"
            ),
            "0",
        );

        // The claim: the most overdue due rows ($6 at most) of registered
        // (subscriber, event name) pairs ($3 subscribes to every name; $4,
        // $5 pair by pair) whose subscriber has room ($7 have none), locked
        // with SKIP LOCKED so that concurrent claimers (other tasks, other
        // processes) never take the same row; a row another claimer has
        // just committed fails the re-checked predicate. Of those, each
        // subscriber's share is cut to its room ($8, $9: name and rows, $10
        // for the rest): the rows past it stay as they are, unlocked at the
        // end of the statement. Exhausted rows (retry_count past $1) are
        // never due, nor are rows skipped while their webhook was disabled
        // (no retry, no time due, the skip's reason): they wait for a
        // resend, not for the webhook to be enabled.
        let claim = format!(
            "WITH due AS ( \
                 SELECT d.event_id, d.subscriber, d.next_attempt_at \
                 FROM {deliveries} AS d \
                 JOIN {outbox} AS o ON o.id = d.event_id \
                 WHERE d.processed_at IS NULL \
                   AND d.retry_count <= $1 \
                   AND (d.next_attempt_at IS NULL OR d.next_attempt_at <= {NOW}) \
                   AND (d.processing_since IS NULL \
                        OR d.processing_since < {NOW} - make_interval(secs => $2)) \
                   AND (d.subscriber = ANY($3::text[]) \
                        OR (d.subscriber, o.event_name) IN ( \
                            SELECT s, e FROM unnest($4::text[], $5::text[]) AS r (s, e))) \
                   AND NOT (d.subscriber = ANY($7::text[])) \
                   AND NOT {skipped} \
                 ORDER BY d.next_attempt_at \
                 LIMIT $6 \
                 FOR UPDATE OF d SKIP LOCKED \
             ), shares AS ( \
                 SELECT s.event_id, s.subscriber FROM ({}) AS s WHERE s.within_room \
             ) \
             UPDATE {deliveries} AS d \
             SET processing_since = {NOW} \
             FROM shares, {outbox} AS o \
             WHERE d.event_id = shares.event_id AND d.subscriber = shares.subscriber \
               AND o.id = d.event_id \
             RETURNING d.event_id, d.subscriber, d.retry_count, d.processing_since, \
                 o.event_name, o.resource_type, o.resource_id, o.event_type, o.app, \
                 o.payload::text AS payload, o.created_at",
            within_room("due", "ORDER BY x.next_attempt_at", 8),
            skipped = skipped_row("d"),
        );

        // An ordered subscriber's claim ($1): its head, the first of its
        // rows in recording order (`created_at`, then id) among the event
        // names it is registered for ($3) that is neither processed,
        // exhausted (retry_count past $2) nor skipped, claimed only if it is
        // due, not claimed (or its claim is older than $4 seconds) and no
        // other row of the subscriber is in flight (a row whose event
        // committed late, behind one already sent, is not sent beside it).
        // The head is locked FOR UPDATE, without SKIP LOCKED, so that
        // concurrent claimers (other processes on the same tables) queue on
        // it: the second re-reads it once the first commits, finds it
        // claimed and takes nothing. Its choice does not depend on claims,
        // only on what ends a row, so that a claimer that waited can never
        // move past a head in flight to the row behind it. The regular
        // claim and expansions never claim an ordered subscriber's rows
        // (they are given no room there).
        let claim_head = format!(
            "WITH head AS ( \
                 SELECT d.event_id, d.subscriber \
                 FROM {deliveries} AS d \
                 JOIN {outbox} AS o ON o.id = d.event_id \
                 WHERE d.subscriber = $1 \
                   AND d.processed_at IS NULL \
                   AND d.retry_count <= $2 \
                   AND NOT {skipped} \
                   AND o.event_name = ANY($3::text[]) \
                 ORDER BY o.created_at, o.id \
                 LIMIT 1 \
                 FOR UPDATE OF d \
             ) \
             UPDATE {deliveries} AS d \
             SET processing_since = {NOW} \
             FROM head, {outbox} AS o \
             WHERE d.event_id = head.event_id AND d.subscriber = head.subscriber \
               AND o.id = d.event_id \
               AND (d.next_attempt_at IS NULL OR d.next_attempt_at <= {NOW}) \
               AND (d.processing_since IS NULL \
                    OR d.processing_since < {NOW} - make_interval(secs => $4)) \
               AND NOT EXISTS ( \
                   SELECT 1 FROM {deliveries} AS f \
                   WHERE f.subscriber = $1 AND f.processed_at IS NULL \
                     AND f.event_id <> d.event_id \
                     AND f.processing_since >= {NOW} - make_interval(secs => $4)) \
             RETURNING d.event_id, d.subscriber, d.retry_count, d.processing_since, \
                 o.event_name, o.resource_type, o.resource_id, o.event_type, o.app, \
                 o.payload::text AS payload, o.created_at",
            skipped = skipped_row("d"),
        );

        // Outcomes, one array element each. A delivery closes the row
        // whoever holds the claim now (it was delivered); anything else
        // applies only to the claim it came from, so that a late answer from
        // a claim that went stale and was taken over cannot count twice.
        let complete = format!(
            "UPDATE {deliveries} AS d \
             SET processed_at = CASE WHEN c.kind = 'delivered' THEN {NOW} END, \
                 retry_count = d.retry_count \
                     + CASE WHEN c.kind IN ('retry', 'exhausted') THEN 1 ELSE 0 END, \
                 last_error = COALESCE(c.error, d.last_error), \
                 processing_since = NULL, \
                 next_attempt_at = CASE c.kind \
                     WHEN 'retry' THEN {NOW} + make_interval(secs => c.wait) \
                     WHEN 'postponed' THEN {NOW} + make_interval(secs => c.wait) \
                     WHEN 'exhausted' THEN NULL \
                     WHEN 'skipped' THEN NULL \
                     ELSE d.next_attempt_at END \
             FROM unnest($1::uuid[], $2::text[], $3::timestamp[], $4::text[], $5::text[], \
                         $6::float8[]) AS c (event_id, subscriber, claimed_at, kind, error, wait) \
             WHERE d.event_id = c.event_id AND d.subscriber = c.subscriber \
               AND d.processed_at IS NULL \
               AND (c.kind = 'delivered' OR d.processing_since = c.claimed_at)"
        );
        // A webhook whose breaker closed again: its rows waiting for a later
        // attempt (held while it was open, or backing off) are due now, and
        // its exhausted rows among the events `$2` (which the hub's own
        // attempt history names: attempted while it was failing) start
        // again with a fresh retry count. An exhausted row is one with no
        // next attempt and an attempt counted; a skipped row has none. Rows
        // in flight are left to their attempts.
        let release_subscriber = format!(
            "UPDATE {deliveries} AS d \
             SET retry_count = CASE WHEN d.next_attempt_at IS NULL THEN 0 ELSE d.retry_count END, \
                 next_attempt_at = {NOW} \
             WHERE d.subscriber = $1 AND d.processed_at IS NULL \
               AND d.processing_since IS NULL \
               AND (d.next_attempt_at > {NOW} \
                    OR (d.next_attempt_at IS NULL AND d.retry_count > 0 \
                        AND d.event_id = ANY($2::uuid[])))"
        );
        Self {
            timeout,
            expand_since: expand_since.into(),
            expand_ids: expand_ids.into(),
            expand_newest: expand_newest.into(),
            claim: claim.into(),
            claim_head: claim_head.into(),
            complete: complete.into(),
            release_subscriber: release_subscriber.into(),
        }
    }

    /// `subscriber`'s webhook recovered: its waiting rows are due now, and
    /// its exhausted rows of the events `reopen` start again. Returns how
    /// many rows it released.
    pub(crate) async fn release_subscriber(
        &self,
        pool: &PgPool,
        subscriber: &str,
        reopen: &[Uuid],
    ) -> Result<u64, sqlx::Error> {
        let released = sqlx::query(AssertSqlSafe(self.release_subscriber.clone()))
            .bind(subscriber)
            .bind(reopen);
        let released = bounded(self.timeout, pool, async move |connection| {
            released.execute(connection).await
        });
        Ok(released.await?.rows_affected())
    }

    /// Writes the missing delivery rows for events created at or after
    /// `since` and at least `spare` ago. Returns how many and the database
    /// time the statement ran at.
    pub(crate) async fn expand(
        &self,
        pool: &PgPool,
        subscriptions: &Registrations,
        since: NaiveDateTime,
        spare: Duration,
    ) -> Result<(u64, NaiveDateTime), sqlx::Error> {
        let scan = async |connection: &mut PgConnection| {
            let mut tx = sqlx::Connection::begin(connection).await?;
            // The feed's sessions force generic plans, which cannot tell a
            // window of seconds from one of months: a scan is planned for
            // its own window, so that a recent one reads an index on
            // `created_at` (if there is one) and probes the deliveries
            // table per event, while a catch-up over the whole history reads
            // both tables straight through.
            sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan")
                .execute(&mut *tx)
                .await?;
            let query = subscriptions
                .bind_to(sqlx::query(AssertSqlSafe(self.expand_since.clone())))
                .bind(since)
                .bind(spare.as_secs_f64());
            let row = subscriptions
                .bind_matches_to(query)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(row)
        };
        let row = bounded(self.timeout, pool, scan).await?;
        let written: i64 = row.try_get(0)?;
        Ok((u64::try_from(written).unwrap_or(0), row.try_get(1)?))
    }

    /// Writes the missing delivery rows of `events` (created at or after
    /// `since`), claiming those within `rooms`.
    pub(crate) async fn expand_and_claim(
        &self,
        pool: &PgPool,
        subscriptions: &Registrations,
        since: NaiveDateTime,
        events: NewEvents<'_>,
        rooms: &Rooms,
    ) -> Result<ClaimingExpansion, sqlx::Error> {
        let statement = match events {
            NewEvents::Notified(_) => &self.expand_ids,
            NewEvents::CreatedSince(_) => &self.expand_newest,
        };
        let query = subscriptions
            .bind_to(sqlx::query(AssertSqlSafe(statement.clone())))
            .bind(since);
        let query = match events {
            NewEvents::Notified(ids) => query.bind(ids),
            NewEvents::CreatedSince(at) => query.bind(at),
        };
        let query = query
            .bind(&rooms.subscribers)
            .bind(&rooms.rows)
            .bind(rooms.default)
            .bind(i64::try_from(rooms.total).unwrap_or(i64::MAX));
        let query = subscriptions.bind_matches_to(query);
        let rows = bounded(self.timeout, pool, async move |connection| {
            query.fetch_all(connection).await
        })
        .await?;
        let mut expansion = ClaimingExpansion {
            claimed: Vec::with_capacity(rows.len()),
            unclaimed: 0,
            ran_at: None,
            unknown_ids: 0,
        };
        for row in &rows {
            let event: Option<Uuid> = row.try_get("event_id")?;
            let claimed_at: Option<NaiveDateTime> = row.try_get("processing_since")?;
            match (event, claimed_at) {
                (None, _) => {
                    expansion.ran_at = row.try_get("ran_at")?;
                    let unknown: i64 = row.try_get("unknown")?;
                    expansion.unknown_ids = usize::try_from(unknown).unwrap_or(0);
                }
                (Some(_), Some(_)) => expansion.claimed.push(claimed_row(row)?),
                (Some(_), None) => expansion.unclaimed += 1,
            }
        }
        Ok(expansion)
    }

    /// Claims up to `limit` due rows, no more of each subscriber than its
    /// room in `rooms`; see the statement for the rules.
    pub(crate) async fn claim(
        &self,
        pool: &PgPool,
        subscriptions: &Registrations,
        max_retries: u32,
        visibility: Duration,
        rooms: &Rooms,
        limit: usize,
    ) -> Result<Vec<ClaimedRow>, sqlx::Error> {
        let rows = sqlx::query(AssertSqlSafe(self.claim.clone()))
            .bind(i64::from(max_retries))
            .bind(visibility.as_secs_f64())
            .bind(subscriptions.claimed_whatever_the_name())
            .bind(&subscriptions.subscribers)
            .bind(&subscriptions.event_names)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .bind(rooms.saturated())
            .bind(&rooms.subscribers)
            .bind(&rooms.rows)
            .bind(rooms.default);
        let rows = bounded(self.timeout, pool, async move |connection| {
            rows.fetch_all(connection).await
        })
        .await?;
        rows.iter().map(claimed_row).collect()
    }

    /// Claims the head of ordered `subscriber`'s line (its rows of
    /// `event_names`), if it is due and nothing of the subscriber is in
    /// flight; see the statement for the rules.
    pub(crate) async fn claim_head(
        &self,
        pool: &PgPool,
        subscriber: &str,
        event_names: &[String],
        max_retries: u32,
        visibility: Duration,
    ) -> Result<Option<ClaimedRow>, sqlx::Error> {
        let row = sqlx::query(AssertSqlSafe(self.claim_head.clone()))
            .bind(subscriber)
            .bind(i64::from(max_retries))
            .bind(event_names)
            .bind(visibility.as_secs_f64());
        let row = bounded(self.timeout, pool, async move |connection| {
            row.fetch_optional(connection).await
        })
        .await?;
        row.as_ref().map(claimed_row).transpose()
    }

    /// Records outcomes in one statement.
    pub(crate) async fn complete(
        &self,
        pool: &PgPool,
        completions: &[RowCompletion],
    ) -> Result<(), sqlx::Error> {
        let mut event_ids = Vec::with_capacity(completions.len());
        let mut subscribers = Vec::with_capacity(completions.len());
        let mut claimed_at = Vec::with_capacity(completions.len());
        let mut kinds = Vec::with_capacity(completions.len());
        let mut errors: Vec<Option<&str>> = Vec::with_capacity(completions.len());
        let mut waits: Vec<Option<f64>> = Vec::with_capacity(completions.len());
        for completion in completions {
            event_ids.push(completion.event_id);
            subscribers.push(completion.subscriber.as_str());
            claimed_at.push(completion.claimed_at);
            let (kind, error, wait) = match &completion.outcome {
                RowOutcome::Delivered => ("delivered", None, None),
                RowOutcome::Retry { error, wait } => {
                    ("retry", Some(error.as_str()), Some(wait.as_secs_f64()))
                }
                RowOutcome::Exhausted { error } => ("exhausted", Some(error.as_str()), None),
                RowOutcome::Postponed { error, wait } => {
                    ("postponed", Some(error.as_str()), Some(wait.as_secs_f64()))
                }
                RowOutcome::Held { wait } => ("postponed", None, Some(wait.as_secs_f64())),
                RowOutcome::Released => ("released", None, None),
                RowOutcome::Skipped => ("skipped", Some(SKIPPED_REASON), None),
            };
            kinds.push(kind);
            errors.push(error);
            waits.push(wait);
        }
        let done = sqlx::query(AssertSqlSafe(self.complete.clone()))
            .bind(event_ids)
            .bind(subscribers)
            .bind(claimed_at)
            .bind(kinds)
            .bind(errors)
            .bind(waits);
        bounded(self.timeout, pool, async move |connection| {
            done.execute(connection).await
        })
        .await?;
        Ok(())
    }
}

/// Whether `tables`' outbox has an index led by `created_at` (see
/// [`super::scan_index_ddl`]), and the planner's estimate of its rows
/// (negative when it has never been analyzed).
pub(crate) async fn scan_index(
    connection: &mut PgConnection,
    tables: &OutboxTables,
) -> Result<(bool, f64), sqlx::Error> {
    let row = sqlx::query(
        "SELECT EXISTS ( \
             SELECT 1 FROM pg_index AS i \
             JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = c.oid AND i.indisvalid AND a.attname = 'created_at'), \
             c.reltuples::float8 \
         FROM pg_class AS c WHERE c.oid = $1::regclass",
    )
    .bind(tables.outbox_sql())
    .fetch_one(connection)
    .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// How many delivery rows of `subscribers` are due, retrying or in flight
/// (not exhausted past `max_retries`), and the age in seconds of the oldest
/// of their events (0 for none), by the database's clock.
pub(crate) async fn undelivered(
    connection: &mut PgConnection,
    tables: &OutboxTables,
    subscribers: &[String],
    max_retries: u32,
) -> Result<(u64, f64), sqlx::Error> {
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT count(*), \
             COALESCE(EXTRACT(EPOCH FROM {NOW} - min(o.created_at))::float8, 0) \
         FROM {} AS d JOIN {} AS o ON o.id = d.event_id \
         WHERE d.processed_at IS NULL AND d.retry_count <= $1 AND d.subscriber = ANY($2)",
        tables.deliveries_sql(),
        tables.outbox_sql()
    )))
    .bind(i64::from(max_retries))
    .bind(subscribers)
    .fetch_one(connection)
    .await?;
    let rows: i64 = row.try_get(0)?;
    let age: f64 = row.try_get(1)?;
    Ok((u64::try_from(rows).unwrap_or(0), age.max(0.0)))
}

/// Whether the delivery row `alias` was skipped while its webhook was
/// disabled: never tried, no time due, the skip's reason kept. One
/// definition for the claim, which leaves such rows to a resend, and for
/// the operator's listing.
pub(crate) fn skipped_row(alias: &str) -> String {
    format!(
        "({alias}.next_attempt_at IS NULL AND {alias}.retry_count = 0 \
         AND {alias}.last_error IS NOT DISTINCT FROM '{SKIPPED_REASON}')"
    )
}
