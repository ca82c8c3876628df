-- The hub's backlog; the contract is websub_hub::backlog::Backlog.
-- Timestamps are INTEGER microseconds since the Unix epoch and ids 16-byte
-- BLOBs, as in the event log.

-- One row per topic a publish ping asked to fetch, until the fetch is done.
CREATE TABLE websub_fetches (
    topic            TEXT        NOT NULL PRIMARY KEY,
    -- The latest ping's time: a fetch claimed before it leaves the row due.
    requested_at     INTEGER     NOT NULL,
    -- Counts the pings: a fetch claimed at another count was overtaken.
    generation       INTEGER     NOT NULL DEFAULT 1,
    attempts         INTEGER     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- NULL once failed for good: kept for operators, never claimed.
    next_attempt_at  INTEGER     NULL,
    processing_since INTEGER     NULL,
    last_error       TEXT        NULL
);

CREATE INDEX websub_fetches_due
    ON websub_fetches (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;

-- What each topic answered last, for conditional fetches by any replica.
CREATE TABLE websub_topic_validators (
    topic         TEXT        NOT NULL PRIMARY KEY,
    etag          TEXT        NULL,
    last_modified TEXT        NULL,
    updated_at    INTEGER     NOT NULL
);

-- One row per (topic, callback) whose subscribe or unsubscribe was
-- answered 202 and is not yet verified (or failed for good).
CREATE TABLE websub_verifications (
    topic            TEXT        NOT NULL,
    callback         TEXT        NOT NULL,
    -- This request's id; a newer request for the pair writes another.
    id               BLOB        NOT NULL,
    mode             TEXT        NOT NULL CHECK (mode IN ('subscribe', 'unsubscribe')),
    secret           TEXT        NULL,
    lease_seconds    INTEGER     NULL,
    owner            TEXT        NULL,
    requested_at     INTEGER     NOT NULL,
    attempts         INTEGER     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  INTEGER     NULL,
    processing_since INTEGER     NULL,
    last_error       TEXT        NULL,
    PRIMARY KEY (topic, callback)
);

-- claim_intents() and the admission bound's count: only waiting rows.
CREATE INDEX websub_verifications_due
    ON websub_verifications (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;

CREATE INDEX websub_verifications_owner
    ON websub_verifications (owner, requested_at)
    WHERE owner IS NOT NULL;
