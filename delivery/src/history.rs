//! The history of endpoint state changes (`websub_endpoint_changes`): each
//! change an endpoint went through (failing, open, recovered, disabled,
//! enabled), in the order it was recorded, for operators to read, and the
//! queue the optional operator webhook is sent from. The decisions are the
//! delivery core's ([`crate::changes`]); this is where they are
//! kept, behind a trait of its own that both backends of the event log
//! implement ([`EndpointStates::changes`](crate::state::EndpointStates::changes)).
//!
//! The table is bounded twice: at most [`MAX_CHANGES`] rows in all (each
//! append trims the oldest beyond it), and the retention purges rows older
//! than it with the events. Of these, those not yet sent to the operator
//! webhook are bounded again by its sender (see
//! [`EndpointChanges::shed_unsent`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::state::EventLogError;

/// The most changes kept: appending more deletes the oldest. At a few
/// changes per endpoint per outage, this is months of a busy hub's history.
pub const MAX_CHANGES: i64 = 100_000;

/// What an endpoint became.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum EndpointState {
    /// Attempts to it fail (recorded as the failures in a row reach each
    /// stage, see [`crate::changes::failing_stage`]).
    Failing,
    /// Its breaker opened: deliveries wait while probes test it.
    Open,
    /// It answered again after failing: what waited is sent.
    Recovered,
    /// Disabled (after failures, a long outage, or by an operator): its
    /// deliveries are skipped.
    Disabled,
    /// Enabled again by an operator.
    Enabled,
}

impl EndpointState {
    /// Every state, in the order an endpoint may go through them.
    pub const ALL: [Self; 5] = [
        Self::Failing,
        Self::Open,
        Self::Recovered,
        Self::Disabled,
        Self::Enabled,
    ];

    /// The state as the API, the metrics and the database spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failing => "failing",
            Self::Open => "open",
            Self::Recovered => "recovered",
            Self::Disabled => "disabled",
            Self::Enabled => "enabled",
        }
    }

    /// The state `name` spells, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == name)
    }
}

/// A change to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChange {
    /// The channel's label (`websub`, `webhook`, `operator`).
    pub channel: &'static str,
    /// The callback URL, or the webhook's name or URL.
    pub endpoint: String,
    /// What it became.
    pub to: EndpointState,
    /// When.
    pub at: DateTime<Utc>,
    /// Failures in a row so far, when the change counts them.
    pub failures: Option<u32>,
    /// Failing (or open) since.
    pub since: Option<DateTime<Utc>>,
    /// The last error, or why it was disabled.
    pub reason: Option<String>,
    /// What made the change: `breaker`, `tally`, `outage` or `operator`.
    pub source: &'static str,
}

/// Where the operator webhook's delivery of a change stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum WebhookState {
    /// Not sent yet (or no operator webhook is configured).
    Pending,
    /// The operator webhook answered 2xx.
    Delivered,
    /// Out of retries.
    Failed,
    /// Shed: past the bound of changes waiting, or too old to send.
    Dropped,
}

impl WebhookState {
    /// The state as the API and the database spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
            Self::Dropped => "dropped",
        }
    }

    /// The state `name` spells, if any.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Pending, Self::Delivered, Self::Failed, Self::Dropped]
            .into_iter()
            .find(|state| state.as_str() == name)
    }
}

/// A recorded change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointChange {
    /// Its place in the history: later changes have higher ids.
    pub id: i64,
    /// The channel: `websub`, `webhook` or `operator`.
    pub channel: String,
    /// The callback URL, or the webhook's name or URL.
    pub endpoint: String,
    /// What it became.
    pub to: EndpointState,
    /// When.
    pub at: DateTime<Utc>,
    /// Failures in a row so far, when the change counts them.
    pub failures: Option<u32>,
    /// Failing (or open) since.
    pub since: Option<DateTime<Utc>>,
    /// The last error, or why it was disabled.
    pub reason: Option<String>,
    /// What made the change: `breaker`, `tally`, `outage` or `operator`.
    pub source: Option<String>,
    /// Where its delivery to the operator webhook stands.
    pub webhook_state: WebhookState,
    /// Failed attempts to send it to the operator webhook.
    pub webhook_retries: u32,
    /// Why the last of them failed.
    pub webhook_error: Option<String>,
    /// When the operator webhook took it.
    pub delivered_at: Option<DateTime<Utc>>,
}

/// Which changes [`EndpointChanges::list_changes`] returns; `None` matches
/// everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChangeFilter<'a> {
    /// Changes of this channel.
    pub channel: Option<&'a str>,
    /// Changes of this endpoint.
    pub endpoint: Option<&'a str>,
}

/// How one attempt to send a change to the operator webhook ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// Delivered at this time.
    Delivered(DateTime<Utc>),
    /// Due again at `next_attempt_at`; `counted` when the failure spends a
    /// retry (not while the webhook's breaker holds it).
    Retry {
        /// Why it failed.
        error: String,
        /// When it is due again.
        next_attempt_at: DateTime<Utc>,
        /// Whether a retry was spent.
        counted: bool,
    },
    /// Out of retries.
    Failed {
        /// Why the last attempt failed.
        error: String,
    },
    /// Not attempted: the claim is handed back, due as it was.
    Released,
}

/// Where the history of endpoint changes is kept. Every method is safe to
/// call concurrently, from several processes sharing one database; times
/// are passed in.
#[async_trait]
pub trait EndpointChanges: Send + Sync + std::fmt::Debug {
    /// Appends `changes` in their order, each pending for the operator
    /// webhook and due at its own time, and trims the history to the
    /// newest [`MAX_CHANGES`].
    async fn append_changes(&self, changes: &[NewChange]) -> Result<(), EventLogError>;

    /// The changes matching `filter`, newest first, at most `limit`.
    async fn list_changes(
        &self,
        filter: ChangeFilter<'_>,
        limit: usize,
    ) -> Result<Vec<EndpointChange>, EventLogError>;

    /// Claims up to `limit` changes pending for the operator webhook and
    /// due at `now`, oldest first, until `until`: concurrent claimers never
    /// receive the same change, and a claim that ran out is taken over.
    async fn claim_unsent(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<EndpointChange>, EventLogError>;

    /// Records how the attempts of claimed changes ended, releasing their
    /// claims.
    async fn settle_sent(&self, settled: &[(i64, Sent)]) -> Result<(), EventLogError>;

    /// Marks dropped the changes pending for the operator webhook beyond
    /// the newest `keep`, and those recorded before `older_than`. Returns
    /// how many.
    async fn shed_unsent(
        &self,
        keep: usize,
        older_than: DateTime<Utc>,
    ) -> Result<u64, EventLogError>;

    /// Deletes the changes recorded before `cutoff`. Returns how many.
    async fn purge_changes_before(&self, cutoff: DateTime<Utc>) -> Result<u64, EventLogError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_their_names() {
        for state in EndpointState::ALL {
            assert_eq!(EndpointState::parse(state.as_str()), Some(state));
            assert_eq!(
                serde_json::to_value(state).expect("serialise"),
                serde_json::Value::from(state.as_str())
            );
        }
        assert_eq!(EndpointState::parse("closed"), None);
        for state in [
            WebhookState::Pending,
            WebhookState::Delivered,
            WebhookState::Failed,
            WebhookState::Dropped,
        ] {
            assert_eq!(WebhookState::parse(state.as_str()), Some(state));
        }
    }
}
