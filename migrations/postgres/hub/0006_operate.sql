-- What operators need beyond the dispatcher's own bookkeeping: how each
-- delivery ended, redeliveries as records of their own, and the health of
-- every endpoint that has been failing.

-- How a record's latest attempt (or the dispatcher's decision) ended:
-- 'retry', 'exhausted', 'delivered', 'dropped' (the subscription went away)
-- or 'skipped' (its endpoint was disabled; replayable). NULL before the first
-- outcome. processed_at and next_attempt_at still decide what is due; this
-- tells a closed record's delivered, dropped and skipped apart.
ALTER TABLE websub_deliveries ADD COLUMN outcome TEXT NULL;

-- Records closed before the column existed: a closed record whose latest
-- attempt succeeded was delivered; one closed without (a 410, a subscription
-- that went away) was dropped.
UPDATE websub_deliveries AS d
SET outcome = CASE
    WHEN d.processed_at IS NULL AND d.next_attempt_at IS NULL THEN 'exhausted'
    WHEN d.processed_at IS NULL THEN 'retry'
    WHEN COALESCE((SELECT a.error IS NULL FROM websub_attempts AS a
                   WHERE a.event_id = d.event_id AND a.subscriber = d.subscriber
                   ORDER BY a.attempted_at DESC LIMIT 1),
                  d.last_error IS NULL) THEN 'delivered'
    ELSE 'dropped'
END
WHERE d.processed_at IS NOT NULL OR d.retry_count > 0 OR d.next_attempt_at IS NULL;

-- A redelivery (or a replay) is an event of its own, a copy of the original
-- with records only for the subscribers it is sent to again, so that every
-- record keeps the history of one round. Deliveries of the copy carry the
-- original's id as their event id. NULL for every original.
ALTER TABLE websub_events ADD COLUMN original_id UUID NULL;

-- Endpoints (a callback URL, a webhook's name) that failed since their last
-- delivery, or that are disabled; an endpoint that delivers again leaves.
-- So the table holds only the troubled few, and a fan-out to healthy
-- endpoints never touches it.
CREATE TABLE websub_endpoints (
    -- The delivery channel: 'websub' (a callback URL) or 'webhook' (an
    -- outbox webhook's name).
    channel         TEXT        NOT NULL,
    endpoint        TEXT COLLATE "C" NOT NULL,
    -- Exhausted deliveries in a row.
    failures        INT         NOT NULL DEFAULT 0 CHECK (failures >= 0),
    last_failure_at TIMESTAMPTZ NULL,
    last_error      TEXT        NULL,
    -- Set while disabled: new deliveries to it are recorded as skipped.
    disabled_at     TIMESTAMPTZ NULL,
    disabled_reason TEXT        NULL,
    PRIMARY KEY (channel, endpoint)
);

-- The attempts of outbox webhooks. Their delivery rows live in the
-- producer's database, in the outbox's own schema; their history lives
-- here, beside the hub's, and goes by age with the hub's retention.
CREATE TABLE websub_webhook_attempts (
    event_id     UUID        NOT NULL,
    -- The webhook's name.
    subscriber   TEXT COLLATE "C" NOT NULL,
    attempted_at TIMESTAMPTZ NOT NULL,
    duration_us  BIGINT      NOT NULL CHECK (duration_us >= 0),
    status       SMALLINT    NULL,
    error        TEXT        NULL,
    response     BYTEA       NOT NULL
);

CREATE INDEX websub_webhook_attempts_delivery
    ON websub_webhook_attempts (event_id, subscriber, attempted_at);

CREATE INDEX websub_webhook_attempts_age
    ON websub_webhook_attempts (attempted_at);

-- 0003's completion, writing the outcome, and closing skipped records.
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
    SET processed_at = CASE WHEN c.kind IN ('delivered', 'dropped', 'skipped')
                            THEN completed_at END,
        retry_count = d.retry_count
            + CASE WHEN c.kind IN ('retry', 'exhausted') THEN 1 ELSE 0 END,
        last_error = COALESCE(c.error, d.last_error),
        processing_since = NULL,
        next_attempt_at = c.next_attempt_at,
        outcome = c.kind
    FROM unnest(event_ids, subscribers, kinds, errors, next_attempts)
        AS c (event_id, subscriber, kind, error, next_attempt_at)
    WHERE d.event_id = c.event_id
      AND d.subscriber = c.subscriber
      AND COALESCE(d.processed_at, '-infinity') = '-infinity';
END
$$;
