//! The endpoints' state and history
//! ([`EndpointStates`](super::super::EndpointStates),
//! [`EndpointChanges`](super::super::EndpointChanges)): the delivery core's
//! traits, so each backend implements them with `endpoint_states_of!(Log)`
//! and `endpoint_changes_of!(Log)`, whose every call is its
//! [`SqlEventLog`](super::SqlEventLog)'s. Appending is the backend's (a batch is rows of JSON or
//! arrays), and so is the claim's statement: PostgreSQL's skips the rows
//! another replica's claim holds, SQLite's runs alone on the write
//! connection.

use std::sync::LazyLock;

use super::super::sql::changes::COLUMNS;

// The casts make an unset filter's NULL typed, as PostgreSQL asks; SQLite
// takes them as they are.
pub(in crate::storage::events) static LIST: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {COLUMNS} FROM websub_endpoint_changes \
         WHERE (CAST($1 AS TEXT) IS NULL OR channel = $1) \
           AND (CAST($2 AS TEXT) IS NULL OR endpoint = $2) \
         ORDER BY id DESC LIMIT $3"
    )
});

/// [`EndpointChanges`](super::super::EndpointChanges) for a backend's log:
/// each call is its [`SqlEventLog`](super::SqlEventLog)'s.
macro_rules! endpoint_changes_of {
    ($log:ty) => {
        #[async_trait::async_trait]
        impl $crate::storage::events::EndpointChanges for $log {
            async fn append_changes(
                &self,
                changes: &[$crate::storage::events::NewChange],
            ) -> Result<(), $crate::storage::events::EventLogError> {
                $crate::storage::events::shared::SqlEventLog::changes_appended(self, changes).await
            }

            async fn list_changes(
                &self,
                filter: $crate::storage::events::ChangeFilter<'_>,
                limit: usize,
            ) -> Result<
                Vec<$crate::storage::events::EndpointChange>,
                $crate::storage::events::EventLogError,
            > {
                $crate::storage::events::shared::SqlEventLog::changes_listed(self, filter, limit)
                    .await
            }

            async fn claim_unsent(
                &self,
                now: chrono::DateTime<chrono::Utc>,
                until: chrono::DateTime<chrono::Utc>,
                limit: usize,
            ) -> Result<
                Vec<$crate::storage::events::EndpointChange>,
                $crate::storage::events::EventLogError,
            > {
                $crate::storage::events::shared::SqlEventLog::changes_claimed(
                    self, now, until, limit,
                )
                .await
            }

            async fn settle_sent(
                &self,
                settled: &[(i64, $crate::storage::events::Sent)],
            ) -> Result<(), $crate::storage::events::EventLogError> {
                $crate::storage::events::shared::SqlEventLog::changes_settled(self, settled).await
            }

            async fn shed_unsent(
                &self,
                keep: usize,
                older_than: chrono::DateTime<chrono::Utc>,
            ) -> Result<u64, $crate::storage::events::EventLogError> {
                $crate::storage::events::shared::SqlEventLog::changes_shed(self, keep, older_than)
                    .await
            }

            async fn purge_changes_before(
                &self,
                cutoff: chrono::DateTime<chrono::Utc>,
            ) -> Result<u64, $crate::storage::events::EventLogError> {
                $crate::storage::events::shared::SqlEventLog::changes_purged(self, cutoff).await
            }
        }
    };
}
pub(in crate::storage::events) use endpoint_changes_of;

/// [`EndpointStates`](super::super::EndpointStates) for a backend's log:
/// each call is its [`SqlEventLog`](super::SqlEventLog)'s.
macro_rules! endpoint_states_of {
    ($log:ty) => {
        #[async_trait::async_trait]
        impl $crate::storage::events::EndpointStates for $log {
            async fn keep_webhook_attempts(
                &self,
                attempts: &[$crate::storage::events::WebhookAttempt<'_>],
            ) -> Result<(), $crate::storage::events::EventLogError> {
                if attempts.is_empty() {
                    return Ok(());
                }
                $crate::storage::events::shared::SqlEventLog::write_webhook_attempts(self, attempts)
                    .await
            }

            async fn webhook_attempts(
                &self,
                event_id: uuid::Uuid,
                subscriber: &str,
            ) -> Result<Vec<$crate::storage::events::Attempt>, $crate::storage::events::EventLogError>
            {
                $crate::storage::events::shared::SqlEventLog::attempts_by(
                    self,
                    $crate::storage::events::sql::WEBHOOK_ATTEMPTS,
                    event_id,
                    subscriber,
                )
                .await
            }

            async fn endpoints(
                &self,
                channel: &str,
                limit: usize,
            ) -> Result<
                Vec<$crate::storage::events::EndpointRecord>,
                $crate::storage::events::EventLogError,
            > {
                $crate::storage::events::shared::SqlEventLog::endpoints_of(self, channel, limit).await
            }

            async fn endpoint(
                &self,
                channel: &str,
                endpoint: &str,
            ) -> Result<
                Option<$crate::storage::events::EndpointRecord>,
                $crate::storage::events::EventLogError,
            > {
                $crate::storage::events::shared::SqlEventLog::endpoint_in(self, channel, endpoint)
                    .await
            }

            async fn tally_endpoints(
                &self,
                channel: &str,
                exhausted: &[$crate::storage::events::Exhaustion<'_>],
                delivered: &[&str],
                disable_after: u32,
                now: chrono::DateTime<chrono::Utc>,
            ) -> Result<Vec<String>, $crate::storage::events::EventLogError> {
                $crate::storage::events::shared::SqlEventLog::tally_failures(
                    self,
                    channel,
                    exhausted,
                    delivered,
                    disable_after,
                    now,
                )
                .await
            }

            async fn set_endpoint_disabled(
                &self,
                channel: &str,
                endpoint: &str,
                reason: Option<&str>,
                now: chrono::DateTime<chrono::Utc>,
            ) -> Result<bool, $crate::storage::events::EventLogError> {
                $crate::storage::events::shared::SqlEventLog::disable_endpoint(
                    self, channel, endpoint, reason, now,
                )
                .await
            }

            async fn webhook_events_attempted_since(
                &self,
                subscriber: &str,
                since: chrono::DateTime<chrono::Utc>,
                limit: usize,
            ) -> Result<Vec<uuid::Uuid>, $crate::storage::events::EventLogError> {
                $crate::storage::events::shared::SqlEventLog::webhook_events_since(
                    self, subscriber, since, limit,
                )
                .await
            }

            fn changes(&self) -> &dyn $crate::storage::events::EndpointChanges {
                self
            }
        }
    };
}
pub(in crate::storage::events) use endpoint_states_of;
