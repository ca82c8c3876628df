-- The operator's deny list: subscribe requests whose topic or callback
-- matches a pattern (`*` matching any run of characters) are denied, the
-- callback told why; see websub_hub::intake::deny. Times are microseconds
-- since the Unix epoch. Bounded by the hub
-- (websub_hub::storage::events::denials::MAX_DENIALS).
CREATE TABLE websub_denials (
    id         TEXT    PRIMARY KEY,
    field      TEXT    NOT NULL CHECK (field IN ('topic', 'callback')),
    pattern    TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (field, pattern)
);
