//! What the delivery core keeps of endpoints, and the contract of whoever
//! keeps it for it (the hub's event log, on SQLite or PostgreSQL): failures
//! counted per endpoint, endpoints disabled and enabled, the attempts of
//! outbox webhooks (whose delivery rows are the producer's), where a
//! delivery stands, and the error of that keeper. [`health`](crate::health),
//! [`changes`](crate::changes), [`operator`](crate::operator) and the
//! outbox's dispatcher work through [`EndpointStates`] alone.
//!
//! [`bounded`] is how every statement of a keeper on a server database
//! runs when a silent peer must not hold it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::attempt::Attempt;
use crate::history::EndpointChanges;

/// Endpoint state: failures counted per endpoint, endpoints disabled and
/// enabled, the attempts of outbox webhooks, and the history of changes.
#[async_trait]
pub trait EndpointStates: Send + Sync + std::fmt::Debug {
    /// The endpoints of `channel` (a [`Channel`](crate::Channel)
    /// label) that failed since their last delivery or are disabled,
    /// disabled first, at most `limit`.
    async fn endpoints(
        &self,
        channel: &str,
        limit: usize,
    ) -> Result<Vec<EndpointRecord>, EventLogError>;

    /// One endpoint of `channel` as [`EndpointStates::endpoints`] lists it,
    /// if it failed since its last delivery or is disabled.
    async fn endpoint(
        &self,
        channel: &str,
        endpoint: &str,
    ) -> Result<Option<EndpointRecord>, EventLogError>;

    /// Counts outcomes against their endpoints: each exhaustion is one more
    /// failure in a row, and an endpoint that reaches `disable_after` (when
    /// not 0) is disabled at `now`; a delivery to an enabled endpoint clears
    /// its failures. Returns the endpoints this call disabled.
    async fn tally_endpoints(
        &self,
        channel: &str,
        exhausted: &[Exhaustion<'_>],
        delivered: &[&str],
        disable_after: u32,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, EventLogError>;

    /// Disables `endpoint` at `now` for `reason`, or (`reason` none) enables
    /// it again with its failures cleared. Returns whether it changed.
    async fn set_endpoint_disabled(
        &self,
        channel: &str,
        endpoint: &str,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool, EventLogError>;

    /// The events whose outbox webhook `subscriber` was attempted at or
    /// after `since`, each once, at most `limit`: among a recovered
    /// webhook's rows, those that ran out of retries while it was failing,
    /// as the hub's own history tells them (the rows themselves are the
    /// producer's, and carry no mark of it).
    async fn webhook_events_attempted_since(
        &self,
        subscriber: &str,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Uuid>, EventLogError>;

    /// Keeps the attempts of outbox webhooks, whose delivery rows live in
    /// the producer's database. the log's retention deletes them by
    /// age.
    async fn keep_webhook_attempts(
        &self,
        attempts: &[WebhookAttempt<'_>],
    ) -> Result<(), EventLogError>;

    /// The attempts of one outbox webhook delivery, oldest first.
    async fn webhook_attempts(
        &self,
        event_id: Uuid,
        subscriber: &str,
    ) -> Result<Vec<Attempt>, EventLogError>;

    /// The history of endpoint changes, in the same database.
    fn changes(&self) -> &dyn EndpointChanges;
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    /// Due, retrying or in flight.
    Pending,
    /// The subscriber answered 2xx.
    Delivered,
    /// Closed without a delivery: the subscription went away (a 410, an
    /// expired lease, an unsubscribe).
    Dropped,
    /// Out of retries; an operator may retry it.
    Failed,
    /// Not sent: its endpoint was disabled. Replayable.
    Skipped,
}

impl DeliveryState {
    /// Every state, in the order a list explains them.
    pub const ALL: [Self; 5] = [
        Self::Pending,
        Self::Delivered,
        Self::Dropped,
        Self::Failed,
        Self::Skipped,
    ];

    /// The state as the APIs and the database's filters spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Dropped => "dropped",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
        }
    }

    /// The state `name` spells, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == name)
    }

    /// The state of a record with these columns: due or not, closed or not,
    /// and how its last outcome ended.
    pub fn of(processed: bool, due: bool, outcome: Option<&str>) -> Result<Self, EventLogError> {
        Ok(match (processed, due, outcome) {
            (false, true, _) => Self::Pending,
            (false, false, _) => Self::Failed,
            (true, _, None | Some("delivered")) => Self::Delivered,
            (true, _, Some("dropped")) => Self::Dropped,
            (true, _, Some("skipped")) => Self::Skipped,
            (true, _, Some(other)) => {
                return Err(EventLogError::Invalid(format!(
                    "a closed record with outcome {other:?}"
                )));
            }
        })
    }
}

/// An endpoint that failed since its last delivery, or that is disabled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointRecord {
    /// The channel: `websub` or `webhook`.
    pub channel: String,
    /// The callback URL (or the webhook's name).
    pub endpoint: String,
    /// Deliveries to it that exhausted their retries in a row.
    pub failures: u32,
    /// When the latest of them failed.
    pub last_failure_at: Option<DateTime<Utc>>,
    /// Why it failed.
    pub last_error: Option<String>,
    /// When it was disabled; `None` while enabled.
    pub disabled_at: Option<DateTime<Utc>>,
    /// Why it was disabled.
    pub disabled_reason: Option<String>,
}

/// One delivery that exhausted its retries, for the endpoints' tally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exhaustion<'a> {
    /// The endpoint it went to.
    pub endpoint: &'a str,
    /// Why its last attempt failed.
    pub error: &'a str,
}

/// One attempt of an outbox webhook delivery, to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebhookAttempt<'a> {
    /// The outbox event.
    pub event_id: Uuid,
    /// The webhook's name.
    pub subscriber: &'a str,
    /// The attempt, its error filled in.
    pub attempt: &'a Attempt,
}

/// Failures of the event log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventLogError {
    /// The database failed.
    #[error("event log database failed: {0}")]
    Database(#[from] sqlx::Error),
    /// Migrations failed.
    #[error("event log migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// `expand` of an event that is not in the log (never recorded, or
    /// purged).
    #[error("no event {0} in the log")]
    UnknownEvent(Uuid),
    /// A stored value could not be decoded.
    #[error("invalid stored event data: {0}")]
    Invalid(String),
}

pub use websub_store::bounded;
