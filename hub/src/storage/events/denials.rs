//! The operator's deny list (`websub_denials`): patterns of topics and of
//! callbacks whose subscribe requests are denied, kept beside the event log
//! so that every replica denies alike. What a pattern matches, and when
//! the list is read again, is [`crate::intake::deny`]'s.
//!
//! At most [`MAX_DENIALS`] patterns; times are microseconds on both
//! databases, so the statements here are the only ones.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::EventLogError;

/// The most patterns the list holds.
pub const MAX_DENIALS: i64 = 1_000;

/// What a pattern is matched against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeniedField {
    /// The subscription's topic URL.
    Topic,
    /// The subscription's callback URL.
    Callback,
}

impl DeniedField {
    /// The field as the API and the database spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Topic => "topic",
            Self::Callback => "callback",
        }
    }

    /// The field `name` spells, if any.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Topic, Self::Callback]
            .into_iter()
            .find(|field| field.as_str() == name)
    }
}

/// One pattern of the deny list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Denial {
    /// Its id, to remove it by.
    pub id: String,
    /// What it is matched against.
    pub field: DeniedField,
    /// The pattern: `*` matches any run of characters, case aside.
    pub pattern: String,
    /// Sent to a denied callback as `hub.reason`.
    pub reason: String,
    /// When it was added.
    pub created_at: DateTime<Utc>,
}

/// Where the deny list is kept.
#[async_trait]
pub trait DenyList: Send + Sync + std::fmt::Debug {
    /// Adds `denial`; a pattern already listed for its field keeps its id
    /// and takes the new reason. The denial as kept, or `None` when the
    /// list already holds [`MAX_DENIALS`] others.
    async fn add_denial(&self, denial: &Denial) -> Result<Option<Denial>, EventLogError>;

    /// Every pattern, oldest first.
    async fn denials(&self) -> Result<Vec<Denial>, EventLogError>;

    /// Removes the pattern `id`; whether there was one.
    async fn remove_denial(&self, id: &str) -> Result<bool, EventLogError>;
}

pub(super) const OTHERS: &str =
    "SELECT count(*) FROM websub_denials WHERE NOT (field = $1 AND pattern = $2)";

pub(super) const ADD: &str = "INSERT INTO websub_denials (id, field, pattern, reason, created_at) \
     VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (field, pattern) DO UPDATE SET reason = excluded.reason \
     RETURNING id, field, pattern, reason, created_at";

pub(super) const LIST: &str = "SELECT id, field, pattern, reason, created_at \
     FROM websub_denials ORDER BY created_at, id";

pub(super) const REMOVE: &str = "DELETE FROM websub_denials WHERE id = $1";

/// A denial from a row of [`ADD`] or [`LIST`], on either database.
pub(super) fn denial_of<'r, R>(row: &'r R) -> Result<Denial, EventLogError>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let field: String = row.try_get("field").map_err(super::invalid)?;
    let micros: i64 = row.try_get("created_at").map_err(super::invalid)?;
    Ok(Denial {
        id: row.try_get("id").map_err(super::invalid)?,
        field: DeniedField::parse(&field)
            .ok_or_else(|| EventLogError::Invalid(format!("denied field {field:?}")))?,
        pattern: row.try_get("pattern").map_err(super::invalid)?,
        reason: row.try_get("reason").map_err(super::invalid)?,
        created_at: DateTime::from_timestamp_micros(micros).ok_or_else(|| {
            EventLogError::Invalid(format!("created_at {micros} is out of range"))
        })?,
    })
}

/// [`DenyList`] for a backend's log, whose `pool` field reads and whose
/// `$writer` expression (of `$log`) gives a connection to write on.
macro_rules! deny_list_of {
    ($log:ty, |$this:ident| $writer:expr) => {
        #[async_trait::async_trait]
        impl $crate::storage::events::DenyList for $log {
            async fn add_denial(
                &self,
                denial: &$crate::storage::events::Denial,
            ) -> Result<Option<$crate::storage::events::Denial>, $crate::storage::events::EventLogError>
            {
                use $crate::storage::events::denials::{ADD, MAX_DENIALS, OTHERS, denial_of};
                let $this = self;
                let mut writer = $writer;
                let others: i64 = sqlx::query_scalar(OTHERS)
                    .bind(denial.field.as_str())
                    .bind(&denial.pattern)
                    .fetch_one(&mut *writer)
                    .await?;
                if others >= MAX_DENIALS {
                    return Ok(None);
                }
                let row = sqlx::query(ADD)
                    .bind(&denial.id)
                    .bind(denial.field.as_str())
                    .bind(&denial.pattern)
                    .bind(&denial.reason)
                    .bind(denial.created_at.timestamp_micros())
                    .fetch_one(&mut *writer)
                    .await?;
                denial_of(&row).map(Some)
            }

            async fn denials(
                &self,
            ) -> Result<Vec<$crate::storage::events::Denial>, $crate::storage::events::EventLogError>
            {
                use $crate::storage::events::denials::{LIST, denial_of};
                sqlx::query(LIST)
                    .fetch_all(&self.pool)
                    .await?
                    .iter()
                    .map(denial_of)
                    .collect()
            }

            async fn remove_denial(
                &self,
                id: &str,
            ) -> Result<bool, $crate::storage::events::EventLogError> {
                let $this = self;
                let mut writer = $writer;
                let done = sqlx::query($crate::storage::events::denials::REMOVE)
                    .bind(id)
                    .execute(&mut *writer)
                    .await?;
                Ok(done.rows_affected() > 0)
            }
        }
    };
}
pub(super) use deny_list_of;
