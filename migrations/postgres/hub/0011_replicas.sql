-- Replicas sharing this database, and whose claims are whose; see
-- websub_hub::replicas.
--
-- Each websubd registers here at start, beats about once a second and
-- leaves on a clean shutdown. A replica whose beat is older than a few
-- seconds is dead: a live one removes its row and, in the same
-- transaction, hands back its claims (processing_since and claimed_by
-- cleared), so they are claimable at once rather than after the
-- visibility timeout.
CREATE TABLE websub_replicas (
    id         UUID        PRIMARY KEY,
    started_at TIMESTAMPTZ NOT NULL,
    -- The database's clock, not the replica's: replicas on different hosts
    -- judge each other's beats on one clock.
    beat_at    TIMESTAMPTZ NOT NULL
);

-- Who holds a claim: set with processing_since by every claim, meaningful
-- only while processing_since is set (a completion leaves it as it was).
--
-- Not indexed: a claim changes no indexed column of websub_deliveries, so
-- it stays a HOT update (see 0001's fillfactor). The takeover, which looks
-- claims up by holder, runs only when a replica has died, and walks the
-- pending index (the records not processed) rather than the table.
ALTER TABLE websub_deliveries ADD COLUMN claimed_by UUID NULL;
ALTER TABLE websub_fetches ADD COLUMN claimed_by UUID NULL;
ALTER TABLE websub_verifications ADD COLUMN claimed_by UUID NULL;

-- 0001's claim and 0008's lane claim, with the claimer. New overloads, not
-- replacements: a replica of the previous version, still running during a
-- rolling upgrade, calls the old ones (its claims move by the visibility
-- timeout, as they always did).
CREATE FUNCTION websub_claim_deliveries(
    claim_at     TIMESTAMPTZ,
    stale_before TIMESTAMPTZ,
    max_rows     BIGINT,
    claimer      UUID
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
    SET processing_since = claim_at, claimed_by = claimer
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

CREATE FUNCTION websub_claim_lanes(
    claim_at     TIMESTAMPTZ,
    stale_before TIMESTAMPTZ,
    lanes        TEXT[],
    counts       BIGINT[],
    claimer      UUID
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
        SET processing_since = claim_at, claimed_by = claimer
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
