-- Lanes: the delivery records of one callback host (its authority, as
-- written, less any credentials) are claimed together, in due order, and
-- only as many as the host can take soon (see websub_hub::dispatch::lanes).
-- The lane is derived from the subscriber by the database, so every way a
-- record is written carries it; websub_hub::dispatch::lane_of spells the
-- same rule in Rust, and the event log's tests hold the two together.
ALTER TABLE websub_deliveries ADD COLUMN lane TEXT COLLATE "C"
    GENERATED ALWAYS AS (
        CASE WHEN strpos(subscriber, '://') = 0 THEN subscriber::TEXT
             ELSE substring(subscriber FROM '://(?:[^/?#@]*@)?([^/?#]*)')
        END) STORED;

-- claim_lanes() and due_lanes(): a lane's due records in due order, and the
-- lanes with any record not processed (walked one lane at a time).
CREATE INDEX websub_deliveries_lane
    ON websub_deliveries (lane, next_attempt_at)
    WHERE processed_at IS NULL;

-- claim_lanes(): for each lane asked for, up to its count of due records,
-- most overdue first. Concurrent claimers skip each other's rows. The
-- planner settings are websub_claim_deliveries' (0001): the lane index,
-- whatever the statistics say.
CREATE FUNCTION websub_claim_lanes(
    claim_at     TIMESTAMPTZ,
    stale_before TIMESTAMPTZ,
    lanes        TEXT[],
    counts       BIGINT[]
) RETURNS TABLE (event_id UUID, topic TEXT, subscriber TEXT, retry_count INT)
LANGUAGE plpgsql
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
BEGIN
    FOR i IN 1 .. coalesce(array_length(lanes, 1), 0) LOOP
        RETURN QUERY
        UPDATE websub_deliveries AS d
        SET processing_since = claim_at
        FROM websub_events AS e
        WHERE d.ctid = ANY (ARRAY (
                SELECT ctid FROM websub_deliveries
                WHERE lane = lanes[i]
                  AND processed_at IS NULL
                  AND next_attempt_at <= claim_at
                  AND (processing_since IS NULL OR processing_since < stale_before)
                ORDER BY lane, next_attempt_at
                LIMIT counts[i]
                FOR UPDATE SKIP LOCKED))
          AND e.id = d.event_id
        RETURNING d.event_id, e.topic, d.subscriber::TEXT, d.retry_count;
    END LOOP;
END
$$;
