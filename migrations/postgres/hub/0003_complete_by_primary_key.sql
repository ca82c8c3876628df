-- complete(): one primary-key probe per completion, whatever the statistics.
--
-- The function from 0001 still let a planner with stale statistics (a table
-- not analysed since a fan-out began, which is every fan-out on a young
-- table) pick another plan: its `processed_at IS NULL` matches the pending
-- index's predicate, so the planner could read the whole backlog through
-- that index once and compare every completion with every pending record
-- (a nested loop over the materialised backlog: 125 000 comparisons for 500
-- completions against 1 000 pending records, most of a batch's time).
--
-- Here the same guard is written so that it cannot select the pending index
-- (a record is open while it has no processed_at, and no open record has
-- -infinity there), which leaves the primary key as the only index that
-- serves the join; the SET clauses rule out every plan but a nested loop
-- over the completions that probes it. The guard still keeps a late
-- completion from reopening or re-counting a closed record.
CREATE OR REPLACE FUNCTION websub_complete_deliveries(
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
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_material = off
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
      AND COALESCE(d.processed_at, '-infinity') = '-infinity';
END
$$;
