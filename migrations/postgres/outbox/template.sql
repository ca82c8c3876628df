-- The outbox tables of the messaging contract, for a producer's own schema.
-- Names are configurable, the shape is not. The hub ships no migration for
-- them: each producer creates them where its domain tables live.
--
-- Render by replacing <schema> with the schema, e.g.
--
--     sed 's/<schema>/shared/g' template.sql | psql "$DATABASE_URL"
--
-- or print the same DDL, for any table names, with
--
--     websub outbox-ddl --schema shared [--outbox-table T --deliveries-table D]
--
-- Every statement is IF NOT EXISTS: running it again changes nothing.

-- public.uuid_generate_v4(), the id default.
CREATE EXTENSION IF NOT EXISTS "uuid-ossp" WITH SCHEMA public;

CREATE SCHEMA IF NOT EXISTS <schema>;

-- One row per event: what happened. No dispatch state on purpose, so that
-- every consumer sees every event.
CREATE TABLE IF NOT EXISTS <schema>.outbox (
    id            UUID NOT NULL DEFAULT public.uuid_generate_v4() PRIMARY KEY,
    event_name    TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id   TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    app           TEXT,
    payload       JSONB NOT NULL,
    created_at    TIMESTAMP NOT NULL DEFAULT (now() at time zone 'utc')
);

-- One row per (event, subscriber): who was told, and how it went.
CREATE TABLE IF NOT EXISTS <schema>.outbox_deliveries (
    event_id         UUID NOT NULL REFERENCES <schema>.outbox (id) ON DELETE CASCADE,
    subscriber       TEXT NOT NULL,
    processed_at     TIMESTAMP,
    retry_count      INT NOT NULL DEFAULT 0,
    last_error       TEXT,
    processing_since TIMESTAMP,
    next_attempt_at  TIMESTAMP,
    PRIMARY KEY (event_id, subscriber)
);

CREATE INDEX IF NOT EXISTS idx_outbox_deliveries_pending
    ON <schema>.outbox_deliveries (next_attempt_at)
    WHERE processed_at IS NULL;

-- Optional, beyond the contract (`websub outbox-ddl --scan-index` prints it):
-- without an index on created_at, every polling scan and retention sweep
-- reads the whole outbox table. Worth it for an outbox that keeps more than
-- a few thousand events; the producers pay one more index entry per event.
--
-- CREATE INDEX IF NOT EXISTS idx_outbox_created_at ON <schema>.outbox (created_at);
