-- Endpoint changes; see the PostgreSQL migration of the same name for the
-- reasoning. AUTOINCREMENT: ids only grow, even past deleted rows, so the
-- newest rows are the highest ids and the bound trims by id.
CREATE TABLE websub_endpoint_changes (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    channel         TEXT    NOT NULL,
    endpoint        TEXT    NOT NULL,
    state           TEXT    NOT NULL,
    at              INTEGER NOT NULL,
    failures        INTEGER NULL CHECK (failures >= 0),
    since           INTEGER NULL,
    reason          TEXT    NULL,
    source          TEXT    NULL,
    webhook_state   TEXT    NOT NULL DEFAULT 'pending',
    retry_count     INTEGER NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    next_attempt_at INTEGER NULL,
    claimed_until   INTEGER NULL,
    delivered_at    INTEGER NULL,
    last_error      TEXT    NULL
);

CREATE INDEX websub_endpoint_changes_endpoint
    ON websub_endpoint_changes (channel, endpoint, id);

CREATE INDEX websub_endpoint_changes_pending
    ON websub_endpoint_changes (id)
    WHERE webhook_state = 'pending';

CREATE INDEX websub_endpoint_changes_at ON websub_endpoint_changes (at);
