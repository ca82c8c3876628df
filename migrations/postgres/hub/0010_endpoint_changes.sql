-- Endpoint changes: every state change of an endpoint (a callback URL, a
-- webhook's name, the operator webhook itself) in the order it was
-- recorded, for operators to read, and queued for the optional operator
-- webhook (see websub_hub::delivery::changes and ::operator). The table is
-- bounded: the hub keeps the newest rows (websub_hub::events::MAX_CHANGES)
-- and purges older ones with the retention.
CREATE TABLE websub_endpoint_changes (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- 'websub', 'webhook' or 'operator'.
    channel         TEXT        NOT NULL,
    endpoint        TEXT COLLATE "C" NOT NULL,
    -- 'failing', 'open', 'recovered', 'disabled' or 'enabled'.
    state           TEXT        NOT NULL,
    at              TIMESTAMPTZ NOT NULL,
    -- Failures in a row so far, when the change counts them.
    failures        INT         NULL CHECK (failures >= 0),
    -- Failing (or open) since, for 'open', 'recovered' and 'disabled'.
    since           TIMESTAMPTZ NULL,
    -- The last error, or why it was disabled.
    reason          TEXT        NULL,
    -- What made the change: 'breaker', 'tally', 'outage' or 'operator'.
    source          TEXT        NULL,
    -- The operator webhook's delivery of the change: 'pending', 'delivered',
    -- 'failed' (out of retries) or 'dropped' (past the backlog's bound).
    webhook_state   TEXT        NOT NULL DEFAULT 'pending',
    retry_count     INT         NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    next_attempt_at TIMESTAMPTZ NULL,
    -- A sender's claim runs until then; a later one takes it over.
    claimed_until   TIMESTAMPTZ NULL,
    delivered_at    TIMESTAMPTZ NULL,
    last_error      TEXT        NULL
);

-- One endpoint's changes, newest first.
CREATE INDEX websub_endpoint_changes_endpoint
    ON websub_endpoint_changes (channel, endpoint, id);

-- The operator webhook's claims: the pending few, oldest first.
CREATE INDEX websub_endpoint_changes_pending
    ON websub_endpoint_changes (id)
    WHERE webhook_state = 'pending';

-- Retention.
CREATE INDEX websub_endpoint_changes_at ON websub_endpoint_changes (at);
