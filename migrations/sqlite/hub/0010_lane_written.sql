-- A record's lane becomes a plain column, written once by the statement that
-- inserts the record (websub_hub::events::sqlite::statements spells the rule
-- in SQL, websub_hub::dispatch::lane_of in Rust). As a generated column
-- SQLite computed it again at every update that maintains an index on it,
-- about five times per record: a sixth of the log's work in a fan-out.
-- Processed records leave both lane indexes and are never reopened, so only
-- the others need a lane.
DROP INDEX websub_deliveries_lane;
DROP INDEX websub_deliveries_ordered;
ALTER TABLE websub_deliveries DROP COLUMN lane;
ALTER TABLE websub_deliveries ADD COLUMN lane TEXT NULL;

UPDATE websub_deliveries
SET lane = CASE WHEN order_key IS NOT NULL THEN subscriber WHEN instr(subscriber, '://') = 0 THEN subscriber ELSE substr(substr(substr(subscriber, instr(subscriber, '://') + 3), 1, instr(replace(replace(substr(subscriber, instr(subscriber, '://') + 3), '?', '/'), '#', '/') || '/', '/') - 1), instr(substr(substr(subscriber, instr(subscriber, '://') + 3), 1, instr(replace(replace(substr(subscriber, instr(subscriber, '://') + 3), '?', '/'), '#', '/') || '/', '/') - 1), '@') + 1) END
WHERE processed_at IS NULL;

CREATE INDEX websub_deliveries_lane
    ON websub_deliveries (lane, next_attempt_at)
    WHERE processed_at IS NULL;

CREATE INDEX websub_deliveries_ordered
    ON websub_deliveries (lane, order_key, event_id)
    WHERE processed_at IS NULL AND order_key IS NOT NULL;
