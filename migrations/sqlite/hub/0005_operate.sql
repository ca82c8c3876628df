-- What operators need beyond the dispatcher's own bookkeeping; see the
-- PostgreSQL migration of the same name for the reasoning.

-- 'retry', 'exhausted', 'delivered', 'dropped' or 'skipped'; NULL before the
-- first outcome.
ALTER TABLE websub_deliveries ADD COLUMN outcome TEXT NULL;

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

-- A redelivery's copy names its original; NULL for every original.
ALTER TABLE websub_events ADD COLUMN original_id BLOB NULL;

CREATE TABLE websub_endpoints (
    -- 'websub' (a callback URL) or 'webhook' (an outbox webhook's name).
    channel         TEXT    NOT NULL,
    endpoint        TEXT    NOT NULL,
    failures        INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0),
    last_failure_at INTEGER NULL,
    last_error      TEXT    NULL,
    disabled_at     INTEGER NULL,
    disabled_reason TEXT    NULL,
    PRIMARY KEY (channel, endpoint)
);

-- The attempts of outbox webhooks, whose delivery rows live in the
-- producer's database; they go by age with the hub's retention.
CREATE TABLE websub_webhook_attempts (
    event_id     BLOB    NOT NULL,
    subscriber   TEXT    NOT NULL,
    attempted_at INTEGER NOT NULL,
    duration_us  INTEGER NOT NULL CHECK (duration_us >= 0),
    status       INTEGER NULL,
    error        TEXT    NULL,
    response     BLOB    NOT NULL
);

CREATE INDEX websub_webhook_attempts_delivery
    ON websub_webhook_attempts (event_id, subscriber, attempted_at);

CREATE INDEX websub_webhook_attempts_age
    ON websub_webhook_attempts (attempted_at);
