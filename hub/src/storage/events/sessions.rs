//! The admin page's sessions (`websub_admin_sessions`), kept beside the
//! event log so that every replica sees the same ones and each can be
//! ended: by logging out, by an operator (one, or all at once), or by the
//! removal of the key it was opened with (which the page checks at each
//! request, [`crate::web::admin`]).
//!
//! The table holds a digest of each session's token, never the token, and
//! at most [`MAX_SESSIONS`] rows: opening one removes the expired ones and
//! the oldest past the bound. Times are microseconds on both databases, so
//! the statements here are the only ones.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::EventLogError;

/// The most sessions kept: opening one more ends the oldest.
pub const MAX_SESSIONS: i64 = 1_000;

/// An admin session, as operators see it (its token is not kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AdminSession {
    /// The session's public id, to end it by.
    pub id: String,
    /// Which operator key opened it (a digest of the key).
    pub key_id: String,
    /// When it was opened.
    pub created_at: DateTime<Utc>,
    /// When it ends unless ended before.
    pub expires_at: DateTime<Utc>,
    /// The browser's `User-Agent` at login, cut to 200 characters.
    pub user_agent: Option<String>,
}

/// Where admin sessions are kept.
#[async_trait]
pub trait AdminSessions: Send + Sync + std::fmt::Debug {
    /// Keeps `session`, found again by `token_hash`; ends the sessions
    /// expired at `now` and the oldest past [`MAX_SESSIONS`].
    async fn open_session(
        &self,
        session: &AdminSession,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<(), EventLogError>;

    /// The session whose token hashes to `token_hash`, if it is live at
    /// `now`.
    async fn session(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<AdminSession>, EventLogError>;

    /// The sessions live at `now`, newest first.
    async fn sessions(&self, now: DateTime<Utc>) -> Result<Vec<AdminSession>, EventLogError>;

    /// Ends the session `id`; whether there was one.
    async fn end_session(&self, id: &str) -> Result<bool, EventLogError>;

    /// Ends every session; how many there were.
    async fn end_sessions(&self) -> Result<u64, EventLogError>;
}

pub(super) const PRUNE: &str = "DELETE FROM websub_admin_sessions \
     WHERE expires_at <= $1 \
        OR created_at < (SELECT created_at FROM websub_admin_sessions \
                         ORDER BY created_at DESC LIMIT 1 OFFSET $2)";

pub(super) const OPEN: &str = "INSERT INTO websub_admin_sessions \
     (id, token_hash, key_id, created_at, expires_at, user_agent) \
     VALUES ($1, $2, $3, $4, $5, $6)";

pub(super) const FIND: &str = "SELECT id, key_id, created_at, expires_at, user_agent \
     FROM websub_admin_sessions WHERE token_hash = $1 AND expires_at > $2";

pub(super) const LIST: &str = "SELECT id, key_id, created_at, expires_at, user_agent \
     FROM websub_admin_sessions WHERE expires_at > $1 ORDER BY created_at DESC";

pub(super) const END: &str = "DELETE FROM websub_admin_sessions WHERE id = $1";

pub(super) const END_ALL: &str = "DELETE FROM websub_admin_sessions";

/// Where, newest first, [`PRUNE`] finds the oldest session it keeps: it
/// keeps `MAX_SESSIONS - 1`, room for the one about to be opened.
pub(super) const OLDEST_KEPT_OFFSET: i64 = MAX_SESSIONS - 2;

/// A session from a row of [`FIND`] or [`LIST`], on either database.
pub(super) fn session_of<'r, R>(row: &'r R) -> Result<AdminSession, EventLogError>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let time = |column: &'static str| -> Result<DateTime<Utc>, EventLogError> {
        let micros: i64 = row.try_get(column).map_err(super::invalid)?;
        DateTime::from_timestamp_micros(micros)
            .ok_or_else(|| EventLogError::Invalid(format!("{column} {micros} is out of range")))
    };
    Ok(AdminSession {
        id: row.try_get("id").map_err(super::invalid)?,
        key_id: row.try_get("key_id").map_err(super::invalid)?,
        created_at: time("created_at")?,
        expires_at: time("expires_at")?,
        user_agent: row.try_get("user_agent").map_err(super::invalid)?,
    })
}

/// [`AdminSessions`] for a backend's log, whose `pool` field reads and
/// whose `$writer` expression (of `$log`) gives a connection to write on:
/// the statements above, bound the same way on both databases.
macro_rules! admin_sessions_of {
    ($log:ty, |$this:ident| $writer:expr) => {
        #[async_trait::async_trait]
        impl $crate::storage::events::AdminSessions for $log {
            async fn open_session(
                &self,
                session: &$crate::storage::events::AdminSession,
                token_hash: &str,
                now: chrono::DateTime<chrono::Utc>,
            ) -> Result<(), $crate::storage::events::EventLogError> {
                use $crate::storage::events::sessions::{OLDEST_KEPT_OFFSET, OPEN, PRUNE};
                let $this = self;
                let mut writer = $writer;
                sqlx::query(PRUNE)
                    .bind(now.timestamp_micros())
                    .bind(OLDEST_KEPT_OFFSET)
                    .execute(&mut *writer)
                    .await?;
                sqlx::query(OPEN)
                    .bind(&session.id)
                    .bind(token_hash)
                    .bind(&session.key_id)
                    .bind(session.created_at.timestamp_micros())
                    .bind(session.expires_at.timestamp_micros())
                    .bind(session.user_agent.as_deref())
                    .execute(&mut *writer)
                    .await?;
                Ok(())
            }

            async fn session(
                &self,
                token_hash: &str,
                now: chrono::DateTime<chrono::Utc>,
            ) -> Result<
                Option<$crate::storage::events::AdminSession>,
                $crate::storage::events::EventLogError,
            > {
                use $crate::storage::events::sessions::{FIND, session_of};
                sqlx::query(FIND)
                    .bind(token_hash)
                    .bind(now.timestamp_micros())
                    .fetch_optional(&self.pool)
                    .await?
                    .as_ref()
                    .map(session_of)
                    .transpose()
            }

            async fn sessions(
                &self,
                now: chrono::DateTime<chrono::Utc>,
            ) -> Result<
                Vec<$crate::storage::events::AdminSession>,
                $crate::storage::events::EventLogError,
            > {
                use $crate::storage::events::sessions::{LIST, session_of};
                sqlx::query(LIST)
                    .bind(now.timestamp_micros())
                    .fetch_all(&self.pool)
                    .await?
                    .iter()
                    .map(session_of)
                    .collect()
            }

            async fn end_session(
                &self,
                id: &str,
            ) -> Result<bool, $crate::storage::events::EventLogError> {
                let $this = self;
                let mut writer = $writer;
                let done = sqlx::query($crate::storage::events::sessions::END)
                    .bind(id)
                    .execute(&mut *writer)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn end_sessions(&self) -> Result<u64, $crate::storage::events::EventLogError> {
                let $this = self;
                let mut writer = $writer;
                let done = sqlx::query($crate::storage::events::sessions::END_ALL)
                    .execute(&mut *writer)
                    .await?;
                Ok(done.rows_affected())
            }
        }
    };
}
pub(super) use admin_sessions_of;
