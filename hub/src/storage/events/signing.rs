//! How WebSub subscriptions' deliveries are signed, where a subscriber
//! asked for anything but the default (`websub_subscription_signing`): the
//! Standard Webhooks scheme instead of `X-Hub-Signature`, and the secret a
//! rotation replaces, until when. Kept beside the event log, whatever store
//! holds the subscriptions; each process keeps a copy
//! ([`crate::delivery::websub`]). Times are microseconds on both
//! databases, so the statements here are the only ones.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::EventLogError;

/// How a subscription's deliveries are signed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum SigningScheme {
    /// WebSub's `X-Hub-Signature: sha256=…` (the default).
    #[default]
    #[serde(rename = "websub")]
    WebSub,
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp` and
    /// `webhook-signature` over all three; the secret is `whsec_…`.
    #[serde(rename = "standard-webhooks")]
    StandardWebhooks,
}

impl SigningScheme {
    /// The scheme as the API and the database spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WebSub => "websub",
            Self::StandardWebhooks => "standard-webhooks",
        }
    }

    /// The scheme `name` spells, if any.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::WebSub, Self::StandardWebhooks]
            .into_iter()
            .find(|scheme| scheme.as_str() == name)
    }
}

/// One subscription's signing, as asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signing {
    /// The subscription's topic.
    pub topic: String,
    /// The subscription's callback.
    pub callback: String,
    /// Its scheme.
    pub scheme: SigningScheme,
    /// The secret a rotation replaced, and until when it still signs too.
    pub previous: Option<(String, DateTime<Utc>)>,
    /// When it was set: it applies to the subscription created no later.
    pub since: DateTime<Utc>,
}

/// Where subscriptions' signing is kept.
#[async_trait]
pub trait SubscriptionSigning: Send + Sync + std::fmt::Debug {
    /// Keeps `signing`, replacing what its subscription had.
    async fn set_signing(&self, signing: &Signing) -> Result<(), EventLogError>;

    /// The subscriptions' signing, at most `limit`, by topic and callback.
    async fn signings(&self, limit: usize) -> Result<Vec<Signing>, EventLogError>;
}

pub(super) const SET: &str = "INSERT INTO websub_subscription_signing \
     (topic, callback, scheme, previous_secret, previous_until, since) \
     VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (topic, callback) DO UPDATE SET scheme = excluded.scheme, \
     previous_secret = excluded.previous_secret, previous_until = excluded.previous_until, \
     since = excluded.since";

pub(super) const LIST: &str = "SELECT topic, callback, scheme, previous_secret, previous_until, \
     since FROM websub_subscription_signing ORDER BY topic, callback LIMIT $1";

/// A signing from a row of [`LIST`], on either database.
pub(super) fn signing_of<'r, R>(row: &'r R) -> Result<Signing, EventLogError>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let time = |micros: i64| {
        DateTime::from_timestamp_micros(micros)
            .ok_or_else(|| EventLogError::Invalid(format!("time {micros} is out of range")))
    };
    let scheme: String = row.try_get("scheme").map_err(super::invalid)?;
    let previous_secret: Option<String> = row.try_get("previous_secret").map_err(super::invalid)?;
    let previous_until: Option<i64> = row.try_get("previous_until").map_err(super::invalid)?;
    let previous = match (previous_secret, previous_until) {
        (Some(secret), Some(until)) => Some((secret, time(until)?)),
        _ => None,
    };
    Ok(Signing {
        topic: row.try_get("topic").map_err(super::invalid)?,
        callback: row.try_get("callback").map_err(super::invalid)?,
        scheme: SigningScheme::parse(&scheme)
            .ok_or_else(|| EventLogError::Invalid(format!("signing scheme {scheme:?}")))?,
        previous,
        since: time(row.try_get("since").map_err(super::invalid)?)?,
    })
}

/// [`SubscriptionSigning`] for a backend's log, whose `pool` field reads
/// and whose `$writer` expression (of `$log`) gives a connection to write
/// on.
macro_rules! subscription_signing_of {
    ($log:ty, |$this:ident| $writer:expr) => {
        #[async_trait::async_trait]
        impl $crate::storage::events::SubscriptionSigning for $log {
            async fn set_signing(
                &self,
                signing: &$crate::storage::events::Signing,
            ) -> Result<(), $crate::storage::events::EventLogError> {
                let $this = self;
                let mut writer = $writer;
                sqlx::query($crate::storage::events::signing::SET)
                    .bind(&signing.topic)
                    .bind(&signing.callback)
                    .bind(signing.scheme.as_str())
                    .bind(signing.previous.as_ref().map(|(secret, _)| secret.as_str()))
                    .bind(signing.previous.as_ref().map(|(_, until)| until.timestamp_micros()))
                    .bind(signing.since.timestamp_micros())
                    .execute(&mut *writer)
                    .await?;
                Ok(())
            }

            async fn signings(
                &self,
                limit: usize,
            ) -> Result<Vec<$crate::storage::events::Signing>, $crate::storage::events::EventLogError>
            {
                use $crate::storage::events::signing::{LIST, signing_of};
                sqlx::query(LIST)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(&self.pool)
                    .await?
                    .iter()
                    .map(signing_of)
                    .collect()
            }
        }
    };
}
pub(super) use subscription_signing_of;
