//! The producer side of the transactional outbox: an event row written in
//! the service's own transaction, optionally followed by a `NOTIFY`, in the
//! seed's envelope. A service that only writes events depends on this
//! crate alone; websub-hub's dispatcher (in-process handlers and webhooks)
//! and its bridge into hub events read what it writes, and the hub
//! re-exports it as `websub_hub::delivery::outbox`.
//!
//! The two tables live in the producer's database and schema; their shape is
//! fixed by the messaging contract and [`ddl`] prints it for any names:
//!
//! - the **outbox** table holds one row per event — what happened, never
//!   who was told, so any number of independent consumers can read it;
//! - the **deliveries** table holds one row per (event, subscriber): who was
//!   told and how it went, so retries, errors and backoff are per subscriber.
//!
//! One index beyond the contract is worth adding to a long-lived outbox:
//! [`scan_index_ddl`] (on `created_at`) lets polling scans and retention
//! sweeps read only their window rather than the whole table.
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use websub_outbox::{Event, Outbox, OutboxTables};
//!
//! struct UserAuthenticated { user_id: String }
//!
//! impl Event for UserAuthenticated {
//!     fn name(&self) -> &str { "auth-api.user.authenticated" }
//!     fn resource_type(&self) -> &str { "user" }
//!     fn resource_id(&self) -> String { self.user_id.clone() }
//!     fn event_type(&self) -> &str { "authenticated" }
//!     fn payload(&self) -> Result<serde_json::Value, serde_json::Error> {
//!         Ok(serde_json::json!({ "user_id": self.user_id }))
//!     }
//! }
//!
//! let outbox = Outbox::new(OutboxTables::new("shared.outbox", "shared.outbox_deliveries")?);
//! let mut tx = pool.begin().await?;
//! // ... the domain change, in `tx` ...
//! let event = UserAuthenticated { user_id: "42".into() };
//! let id = outbox.message(&event).for_app("ush").notify().send(&mut *tx).await?;
//! tx.commit().await?; // the row and the NOTIFY become visible together
//! # let _ = id;
//! # Ok(())
//! # }
//! ```

mod envelope;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

pub use envelope::{ENVELOPE_CONTENT_TYPE, Envelope};
/// Receivers check [`MESSAGING_SIGNATURE_HEADER`] over the raw body with
/// this, before decoding it.
pub use websub_protocol::signature::verify;
pub use websub_protocol::signature::{MESSAGING_EVENT_ID_HEADER, MESSAGING_SIGNATURE_HEADER};

/// The default outbox table name.
pub const DEFAULT_OUTBOX_TABLE: &str = "outbox";
/// The default deliveries table name.
pub const DEFAULT_DELIVERIES_TABLE: &str = "outbox_deliveries";

/// PostgreSQL's identifier limit (`NAMEDATALEN - 1`), also the longest
/// `NOTIFY` channel.
const MAX_IDENTIFIER: usize = 63;

/// The names of the two outbox tables, validated.
///
/// Each name is `table` or `schema.table`, made of lowercase ASCII letters,
/// digits and underscores (not starting with a digit), each part at most 63
/// bytes. The names are interpolated into SQL, always double-quoted; lowercase
/// is required because PostgreSQL folds the unquoted names a service writes
/// in its own SQL to lowercase, and a quoted `Outbox` would be another table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTables {
    outbox: QualifiedName,
    deliveries: QualifiedName,
}

impl OutboxTables {
    /// Validates both names.
    pub fn new(
        outbox: impl Into<String>,
        deliveries: impl Into<String>,
    ) -> Result<Self, OutboxError> {
        Ok(Self {
            outbox: QualifiedName::parse(outbox.into())?,
            deliveries: QualifiedName::parse(deliveries.into())?,
        })
    }

    /// The default names, `outbox` and `outbox_deliveries`, in `schema`.
    pub fn in_schema(schema: &str) -> Result<Self, OutboxError> {
        Self::new(
            format!("{schema}.{DEFAULT_OUTBOX_TABLE}"),
            format!("{schema}.{DEFAULT_DELIVERIES_TABLE}"),
        )
    }

    /// The outbox table's name, as given.
    pub fn outbox(&self) -> &str {
        &self.outbox.text
    }

    /// The deliveries table's name, as given.
    pub fn deliveries(&self) -> &str {
        &self.deliveries.text
    }

    /// The `NOTIFY` channel producers and dispatchers use unless told
    /// otherwise: the outbox table's name with `.` replaced by `_`, followed
    /// by `_events` (`outbox_events`, `shared_outbox_events`), cut to 63
    /// bytes.
    pub fn default_channel(&self) -> String {
        let mut channel = format!("{}_events", self.outbox.text.replace('.', "_"));
        // ASCII only (validated), so any byte is a character boundary.
        channel.truncate(MAX_IDENTIFIER);
        channel
    }

    /// The outbox table's name as SQL, each part double-quoted: what a
    /// statement written for these tables interpolates.
    pub fn outbox_sql(&self) -> &str {
        &self.outbox.quoted
    }

    /// The deliveries table's name as SQL, each part double-quoted.
    pub fn deliveries_sql(&self) -> &str {
        &self.deliveries.quoted
    }

    /// The seed's index name for the deliveries table, derived from its
    /// table part: `idx_outbox_deliveries_pending` for the default.
    fn pending_index(&self) -> String {
        format!("\"idx_{}_pending\"", self.deliveries.table)
    }

    /// The optional `created_at` index's name, derived from the outbox
    /// table's: `idx_outbox_created_at` for the default.
    fn scan_index(&self) -> String {
        format!("\"idx_{}_created_at\"", self.outbox.table)
    }
}

impl Default for OutboxTables {
    fn default() -> Self {
        Self::new(DEFAULT_OUTBOX_TABLE, DEFAULT_DELIVERIES_TABLE)
            .unwrap_or_else(|_| unreachable!("the default names are valid identifiers"))
    }
}

impl fmt::Display for OutboxTables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} / {}", self.outbox.text, self.deliveries.text)
    }
}

/// A validated `table` or `schema.table`, and its quoted SQL form.
#[derive(Debug, Clone, PartialEq, Eq)]
struct QualifiedName {
    text: String,
    quoted: String,
    schema: Option<String>,
    table: String,
}

impl QualifiedName {
    fn parse(text: String) -> Result<Self, OutboxError> {
        let refuse = |reason: &str| OutboxError::InvalidName {
            name: text.clone(),
            reason: reason.to_owned(),
        };
        let (schema, table) = match text.split_once('.') {
            Some((schema, table)) => (Some(schema), table),
            None => (None, text.as_str()),
        };
        for part in schema.iter().copied().chain([table]) {
            check_identifier(part).map_err(|reason| refuse(&reason))?;
        }
        let quoted = match schema {
            Some(schema) => format!("\"{schema}\".\"{table}\""),
            None => format!("\"{table}\""),
        };
        Ok(Self {
            quoted,
            schema: schema.map(str::to_owned),
            table: table.to_owned(),
            text,
        })
    }
}

fn check_identifier(part: &str) -> Result<(), String> {
    if part.is_empty() {
        return Err("a name part is empty (expected `table` or `schema.table`)".to_owned());
    }
    if part.len() > MAX_IDENTIFIER {
        return Err(format!(
            "`{part}` is longer than PostgreSQL's {MAX_IDENTIFIER}-byte identifier limit"
        ));
    }
    if part.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!("`{part}` starts with a digit"));
    }
    if let Some(bad) = part
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
    {
        return Err(format!(
            "`{part}` contains {bad:?}; use lowercase letters, digits and underscores"
        ));
    }
    Ok(())
}

/// Whether `channel` can be a `NOTIFY` channel: not empty, at most 63
/// bytes, no NUL. Fails with [`OutboxError::InvalidChannel`].
pub fn check_channel(channel: &str) -> Result<(), OutboxError> {
    if channel.is_empty() || channel.len() > MAX_IDENTIFIER || channel.contains('\0') {
        return Err(OutboxError::InvalidChannel {
            channel: channel.to_owned(),
        });
    }
    Ok(())
}

/// The DDL that creates the outbox tables under `tables`' names: the
/// `uuid-ossp` extension the id default needs, the schemas named, the two
/// tables and the partial index of pending deliveries. Every statement is
/// `IF NOT EXISTS`, so running it again changes nothing.
///
/// `migrations/postgres/outbox/template.sql` is the same DDL for the default
/// names with a `<schema>` placeholder.
pub fn ddl(tables: &OutboxTables) -> String {
    let outbox = tables.outbox_sql();
    let deliveries = tables.deliveries_sql();
    let index = tables.pending_index();
    let mut text = String::from(
        "-- The outbox tables of the messaging contract. Names are configurable,\n\
         -- the shape is not.\n\n\
         -- public.uuid_generate_v4(), the id default.\n\
         CREATE EXTENSION IF NOT EXISTS \"uuid-ossp\" WITH SCHEMA public;\n\n",
    );
    let mut schemas: Vec<&str> = [&tables.outbox, &tables.deliveries]
        .iter()
        .filter_map(|name| name.schema.as_deref())
        .collect();
    schemas.dedup();
    for schema in schemas {
        text.push_str(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";\n\n"));
    }
    text.push_str(&format!(
        "-- One row per event: what happened. No dispatch state on purpose, so
-- that every consumer sees every event.
CREATE TABLE IF NOT EXISTS {outbox} (
    id            UUID NOT NULL DEFAULT public.uuid_generate_v4() PRIMARY KEY,
    event_name    TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id   TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    app           TEXT,
    payload       JSONB NOT NULL,
    created_at    TIMESTAMP NOT NULL DEFAULT (now() at time zone 'utc')
);

-- One row per (event, subscriber): who was told, and how it went.
CREATE TABLE IF NOT EXISTS {deliveries} (
    event_id         UUID NOT NULL REFERENCES {outbox} (id) ON DELETE CASCADE,
    subscriber       TEXT NOT NULL,
    processed_at     TIMESTAMP,
    retry_count      INT NOT NULL DEFAULT 0,
    last_error       TEXT,
    processing_since TIMESTAMP,
    next_attempt_at  TIMESTAMP,
    PRIMARY KEY (event_id, subscriber)
);

CREATE INDEX IF NOT EXISTS {index}
    ON {deliveries} (next_attempt_at)
    WHERE processed_at IS NULL;
"
    ));
    text
}

/// The DDL of an index on the outbox's `created_at`, which the messaging
/// contract leaves out. Without it, every polling scan (once per poll
/// interval) and every retention sweep reads the whole outbox table; with
/// it they read only the events in their window. The producers pay one more
/// index entry per event. `websub outbox-ddl --scan-index` prints it after
/// the tables.
pub fn scan_index_ddl(tables: &OutboxTables) -> String {
    format!(
        "-- Optional, beyond the contract: lets polling scans and retention sweeps\n\
         -- read only the events in their window instead of the whole outbox.\n\
         CREATE INDEX IF NOT EXISTS {} ON {} (created_at);\n",
        tables.scan_index(),
        tables.outbox_sql()
    )
}

/// A domain event that can be written to the outbox.
///
/// `name` is what subscribers register for (e.g.
/// `auth-api.user.authenticated`); the rest travels in the delivered
/// envelope.
pub trait Event {
    /// The event name subscribers register for.
    fn name(&self) -> &str;
    /// The kind of resource the event is about (`user`).
    fn resource_type(&self) -> &str;
    /// Which resource.
    fn resource_id(&self) -> String;
    /// What happened to it (`authenticated`).
    fn event_type(&self) -> &str;
    /// The event's data, delivered as the envelope's `data`.
    fn payload(&self) -> Result<serde_json::Value, serde_json::Error>;
}

/// Writes events to one outbox table. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbox {
    tables: OutboxTables,
    channel: String,
    insert: Arc<str>,
}

impl Outbox {
    /// An outbox writing to `tables`, notifying on
    /// [`OutboxTables::default_channel`].
    pub fn new(tables: OutboxTables) -> Self {
        let insert = format!(
            "INSERT INTO {} (id, event_name, resource_type, resource_id, event_type, app, payload) \
             VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)",
            tables.outbox_sql()
        );
        Self {
            channel: tables.default_channel(),
            tables,
            insert: insert.into(),
        }
    }

    /// Notifies on `channel` instead of the default; the dispatcher must
    /// listen on the same one.
    pub fn with_channel(mut self, channel: impl Into<String>) -> Result<Self, OutboxError> {
        let channel = channel.into();
        check_channel(&channel)?;
        self.channel = channel;
        Ok(self)
    }

    /// The tables written to.
    pub fn tables(&self) -> &OutboxTables {
        &self.tables
    }

    /// The `NOTIFY` channel.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Starts a message for `event`; [`Message::send`] writes it.
    pub fn message<'a, E: Event + ?Sized>(&'a self, event: &'a E) -> Message<'a, E> {
        Message {
            outbox: self,
            event,
            app: None,
            notify: false,
        }
    }

    /// Deletes events older than `ttl` and, by cascade, their delivery rows,
    /// on `executor` (a pool, a connection). See [`purge_expired`].
    pub async fn purge_expired(
        &self,
        executor: impl sqlx::PgExecutor<'_>,
        ttl: Duration,
    ) -> Result<u64, OutboxError> {
        purge_expired(executor, &self.tables, ttl).await
    }
}

/// One event about to be written; see [`Outbox::message`].
#[must_use = "a message is written only by `send`"]
pub struct Message<'a, E: ?Sized> {
    outbox: &'a Outbox,
    event: &'a E,
    app: Option<String>,
    notify: bool,
}

impl<E: ?Sized> fmt::Debug for Message<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("tables", &self.outbox.tables)
            .field("app", &self.app)
            .field("notify", &self.notify)
            .finish_non_exhaustive()
    }
}

impl<E: Event + ?Sized> Message<'_, E> {
    /// Records which application the event belongs to. It travels in the
    /// envelope and decides who the event is expanded to: subscribers of that
    /// app and subscribers of every app, never another app's. An empty
    /// string means none.
    pub fn for_app(mut self, app: impl Into<String>) -> Self {
        let app = app.into();
        self.app = (!app.is_empty()).then_some(app);
        self
    }

    /// Follows the row with a `NOTIFY` on the outbox's channel (payload: the
    /// event id), in the same transaction: listeners hear it when the
    /// transaction commits, and never if it rolls back.
    pub fn notify(mut self) -> Self {
        self.notify = true;
        self
    }

    /// Writes the event row — and the `NOTIFY`, if asked — on `connection`,
    /// normally the caller's open transaction (`&mut *tx`). Returns the
    /// event's id, generated here (UUIDv7). `created_at` is the table
    /// default: the database's time, in UTC.
    pub async fn send(self, connection: &mut PgConnection) -> Result<Uuid, OutboxError> {
        let name = self.event.name();
        if name.is_empty() {
            return Err(OutboxError::EmptyEventName);
        }
        let payload = self.event.payload().map_err(OutboxError::Payload)?;
        let id = Uuid::now_v7();
        sqlx::query(sqlx::AssertSqlSafe(self.outbox.insert.clone()))
            .bind(id)
            .bind(name)
            .bind(self.event.resource_type())
            .bind(self.event.resource_id())
            .bind(self.event.event_type())
            .bind(self.app.as_deref())
            .bind(payload.to_string())
            .execute(&mut *connection)
            .await?;
        if self.notify {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(&self.outbox.channel)
                .bind(id.to_string())
                .execute(&mut *connection)
                .await?;
        }
        Ok(id)
    }
}

/// Deletes events created more than `ttl` ago (by the database's clock) and,
/// through `ON DELETE CASCADE`, their delivery rows. Whether an event was
/// delivered is not checked: keep `ttl` well beyond the retry budget.
/// Returns how many events were deleted.
pub async fn purge_expired(
    executor: impl sqlx::PgExecutor<'_>,
    tables: &OutboxTables,
    ttl: Duration,
) -> Result<u64, OutboxError> {
    let sql = format!(
        "DELETE FROM {} WHERE created_at < timezone('utc', now()) - make_interval(secs => $1)",
        tables.outbox_sql()
    );
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(ttl.as_secs_f64())
        .execute(executor)
        .await?;
    Ok(done.rows_affected())
}

/// Failures of the producer side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// A table name is not a plain `table` or `schema.table` identifier.
    #[error("invalid table name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// A `NOTIFY` channel that is empty, longer than 63 bytes or contains NUL.
    #[error("invalid notify channel {channel:?}: expected 1 to 63 bytes without NUL")]
    InvalidChannel {
        /// The channel given.
        channel: String,
    },
    /// An event whose name is empty: nothing could subscribe to it.
    #[error("the event's name is empty")]
    EmptyEventName,
    /// The event's payload could not be serialized.
    #[error("the event's payload could not be serialized: {0}")]
    Payload(#[source] serde_json::Error),
    /// The database failed.
    #[error("outbox database failed: {0}")]
    Database(#[from] sqlx::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated_and_quoted() {
        let tables = OutboxTables::new("shared.outbox", "outbox_deliveries").expect("valid");
        assert_eq!(tables.outbox_sql(), "\"shared\".\"outbox\"");
        assert_eq!(tables.deliveries_sql(), "\"outbox_deliveries\"");
        assert_eq!(tables.outbox(), "shared.outbox");
        for bad in [
            "",
            "a.b.c",
            ".outbox",
            "outbox.",
            "Outbox",
            "out box",
            "outbox\"; DROP TABLE x; --",
            "1outbox",
            &"x".repeat(64),
        ] {
            assert!(
                matches!(
                    OutboxTables::new(bad, "outbox_deliveries"),
                    Err(OutboxError::InvalidName { .. })
                ),
                "{bad:?} should be refused"
            );
        }
        assert!(OutboxTables::new("_o1", "x".repeat(63)).is_ok());
    }

    #[test]
    fn default_channel_derives_from_the_outbox_name() {
        assert_eq!(OutboxTables::default().default_channel(), "outbox_events");
        let tables = OutboxTables::in_schema("shared").expect("valid");
        assert_eq!(tables.default_channel(), "shared_outbox_events");
        let long = OutboxTables::new(
            format!("{}.{}", "s".repeat(60), "t".repeat(60)),
            "d".to_owned(),
        )
        .expect("valid");
        assert_eq!(long.default_channel().len(), MAX_IDENTIFIER);
    }

    #[test]
    fn scan_index_ddl_indexes_created_at_of_the_named_outbox() {
        let tables = OutboxTables::new("shared.events", "shared.event_deliveries").expect("valid");
        let ddl = scan_index_ddl(&tables);
        assert!(
            ddl.contains(
                "CREATE INDEX IF NOT EXISTS \"idx_events_created_at\" ON \"shared\".\"events\" (created_at);"
            ),
            "{ddl}"
        );
        assert!(
            !super::ddl(&tables).contains("created_at);"),
            "not part of the contract's DDL"
        );
    }

    #[test]
    fn ddl_names_every_table_quoted_and_creates_the_schema_once() {
        let tables = OutboxTables::in_schema("shared").expect("valid");
        let ddl = ddl(&tables);
        assert_eq!(
            ddl.matches("CREATE SCHEMA IF NOT EXISTS \"shared\"")
                .count(),
            1
        );
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS \"shared\".\"outbox\" ("));
        assert!(ddl.contains("REFERENCES \"shared\".\"outbox\" (id) ON DELETE CASCADE"));
        assert!(ddl.contains(
            "CREATE INDEX IF NOT EXISTS \"idx_outbox_deliveries_pending\"\n    ON \"shared\".\"outbox_deliveries\""
        ));
        assert!(!super::ddl(&OutboxTables::default()).contains("CREATE SCHEMA"));
    }

    #[test]
    fn channels_are_checked() {
        let outbox = Outbox::new(OutboxTables::default());
        assert_eq!(outbox.channel(), "outbox_events");
        assert!(outbox.clone().with_channel("").is_err());
        assert!(outbox.clone().with_channel("x".repeat(64)).is_err());
        assert_eq!(
            outbox.with_channel("Mixed Case").expect("valid").channel(),
            "Mixed Case"
        );
    }
}
