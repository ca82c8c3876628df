-- How a WebSub subscription's deliveries are signed, when its subscriber
-- asked for anything but the default (X-Hub-Signature with its secret):
-- the Standard Webhooks scheme, and the secret a rotation replaces, until
-- when. Kept here, in the hub's own database, whatever store holds the
-- subscriptions (the secret itself stays with the subscription). A row
-- applies to a subscription created no later than `since`: one made after
-- an unsubscribe starts with the defaults. Times are microseconds since
-- the Unix epoch, as on SQLite. See websub_hub::storage::events::signing.
CREATE TABLE websub_subscription_signing (
    topic           TEXT   NOT NULL,
    callback        TEXT   NOT NULL,
    scheme          TEXT   NOT NULL CHECK (scheme IN ('websub', 'standard-webhooks')),
    previous_secret TEXT   NULL,
    previous_until  BIGINT NULL,
    since           BIGINT NOT NULL,
    PRIMARY KEY (topic, callback)
);
