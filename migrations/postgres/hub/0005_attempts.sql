-- The history of every delivery: one row per attempt, written with the
-- outcome it came to, in the same statement.

-- No primary key: a delivery's attempts are read together, in time order,
-- through the index below, and nothing addresses one alone. Like
-- websub_deliveries, it has no FOREIGN KEY clause (a check per inserted
-- row); the attempts of a deleted event go with it through the trigger
-- below.
CREATE TABLE websub_attempts (
    event_id     UUID        NOT NULL,
    subscriber   TEXT COLLATE "C" NOT NULL,
    attempted_at TIMESTAMPTZ NOT NULL,
    duration_us  BIGINT      NOT NULL CHECK (duration_us >= 0),
    -- NULL when no answer came (refused, timed out, reset).
    status       SMALLINT    NULL,
    -- NULL when delivered.
    error        TEXT        NULL,
    -- The first KiB of the answer's body.
    response     BYTEA       NOT NULL
);

CREATE INDEX websub_attempts_delivery
    ON websub_attempts (event_id, subscriber, attempted_at);

CREATE FUNCTION websub_events_cascade_attempts() RETURNS TRIGGER
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    DELETE FROM websub_attempts
    WHERE event_id = ANY (ARRAY (SELECT id FROM deleted));
    RETURN NULL;
END
$$;

CREATE TRIGGER websub_events_cascade_attempts
    AFTER DELETE ON websub_events
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION websub_events_cascade_attempts();

-- complete() with the attempts: 0003's update, then one insert of every
-- completion that carries an attempt (attempted_at not NULL).
CREATE FUNCTION websub_complete_attempts(
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
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM websub_complete_deliveries(
        event_ids, subscribers, kinds, errors, next_attempts, completed_at);
    INSERT INTO websub_attempts
        (event_id, subscriber, attempted_at, duration_us, status, error, response)
    SELECT a.event_id, a.subscriber, a.attempted_at, a.duration_us, a.status,
           CASE WHEN a.kind = 'delivered' THEN NULL ELSE a.error END, a.response
    FROM unnest(event_ids, subscribers, kinds, errors, attempted_ats, durations, statuses,
                responses)
        AS a (event_id, subscriber, kind, error, attempted_at, duration_us, status, response)
    WHERE a.attempted_at IS NOT NULL;
END
$$;
