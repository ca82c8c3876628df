-- Verified WebSub subscriptions; the contract is websub_store::SubscriptionStore.
-- The same table as the PostgreSQL backend's wherever the dialects allow.
-- WITHOUT ROWID is the one SQLite-only addition: rows live in the primary
-- key's b-tree, so one topic's subscriptions are read from adjacent pages
-- rather than through one rowid lookup each.

CREATE TABLE websub_subscriptions (
    topic         TEXT    NOT NULL,
    callback      TEXT    NOT NULL,
    -- NULL and '' are different secrets: NULL means unauthenticated delivery.
    secret        TEXT    NULL,
    lease_seconds INTEGER NULL CHECK (lease_seconds BETWEEN 0 AND 4294967295),
    -- Timestamps are INTEGER microseconds since the Unix epoch, not TEXT:
    -- SQLite has no timestamp type, and text compares correctly only while
    -- every value has the same format and offset. Integers compare and sort
    -- exactly, so `expires_at < ?` is an exact index range, and microseconds
    -- are the precision the contract promises to round-trip.
    created_at    INTEGER NOT NULL,
    verified_at   INTEGER NOT NULL,
    -- NULL is a permanent subscription, which never expires.
    expires_at    INTEGER NULL,
    owner         TEXT    NULL,
    -- The leading column makes this index the topic index list_by_topic (the
    -- publish hot path) and topics() are served from, so there is no separate
    -- index on topic.
    PRIMARY KEY (topic, callback)
) WITHOUT ROWID;

-- Only leased subscriptions can expire; SQLite knows that `expires_at < ?`
-- implies the predicate, so the expiry sweep still uses this smaller index.
CREATE INDEX websub_subscriptions_expires_at
    ON websub_subscriptions (expires_at)
    WHERE expires_at IS NOT NULL;

-- Quota checks count per owner while holding the write lock; a scan there
-- would hold it for the length of the table.
CREATE INDEX websub_subscriptions_owner
    ON websub_subscriptions (owner)
    WHERE owner IS NOT NULL;
