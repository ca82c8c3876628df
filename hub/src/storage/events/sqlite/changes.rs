//! The SQLite parts of the endpoints' history
//! ([`EndpointChanges`](super::super::EndpointChanges)): a
//! batch appended row by row on the write connection, and the claim, which
//! the one write connection keeps from overlapping another. The rest is
//! written once ([`super::super::shared`]).

use std::sync::LazyLock;

use sqlx::sqlite::SqliteConnection;

use super::super::sql::changes::COLUMNS;
use super::super::{EventLogError, NewChange};
use super::SqliteEventLog;

const APPEND: &str = "INSERT INTO websub_endpoint_changes \
     (channel, endpoint, state, at, failures, since, reason, source, next_attempt_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $4)";

pub(super) static CLAIM: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE websub_endpoint_changes SET claimed_until = $2 \
         WHERE id IN (SELECT id FROM websub_endpoint_changes \
                      WHERE webhook_state = 'pending' AND next_attempt_at <= $1 \
                        AND (claimed_until IS NULL OR claimed_until <= $1) \
                      ORDER BY id LIMIT $3) \
         RETURNING {COLUMNS}"
    )
});

/// Writes `changes` on `connection`, one row each; see
/// [`super::super::shared::SqlEventLog::append_rows`].
pub(super) async fn append_rows(
    connection: &mut SqliteConnection,
    changes: &[NewChange],
) -> Result<(), EventLogError> {
    for change in changes {
        sqlx::query(APPEND)
            .bind(change.channel)
            .bind(&change.endpoint)
            .bind(change.to.as_str())
            .bind(change.at.timestamp_micros())
            .bind(change.failures.map(i64::from))
            .bind(change.since.map(|since| since.timestamp_micros()))
            .bind(change.reason.as_deref())
            .bind(change.source)
            .execute(&mut *connection)
            .await?;
    }
    Ok(())
}

super::super::shared::endpoints::endpoint_changes_of!(SqliteEventLog);
