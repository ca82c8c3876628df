//! The one error type every backend reports, with variants callers match on.

/// What a [`SubscriptionStore`](crate::SubscriptionStore) operation can fail
/// with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// `get` of a pair that is not stored.
    #[error("unknown subscription of {callback} to {topic}")]
    UnknownSubscription {
        /// The topic asked for.
        topic: String,
        /// The callback asked for.
        callback: String,
    },

    /// A conditional save found the owner's pool full.
    #[error("subscription limit reached: {used} of {limit} in use")]
    LimitReached {
        /// The limit the save was held to.
        limit: u64,
        /// How many other subscriptions the owner held when the save was
        /// refused.
        used: u64,
    },

    /// A conditional save of a subscription without an owner.
    #[error("a conditional save needs a subscription with an owner")]
    MissingOwner,

    /// A value the backend cannot hold (e.g. a row it cannot decode).
    #[error("invalid stored value: {0}")]
    Invalid(String),

    /// The backend failed: connection lost, query refused, and so on.
    #[error("store backend failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl StoreError {
    /// Wraps a backend's own error.
    pub fn backend(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Backend(Box::new(error))
    }

    /// The error `get` reports for a missing pair.
    pub fn unknown(topic: &str, callback: &str) -> Self {
        Self::UnknownSubscription {
            topic: topic.to_owned(),
            callback: callback.to_owned(),
        }
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        Self::backend(error)
    }
}

#[cfg(feature = "redis")]
impl From<redis::RedisError> for StoreError {
    fn from(error: redis::RedisError) -> Self {
        Self::backend(error)
    }
}
