-- The hub's event log; the contract is websub_hub::events::EventLog.
-- The same tables as the PostgreSQL backend's wherever the dialects allow:
-- ids are 16-byte BLOBs (a UUID's bytes), timestamps INTEGER microseconds
-- since the Unix epoch (exact comparisons and index ranges, the precision
-- the contract round-trips).

CREATE TABLE websub_events (
    -- UUIDv7, assigned by the hub: unique and roughly time-ordered.
    id           BLOB    NOT NULL PRIMARY KEY,
    topic        TEXT    NOT NULL,
    -- The topic's Content-Type, parameters included, delivered as is.
    content_type TEXT    NOT NULL,
    body         BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    -- NULL until the event's delivery rows are written. An event recorded but
    -- never expanded (the process died in between) is found again through
    -- the partial index below.
    expanded_at  INTEGER NULL
);

-- unexpanded(): oldest first among the few events not yet expanded.
CREATE INDEX websub_events_unexpanded
    ON websub_events (created_at, id)
    WHERE expanded_at IS NULL;

-- purge_before(): retention deletes by age.
CREATE INDEX websub_events_created_at
    ON websub_events (created_at);

-- One row per (event, subscriber). A rowid table on purpose: expansion
-- appends to the table's b-tree, and claim() addresses the rows it picked by
-- rowid.
CREATE TABLE websub_deliveries (
    event_id         BLOB    NOT NULL REFERENCES websub_events (id) ON DELETE CASCADE,
    -- The subscription's callback URL (or a configured webhook's name).
    subscriber       TEXT    NOT NULL,
    -- Set when delivered or dropped; NULL while pending or exhausted.
    processed_at     INTEGER NULL,
    retry_count      INTEGER NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    last_error       TEXT    NULL,
    -- Set by a claim while an attempt is in flight; a claim older than the
    -- dispatcher's visibility timeout belongs to a dead process.
    processing_since INTEGER NULL,
    -- When the row is due; NULL once processed or exhausted, so that neither
    -- is ever claimed again.
    next_attempt_at  INTEGER NULL,
    -- The leading column serves the ON DELETE CASCADE and deliveries().
    PRIMARY KEY (event_id, subscriber)
);

-- claim(): due rows in due order. Processed rows leave the index, so it holds
-- only the backlog (pending, in flight, retrying, exhausted).
CREATE INDEX websub_deliveries_pending
    ON websub_deliveries (next_attempt_at)
    WHERE processed_at IS NULL;
