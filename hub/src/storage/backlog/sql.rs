//! The backlog's statements that SQLite and PostgreSQL spell the same,
//! written once; each backend keeps beside them the ones its dialect
//! spells its own way (times, batches as JSON or arrays, the claims).

pub(super) const FETCH_DONE: &str =
    "DELETE FROM websub_fetches WHERE topic = $1 AND generation = $2";

// A failure counts against the claim's budget; a row overtaken by a newer
// ping starts again, due at once (`$5`), with a fresh one.
pub(super) const FETCH_FAILED: &str = "UPDATE websub_fetches SET \
         processing_since = NULL, \
         last_error = $3, \
         attempts = CASE WHEN generation = $2 THEN attempts + 1 ELSE 0 END, \
         next_attempt_at = CASE WHEN generation = $2 THEN $4 ELSE $5 END \
     WHERE topic = $1";

pub(super) const RELEASE_FETCH: &str = "UPDATE websub_fetches SET processing_since = NULL, attempts = 0, \
         next_attempt_at = $2 \
     WHERE topic = $1";

pub(super) const KEEP_VALIDATORS: &str = "INSERT INTO websub_topic_validators \
         (topic, etag, last_modified, updated_at) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (topic) DO UPDATE SET etag = excluded.etag, \
         last_modified = excluded.last_modified, updated_at = excluded.updated_at";

pub(super) const FORGET_VALIDATORS: &str = "DELETE FROM websub_topic_validators WHERE topic = $1";

pub(super) const WAITING: &str = "SELECT \
     (SELECT count FROM websub_verifications_waiting), \
     (SELECT count(*) FROM websub_fetches WHERE next_attempt_at IS NOT NULL)";

// An outcome of a request that a newer one replaced only releases the claim.
pub(super) const INTENT_FAILED: &str = "UPDATE websub_verifications SET \
         processing_since = NULL, \
         attempts = CASE WHEN id = $3 THEN attempts + 1 ELSE attempts END, \
         next_attempt_at = CASE WHEN id = $3 THEN $4 ELSE next_attempt_at END, \
         last_error = CASE WHEN id = $3 THEN $5 ELSE last_error END \
     WHERE topic = $1 AND callback = $2";

pub(super) const SUBSCRIBING: &str = "SELECT EXISTS (SELECT 1 FROM websub_verifications \
     WHERE topic = $1 AND mode = 'subscribe' AND next_attempt_at IS NOT NULL)";

pub(super) const PURGE_FETCHES: &str =
    "DELETE FROM websub_fetches WHERE next_attempt_at IS NULL AND requested_at < $1";

pub(super) const PURGE_INTENTS: &str =
    "DELETE FROM websub_verifications WHERE next_attempt_at IS NULL AND requested_at < $1";
