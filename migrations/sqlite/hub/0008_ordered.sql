-- Ordered delivery: a subscription may ask for its events one at a time,
-- strictly in the order the hub recorded them (see
-- websub_hub::dispatch::ordered). The request is kept here, in the hub's own
-- database, whatever store holds the subscriptions; it belongs to the
-- subscription and goes with it.
CREATE TABLE websub_ordered_subscriptions (
    topic      TEXT    NOT NULL,
    callback   TEXT    NOT NULL,
    -- When it was asked for.
    since      INTEGER NOT NULL,
    PRIMARY KEY (topic, callback)
);

-- A record of an ordered subscription carries its event's recording time:
-- its place in the line. NULL for every other record.
ALTER TABLE websub_deliveries ADD COLUMN order_key INTEGER NULL;

-- The lane of an ordered record is its callback, whole: one line per
-- callback, never shared with the callback's host (an authority never holds
-- '://', so the two kinds of lane cannot meet). websub_hub::dispatch::lane_of
-- and ordered_lane_of spell the same rule in Rust.
DROP INDEX websub_deliveries_lane;
ALTER TABLE websub_deliveries DROP COLUMN lane;
ALTER TABLE websub_deliveries ADD COLUMN lane TEXT
    GENERATED ALWAYS AS (CASE WHEN order_key IS NOT NULL THEN subscriber WHEN instr(subscriber, '://') = 0 THEN subscriber ELSE substr(substr(substr(subscriber, instr(subscriber, '://') + 3), 1, instr(replace(replace(substr(subscriber, instr(subscriber, '://') + 3), '?', '/'), '#', '/') || '/', '/') - 1), instr(substr(substr(subscriber, instr(subscriber, '://') + 3), 1, instr(replace(replace(substr(subscriber, instr(subscriber, '://') + 3), '?', '/'), '#', '/') || '/', '/') - 1), '@') + 1) END) VIRTUAL;

CREATE INDEX websub_deliveries_lane
    ON websub_deliveries (lane, next_attempt_at)
    WHERE processed_at IS NULL;

-- claim_ordered(): the head of an ordered lane, in recording order.
CREATE INDEX websub_deliveries_ordered
    ON websub_deliveries (lane, order_key, event_id)
    WHERE processed_at IS NULL AND order_key IS NOT NULL;
