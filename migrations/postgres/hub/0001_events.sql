-- The hub's event log; the contract is websub_hub::events::EventLog.
-- The same two-table shape as a producer's outbox: an event row says what
-- happened, a delivery row per subscriber says who was told and how it went.

CREATE TABLE websub_events (
    -- UUIDv7, assigned by the hub: unique and roughly time-ordered.
    id           UUID        PRIMARY KEY,
    topic        TEXT        NOT NULL,
    -- The topic's Content-Type, parameters included, delivered as is.
    content_type TEXT        NOT NULL,
    body         BYTEA       NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    -- NULL until the event's delivery rows are written. An event recorded but
    -- never expanded (the process died in between) is found again through
    -- the partial index below.
    expanded_at  TIMESTAMPTZ NULL
);

-- unexpanded(): oldest first among the few events not yet expanded. Almost
-- every event is expanded moments after it is recorded, so the index stays
-- tiny however long the table grows.
CREATE INDEX websub_events_unexpanded
    ON websub_events (created_at, id)
    WHERE expanded_at IS NULL;

-- purge_before(): retention deletes by age.
CREATE INDEX websub_events_created_at
    ON websub_events (created_at);

-- One row per (event, subscriber).
--
-- fillfactor 50: inserts fill pages only half way, so that every row's claim
-- (which changes no indexed column) finds room for its new version on its
-- own page and is a HOT update, writing no index entry. A completion changes
-- indexed columns and cannot be HOT; by then the claim's old versions are
-- pruned and their space reused. The table is twice the size for it; the
-- claim costs about half.
CREATE TABLE websub_deliveries (
    -- REFERENCES websub_events (id) ON DELETE CASCADE, enforced by the
    -- statement-level triggers below rather than by a FOREIGN KEY clause.
    event_id         UUID        NOT NULL,
    -- The subscription's callback URL (or a configured webhook's name).
    -- COLLATE "C": byte order, compared with memcmp rather than the
    -- database locale's strcoll. URLs need no linguistic order, and every
    -- expansion, claim and completion compares these in the primary key.
    subscriber       TEXT COLLATE "C" NOT NULL,
    -- Set when delivered or dropped; NULL while pending or exhausted.
    processed_at     TIMESTAMPTZ NULL,
    retry_count      INT         NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    last_error       TEXT        NULL,
    -- Set by a claim while an attempt is in flight; a claim older than the
    -- dispatcher's visibility timeout belongs to a dead process.
    processing_since TIMESTAMPTZ NULL,
    -- When the row is due; NULL once processed or exhausted, so that neither
    -- is ever claimed again.
    next_attempt_at  TIMESTAMPTZ NULL,
    -- The leading column serves the cascade and deliveries().
    PRIMARY KEY (event_id, subscriber)
) WITH (fillfactor = 50);

-- claim(): due rows in due order. Processed rows leave the index, so it holds
-- only the backlog (pending, in flight, retrying, exhausted).
CREATE INDEX websub_deliveries_pending
    ON websub_deliveries (next_attempt_at)
    WHERE processed_at IS NULL;

-- The foreign key from websub_deliveries.event_id to websub_events.id, with
-- ON DELETE CASCADE, checked once per statement instead of once per row.
--
-- A FOREIGN KEY clause checks every inserted row with its own query and row
-- lock: two thirds of the time of expanding an event to 100 000 subscribers
-- (0.7 s of 1.0). Expansion inserts thousands of rows for one event per
-- statement, so the check here locks each distinct event once, as the
-- foreign key would (FOR KEY SHARE: a concurrent delete waits for the insert
-- to commit, then cascades to its rows), and fails the statement if one is
-- missing. The cascade deletes the rows of every deleted event in one
-- statement; under READ COMMITTED it runs on a fresh snapshot, so it sees
-- rows whose insert committed while the delete waited. (A deleting
-- transaction at REPEATABLE READ would not: delete events at READ COMMITTED,
-- as purge_before does.)

CREATE FUNCTION websub_deliveries_check_events() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
DECLARE
    wanted BIGINT;
    found  BIGINT;
BEGIN
    SELECT count(DISTINCT event_id) INTO wanted FROM inserted;
    SELECT count(*) INTO found FROM (
        SELECT 1 FROM websub_events
        WHERE id IN (SELECT event_id FROM inserted)
        FOR KEY SHARE
    ) AS locked;
    IF found <> wanted THEN
        RAISE EXCEPTION 'websub_deliveries.event_id names a missing websub_events row'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER websub_deliveries_check_events
    AFTER INSERT ON websub_deliveries
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION websub_deliveries_check_events();

-- The cascade probes the primary key once per deleted event. The SET clauses
-- keep a planner with stale statistics from scanning the whole table instead.
CREATE FUNCTION websub_events_cascade_deliveries() RETURNS TRIGGER
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    DELETE FROM websub_deliveries
    WHERE event_id = ANY (ARRAY (SELECT id FROM deleted));
    RETURN NULL;
END
$$;

CREATE TRIGGER websub_events_cascade_deliveries
    AFTER DELETE ON websub_events
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION websub_events_cascade_deliveries();

-- Neither key ever changes; refusing it keeps the check and the cascade
-- complete without handling updates.
CREATE FUNCTION websub_refuse_key_update() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%.% cannot be updated', TG_TABLE_NAME, TG_ARGV[0]
        USING ERRCODE = 'foreign_key_violation';
END
$$;

CREATE TRIGGER websub_events_id_fixed
    BEFORE UPDATE OF id ON websub_events
    FOR EACH ROW EXECUTE FUNCTION websub_refuse_key_update('id');

CREATE TRIGGER websub_deliveries_event_id_fixed
    BEFORE UPDATE OF event_id ON websub_deliveries
    FOR EACH ROW EXECUTE FUNCTION websub_refuse_key_update('event_id');

-- The two statements the dispatcher runs in its loop, as functions so that
-- their plans do not depend on table statistics.
--
-- Right after a large expansion (or whenever autovacuum has not analysed the
-- table since the backlog grew) the planner believes the backlog is tiny.
-- Planned from that belief, a claim reads every due record through a bitmap
-- and sorts them all (70 ms instead of 5 for 500 of 100 000 due records), and
-- a completion hashes the whole backlog to join 500 rows. The only good plans
-- are the obvious ones: walk the pending index in due order and stop at the
-- limit; probe the primary key once per completion. The SET clauses rule the
-- others out for these statements alone (a disabled plan type only costs
-- more, so nothing fails if no other plan exists); PL/pgSQL caches the plans
-- per connection, as a prepared statement would.

-- claim(): see EventLog::claim. The subquery picks and locks due rows,
-- skipping those another claimer holds; a row another claimer has just
-- claimed and committed fails the re-checked predicate. The UPDATE then
-- finds each row by ctid (stable while this statement holds the row lock).
CREATE FUNCTION websub_claim_deliveries(
    claim_at     TIMESTAMPTZ,
    stale_before TIMESTAMPTZ,
    max_rows     BIGINT
) RETURNS TABLE (event_id UUID, topic TEXT, subscriber TEXT, retry_count INT)
LANGUAGE plpgsql
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE websub_deliveries AS d
    SET processing_since = claim_at
    FROM websub_events AS e
    WHERE d.ctid = ANY (ARRAY (
            SELECT ctid FROM websub_deliveries
            WHERE processed_at IS NULL
              AND next_attempt_at <= claim_at
              AND (processing_since IS NULL OR processing_since < stale_before)
            ORDER BY next_attempt_at
            LIMIT max_rows
            FOR UPDATE SKIP LOCKED))
      AND e.id = d.event_id
    RETURNING d.event_id, e.topic, d.subscriber::TEXT, d.retry_count;
END
$$;

-- complete(): see EventLog::complete; one element of each array per
-- completion. `processed_at IS NULL` keeps a late completion (from a
-- dispatcher whose claim went stale and was taken over) from reopening or
-- re-counting a closed record. Only retry and exhausted count an attempt;
-- a delivered outcome has no error, so the last failure stays readable.
CREATE FUNCTION websub_complete_deliveries(
    event_ids     UUID[],
    subscribers   TEXT[],
    kinds         TEXT[],
    errors        TEXT[],
    next_attempts TIMESTAMPTZ[],
    completed_at  TIMESTAMPTZ
) RETURNS VOID
LANGUAGE plpgsql
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    UPDATE websub_deliveries AS d
    SET processed_at = CASE WHEN c.kind IN ('delivered', 'dropped') THEN completed_at END,
        retry_count = d.retry_count
            + CASE WHEN c.kind IN ('retry', 'exhausted') THEN 1 ELSE 0 END,
        last_error = COALESCE(c.error, d.last_error),
        processing_since = NULL,
        next_attempt_at = c.next_attempt_at
    FROM unnest(event_ids, subscribers, kinds, errors, next_attempts)
        AS c (event_id, subscriber, kind, error, next_attempt_at)
    WHERE d.event_id = c.event_id
      AND d.subscriber = c.subscriber
      AND d.processed_at IS NULL;
END
$$;
