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

-- One row per (event, subscriber). A fillfactor below 100 leaves room on each
-- page so that a claim (which changes no indexed column) can be a HOT update,
-- writing no index entries.
CREATE TABLE websub_deliveries (
    event_id         UUID        NOT NULL REFERENCES websub_events (id) ON DELETE CASCADE,
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
    -- The leading column serves the ON DELETE CASCADE and deliveries().
    PRIMARY KEY (event_id, subscriber)
) WITH (fillfactor = 50);

-- claim(): due rows in due order. Processed rows leave the index, so it holds
-- only the backlog (pending, in flight, retrying, exhausted).
CREATE INDEX websub_deliveries_pending
    ON websub_deliveries (next_attempt_at)
    WHERE processed_at IS NULL;
