-- Lanes: the delivery records of one callback host (its authority, as
-- written, less any credentials) are claimed together, in due order, and
-- only as many as the host can take soon (see websub_hub::dispatch::lanes).
-- The lane is derived from the subscriber by SQLite itself, so every way a
-- record is written carries it; websub_hub::dispatch::lane_of spells the
-- same rule in Rust, and the event log's tests hold the two together.
ALTER TABLE websub_deliveries ADD COLUMN lane TEXT
    GENERATED ALWAYS AS (CASE WHEN instr(subscriber, '://') = 0 THEN subscriber ELSE substr(substr(substr(subscriber, instr(subscriber, '://') + 3), 1, instr(replace(replace(substr(subscriber, instr(subscriber, '://') + 3), '?', '/'), '#', '/') || '/', '/') - 1), instr(substr(substr(subscriber, instr(subscriber, '://') + 3), 1, instr(replace(replace(substr(subscriber, instr(subscriber, '://') + 3), '?', '/'), '#', '/') || '/', '/') - 1), '@') + 1) END) VIRTUAL;

-- claim_lanes() and due_lanes(): a lane's due records in due order, and the
-- lanes with any record not processed (walked one lane at a time).
CREATE INDEX websub_deliveries_lane
    ON websub_deliveries (lane, next_attempt_at)
    WHERE processed_at IS NULL;
