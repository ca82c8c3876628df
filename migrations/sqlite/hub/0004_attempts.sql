-- The history of every delivery: one row per attempt, written with the
-- outcome it came to, in the same transaction. A delivery's attempts are
-- read together, in time order, through the index; they go with their
-- event.
CREATE TABLE websub_attempts (
    event_id     BLOB    NOT NULL REFERENCES websub_events (id) ON DELETE CASCADE,
    subscriber   TEXT    NOT NULL,
    -- µs since the epoch, as every time here.
    attempted_at INTEGER NOT NULL,
    duration_us  INTEGER NOT NULL CHECK (duration_us >= 0),
    -- NULL when no answer came (refused, timed out, reset).
    status       INTEGER NULL,
    -- NULL when delivered.
    error        TEXT    NULL,
    -- The first KiB of the answer's body.
    response     BLOB    NOT NULL
);

CREATE INDEX websub_attempts_delivery
    ON websub_attempts (event_id, subscriber, attempted_at);
