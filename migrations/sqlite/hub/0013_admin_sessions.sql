-- The admin page's sessions, kept server-side so that each can be ended
-- (logging out, an operator revoking one or all, the key it was opened
-- with removed); see websub_hub::storage::events::sessions.
--
-- The cookie's token is never stored, only its SHA-256: a copy of this
-- table opens no session. Times are microseconds since the Unix epoch.
-- Bounded by the hub (the oldest ended past a fixed count; expired rows
-- removed at each login).
CREATE TABLE websub_admin_sessions (
    id         TEXT    PRIMARY KEY,
    token_hash TEXT    NOT NULL UNIQUE,
    key_id     TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    user_agent TEXT    NULL
);

CREATE INDEX websub_admin_sessions_created ON websub_admin_sessions (created_at);
