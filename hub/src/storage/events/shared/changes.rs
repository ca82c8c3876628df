//! The endpoints' history ([`EndpointChanges`](super::super::EndpointChanges)),
//! written once as [`SqlEventLog`](super::SqlEventLog)'s `changes_*` calls;
//! the trait is the delivery core's, so each backend implements it with
//! `endpoint_changes_of!(Log)`. Appending is the backend's (a batch is rows of JSON or
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
                if changes.is_empty() {
                    return Ok(());
                }
                $crate::storage::events::shared::SqlEventLog::append(self, changes).await
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
