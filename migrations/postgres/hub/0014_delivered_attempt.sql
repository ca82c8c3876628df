-- A delivery's successful attempt is kept in its record, written by the
-- update that closes it, rather than as a row of websub_attempts: a
-- delivery that succeeds costs the write of its record's outcome and no
-- more. Failed attempts keep their rows, so a delivery's history is its
-- attempts' rows and, once delivered, its record's attempt
-- (websub_hub::events::EventLog::attempts). NULL for records closed
-- otherwise, and for those delivered before this migration, whose
-- successful attempt is a row of websub_attempts.
ALTER TABLE websub_deliveries
    ADD COLUMN delivered_attempt_at  TIMESTAMPTZ NULL,
    ADD COLUMN delivered_duration_us BIGINT      NULL,
    ADD COLUMN delivered_status      SMALLINT    NULL,
    ADD COLUMN delivered_response    BYTEA       NULL;

-- 0006's completion, keeping a delivery's attempt in its record. A
-- delivered attempt whose record was already closed (a late answer to a
-- claim taken over) is still kept, as a row, so no attempt goes unrecorded.
-- The update runs as 0003 planned it (a primary-key probe per completion);
-- which delivered attempts it kept is a set question, hashed.
CREATE OR REPLACE FUNCTION websub_complete_attempts(
    event_ids     UUID[],
    subscribers   TEXT[],
    kinds         TEXT[],
    errors        TEXT[],
    next_attempts TIMESTAMPTZ[],
    completed_at  TIMESTAMPTZ,
    attempted_ats TIMESTAMPTZ[],
    durations     BIGINT[],
    statuses      SMALLINT[],
    responses     BYTEA[]
) RETURNS VOID
LANGUAGE plpgsql
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_material = off
AS $$
DECLARE
    kept_ids         UUID[];
    kept_subscribers TEXT[];
BEGIN
    WITH closed AS (
        UPDATE websub_deliveries AS d
        SET processed_at = CASE WHEN c.kind IN ('delivered', 'dropped', 'skipped')
                                THEN completed_at END,
            retry_count = d.retry_count
                + CASE WHEN c.kind IN ('retry', 'exhausted') THEN 1 ELSE 0 END,
            last_error = COALESCE(c.error, d.last_error),
            processing_since = NULL,
            next_attempt_at = c.next_attempt_at,
            outcome = c.kind,
            delivered_attempt_at = CASE WHEN c.kind = 'delivered' THEN c.attempted_at END,
            delivered_duration_us = CASE WHEN c.kind = 'delivered' THEN c.duration_us END,
            delivered_status = CASE WHEN c.kind = 'delivered' THEN c.status END,
            delivered_response = CASE WHEN c.kind = 'delivered' THEN c.response END
        FROM unnest(event_ids, subscribers, kinds, errors, next_attempts, attempted_ats,
                    durations, statuses, responses)
            AS c (event_id, subscriber, kind, error, next_attempt_at, attempted_at,
                  duration_us, status, response)
        WHERE d.event_id = c.event_id
          AND d.subscriber = c.subscriber
          AND COALESCE(d.processed_at, '-infinity') = '-infinity'
        RETURNING d.event_id, d.subscriber, d.delivered_attempt_at
    )
    SELECT COALESCE(array_agg(event_id), '{}'), COALESCE(array_agg(subscriber), '{}')
    INTO kept_ids, kept_subscribers
    FROM closed
    WHERE delivered_attempt_at IS NOT NULL;

    SET LOCAL enable_hashjoin = on;
    SET LOCAL enable_seqscan = on;
    INSERT INTO websub_attempts
        (event_id, subscriber, attempted_at, duration_us, status, error, response)
    SELECT a.event_id, a.subscriber, a.attempted_at, a.duration_us, a.status,
           CASE WHEN a.kind = 'delivered' THEN NULL ELSE a.error END, a.response
    FROM unnest(event_ids, subscribers, kinds, errors, attempted_ats, durations, statuses,
                responses)
        AS a (event_id, subscriber, kind, error, attempted_at, duration_us, status, response)
    WHERE a.attempted_at IS NOT NULL
      AND NOT EXISTS (
          SELECT 1 FROM unnest(kept_ids, kept_subscribers) AS k (event_id, subscriber)
          WHERE k.event_id = a.event_id AND k.subscriber = a.subscriber);
END
$$;
