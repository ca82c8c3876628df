//! Total-quota enforcement: a cap on how many subscriptions one subscriber
//! holds at once.
//!
//! The subscriptions service owns only the limit; the store that holds the
//! subscriptions counts them, inside the same atomic step that saves, so the
//! count can never drift from the data. [`QuotaEnforcer::check_total`]
//! fetches the limit first (so no lock is ever held across an HTTP call),
//! then hands the save to the store's
//! [`save_within_limit`](SubscriptionStore::save_within_limit), which
//! serialises conditional saves per (quota type, subscriber).
//!
//! The module holds no connection of its own beyond the store it is given,
//! and logs nothing: the caller logs the [`QuotaError`] it gets back, and
//! [`error_response`] (or `ApiError`'s `From`) turns it into the
//! HTTP answer:
//!
//! | status | code | meaning |
//! |---|---|---|
//! | 403 | `limit_reached` | the pool is full |
//! | 403 | `quota_not_allowed` | the subscriber's tier has no such quota |
//! | 502 | `quota_resource_not_found`, `quota_unexpected_response` | the subscriptions service answered, but not with a quota |
//! | 503 | `quota_unavailable` | the subscriptions service did not answer |
//! | 500 | `quota_misconfigured`, `quota_store_failed` | our side failed |
//!
//! The limit is never guessed: when it cannot be obtained the save is
//! refused. Decoding is strict, because a missing number read as 0 would
//! be a real limit of 0 (or, to a lenient reader, "unlimited").

#[cfg(feature = "testing")]
pub mod fake;

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use url::Url;
use websub_store::{OwnerQuota, StoreError, Subscription, SubscriptionStore};

use crate::delivery::client::{self, Purpose, Trust};

/// The internal key header when none is configured.
pub const DEFAULT_INTERNAL_API_KEY_HEADER: &str = "X-Internal-API-Key";
/// How long one quota lookup may take when no timeout is configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The kind of the quotas this module enforces; periodic quotas are
/// counted by the subscriptions service itself.
pub const KIND_TOTAL: &str = "total";

/// Where the limits come from and how they are fetched.
///
/// A plain value: build it with [`QuotaConfig::default`] and set fields
/// (the hub fills it from its `quota-*` and `internal-api-key*` settings).
/// It is checked by [`QuotaEnforcer::new`], so a misconfigured service
/// fails at start-up.
#[derive(Clone)]
pub struct QuotaConfig {
    /// The subscriptions service; quotas are read from
    /// `{base_url}/internal/subscriptions/{user_id}/quotas`.
    pub base_url: Option<Url>,
    /// How long one lookup may take, connecting included. Must be positive.
    pub timeout: Duration,
    /// The key that authorises the hub to the subscriptions service.
    pub internal_api_key: Option<String>,
    /// The header the key travels in.
    pub internal_api_key_header: String,
    /// The pool WebSub subscriptions count against.
    pub quota_type: String,
    /// The roots trusted when the service is reached over HTTPS.
    pub trust: Trust,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self {
            base_url: None,
            timeout: DEFAULT_TIMEOUT,
            internal_api_key: None,
            internal_api_key_header: DEFAULT_INTERNAL_API_KEY_HEADER.to_owned(),
            quota_type: OwnerQuota::DEFAULT_TYPE.to_owned(),
            trust: Trust::system(),
        }
    }
}

// The key stays out of logs.
impl fmt::Debug for QuotaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaConfig")
            .field("base_url", &self.base_url.as_ref().map(Url::as_str))
            .field("timeout", &self.timeout)
            .field(
                "internal_api_key",
                &self.internal_api_key.as_ref().map(|_| "<redacted>"),
            )
            .field("internal_api_key_header", &self.internal_api_key_header)
            .field("quota_type", &self.quota_type)
            .field("trust", &self.trust)
            .finish()
    }
}

/// One quota of a subscriber's tier, as the subscriptions service sends it.
///
/// Decoding is strict: `quota_limit` and `unlimited` must both be present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// The pool, e.g. `websub_subscriptions`.
    pub quota_type: String,
    /// `total` for the quotas enforced here; other kinds are the
    /// subscriptions service's own business.
    pub kind: String,
    /// How many the subscriber may hold; meaningful only when not
    /// `unlimited`, and 0 is a real limit of none.
    #[serde(rename = "quota_limit")]
    pub limit: u64,
    /// No cap at all. The only way a quota is unlimited.
    pub unlimited: bool,
}

impl Quota {
    /// A total quota of `limit`.
    pub fn total(quota_type: impl Into<String>, limit: u64) -> Self {
        Self {
            quota_type: quota_type.into(),
            kind: KIND_TOTAL.to_owned(),
            limit,
            unlimited: false,
        }
    }

    /// A total quota without a cap (sent with a limit of 0).
    pub fn unlimited(quota_type: impl Into<String>) -> Self {
        Self {
            unlimited: true,
            ..Self::total(quota_type, 0)
        }
    }
}

/// The body of the quotas endpoint: exactly the quotas the subscriber's
/// active tier defines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotasBody {
    /// Every quota of the tier; a type missing here is not allowed.
    pub quotas: Vec<Quota>,
}

/// Why a quota could not be checked, or why the save was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The configuration is incomplete or invalid.
    #[error("invalid quota configuration: {0}")]
    InvalidConfig(String),

    /// The subscriber's pool is full.
    #[error("subscription limit reached: {used} of {limit} in use")]
    LimitReached {
        /// The subscriber's limit.
        limit: u64,
        /// How many other subscriptions the subscriber held.
        used: u64,
    },

    /// The subscriber's tier has no quota of this type.
    #[error("the subscriber's tier does not allow {quota_type}")]
    NotAllowed {
        /// The quota type asked for.
        quota_type: String,
    },

    /// The subscriptions service does not know the subscriber (404).
    #[error("the subscriptions service has no quotas for subscriber {subscriber:?}")]
    ResourceNotFound {
        /// The subscriber asked about.
        subscriber: String,
    },

    /// The subscriptions service answered, but not with quotas: a non-200
    /// status other than 404, or a body that does not decode strictly.
    #[error("unexpected answer from the subscriptions service (status {status}): {reason}")]
    UnexpectedResponse {
        /// The status it answered with.
        status: StatusCode,
        /// What was wrong with the answer.
        reason: String,
    },

    /// The subscriptions service did not answer: unreachable, connection
    /// dropped, or timed out.
    #[error("the subscriptions service is unavailable")]
    Unavailable(#[source] reqwest::Error),

    /// The store failed, or was asked to count a subscription without an
    /// owner.
    #[error("the quota-checked save failed")]
    Store(#[from] StoreError),
}

impl QuotaError {
    /// The machine-readable code sent to clients.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidConfig(_) => "quota_misconfigured",
            Self::LimitReached { .. } => "limit_reached",
            Self::NotAllowed { .. } => "quota_not_allowed",
            Self::ResourceNotFound { .. } => "quota_resource_not_found",
            Self::UnexpectedResponse { .. } => "quota_unexpected_response",
            Self::Unavailable(_) => "quota_unavailable",
            Self::Store(_) => "quota_store_failed",
        }
    }

    /// The HTTP status of the answer: 403 when the subscriptions service
    /// refused, 502 when it answered with something other than a quota, 503
    /// when it did not answer, 500 when our side failed.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::LimitReached { .. } | Self::NotAllowed { .. } => StatusCode::FORBIDDEN,
            Self::ResourceNotFound { .. } | Self::UnexpectedResponse { .. } => {
                StatusCode::BAD_GATEWAY
            }
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::InvalidConfig(_) | Self::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The message sent to clients: what happened, without our internals.
    fn public_message(&self) -> String {
        match self {
            Self::LimitReached { .. } | Self::NotAllowed { .. } => self.to_string(),
            Self::ResourceNotFound { .. } => {
                "the subscriptions service has no quotas for this subscriber".to_owned()
            }
            Self::UnexpectedResponse { .. } => {
                "the subscriptions service answered without a usable quota".to_owned()
            }
            Self::Unavailable(_) => "the subscriptions service did not answer".to_owned(),
            Self::InvalidConfig(_) | Self::Store(_) => {
                "the subscription could not be checked against its quota".to_owned()
            }
        }
    }
}

/// The JSON body of a quota error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// [`QuotaError::code`].
    pub code: String,
    /// A human-readable reason.
    pub message: String,
    /// The limit, for `limit_reached`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// How many were in use, for `limit_reached`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<u64>,
}

/// The answer for the first [`QuotaError`] in `error`'s chain (the error
/// itself, then its sources), or `None` when the chain holds none, so the
/// caller maps the error its own way.
pub fn error_response(error: &(dyn StdError + 'static)) -> Option<Response> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(quota) = error.downcast_ref::<QuotaError>() {
            return Some(crate::web::api::ApiError::from(quota).into_response());
        }
        current = error.source();
    }
    None
}

impl From<&QuotaError> for ErrorBody {
    fn from(error: &QuotaError) -> Self {
        let (limit, used) = match error {
            QuotaError::LimitReached { limit, used } => (Some(*limit), Some(*used)),
            _ => (None, None),
        };
        Self {
            code: error.code().to_owned(),
            message: error.public_message(),
            limit,
            used,
        }
    }
}

/// Fetches limits and runs quota-checked saves. Cheap to clone: clones share
/// one HTTP client.
#[derive(Debug, Clone)]
pub struct QuotaEnforcer {
    inner: Arc<EnforcerState>,
}

#[derive(Debug)]
struct EnforcerState {
    client: reqwest::Client,
    base_url: Url,
    key: http::HeaderValue,
    key_header: http::HeaderName,
    quota_type: String,
}

impl QuotaEnforcer {
    /// Checks the configuration and builds the client.
    ///
    /// Fails with [`QuotaError::InvalidConfig`] without a base URL (or with
    /// one that is not http(s)), without an internal key, with a header
    /// name or key that cannot travel in a header, with an empty quota
    /// type, or with a timeout that is not positive (a zero timeout would
    /// disable it).
    pub fn new(config: QuotaConfig) -> Result<Self, QuotaError> {
        let invalid = |reason: &str| QuotaError::InvalidConfig(reason.to_owned());
        let base_url = config
            .base_url
            .ok_or_else(|| invalid("no subscriptions service URL (WEBSUB_QUOTA_URL)"))?;
        if !matches!(base_url.scheme(), "http" | "https") || base_url.host().is_none() {
            return Err(invalid(
                "the subscriptions service URL must be an absolute http(s) URL",
            ));
        }
        let key = config
            .internal_api_key
            .filter(|key| !key.is_empty())
            .ok_or_else(|| invalid("no internal API key (WEBSUB_INTERNAL_API_KEY)"))?;
        let mut key = http::HeaderValue::from_str(&key)
            .map_err(|_| invalid("the internal API key cannot be sent in a header"))?;
        key.set_sensitive(true);
        let key_header = http::HeaderName::from_bytes(config.internal_api_key_header.as_bytes())
            .map_err(|_| invalid("the internal API key header is not a valid header name"))?;
        if config.timeout.is_zero() {
            return Err(invalid("the quota timeout must be positive"));
        }
        if config.quota_type.is_empty() {
            return Err(invalid("the quota type is empty"));
        }
        // The internal key must reach the subscriptions service and nothing
        // in between.
        let client = client::build(Purpose::OperatorService, config.timeout, &config.trust)
            .map_err(|error| QuotaError::InvalidConfig(format!("HTTP client: {error}")))?;
        Ok(Self {
            inner: Arc::new(EnforcerState {
                client,
                base_url,
                key,
                key_header,
                quota_type: config.quota_type,
            }),
        })
    }

    /// The quota type [`check_total`](Self::check_total) enforces.
    pub fn quota_type(&self) -> &str {
        &self.inner.quota_type
    }

    /// The subscriber's quota of `quota_type`, fetched from the
    /// subscriptions service (e.g. for a usage endpoint).
    ///
    /// [`QuotaError::NotAllowed`] when the tier has no such quota;
    /// [`QuotaError::ResourceNotFound`] on a 404;
    /// [`QuotaError::UnexpectedResponse`] on any other non-200 or a body that
    /// does not decode strictly; [`QuotaError::Unavailable`] when the
    /// service did not answer in time.
    ///
    /// The subscriber id travels as one percent-encoded path segment. An id
    /// that cannot be one (empty, `.` or `..`) names no subscriber the
    /// service can know: [`QuotaError::ResourceNotFound`], without a request.
    pub async fn limit(&self, quota_type: &str, subscriber_id: &str) -> Result<Quota, QuotaError> {
        if matches!(subscriber_id, "" | "." | "..") {
            return Err(QuotaError::ResourceNotFound {
                subscriber: subscriber_id.to_owned(),
            });
        }
        let url = self.quotas_url(subscriber_id)?;
        let response = self
            .inner
            .client
            .get(url)
            .header(&self.inner.key_header, &self.inner.key)
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(QuotaError::Unavailable)?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Err(QuotaError::ResourceNotFound {
                subscriber: subscriber_id.to_owned(),
            });
        }
        if status != StatusCode::OK {
            return Err(QuotaError::UnexpectedResponse {
                status,
                reason: "expected 200 with the subscriber's quotas".to_owned(),
            });
        }
        let body = response.bytes().await.map_err(QuotaError::Unavailable)?;
        let decoded: QuotasBody =
            serde_json::from_slice(&body).map_err(|error| QuotaError::UnexpectedResponse {
                status,
                reason: format!("undecodable quotas: {error}"),
            })?;
        decoded
            .quotas
            .into_iter()
            .find(|quota| quota.quota_type == quota_type)
            .ok_or_else(|| QuotaError::NotAllowed {
                quota_type: quota_type.to_owned(),
            })
    }

    /// Saves `subscription` into the store if its owner's pool has room.
    ///
    /// The owner is the subscriber whose tier sets the limit; a subscription
    /// without one (or with an empty one) fails with [`StoreError::MissingOwner`] before anything
    /// is fetched. The limit is fetched first, with no lock held. An
    /// unlimited quota saves plainly, without counting; a quota the tier
    /// does not allow, or a limit that cannot be obtained, saves nothing.
    /// Otherwise the store counts and saves in one atomic step serialised
    /// per owner, and a full pool is [`QuotaError::LimitReached`]. A
    /// re-subscribe of a pair the owner already holds never counts as new.
    pub async fn check_total(
        &self,
        store: &dyn SubscriptionStore,
        subscription: &Subscription,
    ) -> Result<(), QuotaError> {
        let owner = subscription
            .owner
            .as_deref()
            .filter(|owner| !owner.is_empty())
            .ok_or(QuotaError::Store(StoreError::MissingOwner))?;
        let quota = self.limit(&self.inner.quota_type, owner).await?;
        if quota.unlimited {
            store.save(subscription).await?;
            return Ok(());
        }
        let pool = OwnerQuota {
            quota_type: self.inner.quota_type.clone(),
            limit: quota.limit,
        };
        match store.save_within_limit(subscription, &pool).await {
            Ok(()) => Ok(()),
            Err(StoreError::LimitReached { limit, used }) => {
                Err(QuotaError::LimitReached { limit, used })
            }
            Err(other) => Err(QuotaError::Store(other)),
        }
    }

    fn quotas_url(&self, subscriber_id: &str) -> Result<Url, QuotaError> {
        let mut url = self.inner.base_url.clone();
        url.set_query(None);
        url.set_fragment(None);
        // `new` admitted only http(s) URLs with a host, which always have
        // path segments; the error is kept rather than assumed away.
        url.path_segments_mut()
            .map_err(|()| {
                QuotaError::InvalidConfig("the subscriptions service URL has no path".to_owned())
            })?
            .pop_if_empty()
            .extend(["internal", "subscriptions", subscriber_id, "quotas"]);
        Ok(url)
    }
}
