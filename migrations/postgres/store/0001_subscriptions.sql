-- Verified WebSub subscriptions; the contract is websub_store::SubscriptionStore.

CREATE TABLE websub_subscriptions (
    topic         TEXT        NOT NULL,
    callback      TEXT        NOT NULL,
    -- NULL and '' are different secrets: NULL means unauthenticated delivery.
    secret        TEXT        NULL,
    -- BIGINT because PostgreSQL has no unsigned type; the check keeps every
    -- stored lease inside the u32 the hub works with.
    lease_seconds BIGINT      NULL CHECK (lease_seconds BETWEEN 0 AND 4294967295),
    created_at    TIMESTAMPTZ NOT NULL,
    verified_at   TIMESTAMPTZ NOT NULL,
    -- NULL is a permanent subscription, which never expires.
    expires_at    TIMESTAMPTZ NULL,
    owner         TEXT        NULL,
    -- The leading column makes this index the topic index list_by_topic (the
    -- publish hot path) and topics() are served from, so there is no separate
    -- index on topic.
    PRIMARY KEY (topic, callback)
);

-- Only leased subscriptions can expire; leaving permanent ones out keeps the
-- index small, and `expires_at < $1` implies the predicate, so the expiry
-- sweep still uses it.
CREATE INDEX websub_subscriptions_expires_at
    ON websub_subscriptions (expires_at)
    WHERE expires_at IS NOT NULL;

-- Quota checks count per owner inside the conditional save's lock; a scan
-- there would hold the lock for the length of the table.
CREATE INDEX websub_subscriptions_owner
    ON websub_subscriptions (owner)
    WHERE owner IS NOT NULL;
