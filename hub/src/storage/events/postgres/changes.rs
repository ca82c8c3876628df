//! The PostgreSQL parts of the endpoints' history
//! ([`EndpointChanges`](super::super::EndpointChanges)): a
//! batch appended as arrays, and the claim, which skips the rows another
//! claim holds (`FOR UPDATE SKIP LOCKED`), so replicas sharing the database
//! send each change to the operator webhook from one of them at a time.
//! The rest is written once ([`super::super::shared`]).

use std::sync::LazyLock;

use super::super::sql::changes::COLUMNS;
use super::super::{EventLogError, NewChange};
use super::PostgresEventLog;
use sqlx::postgres::PgConnection;

const APPEND: &str = "INSERT INTO websub_endpoint_changes \
     (channel, endpoint, state, at, failures, since, reason, source, next_attempt_at) \
     SELECT c.channel, c.endpoint, c.state, c.at, c.failures, c.since, c.reason, c.source, c.at \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], \
                                 $5::int[], $6::timestamptz[], $7::text[], $8::text[]) \
         WITH ORDINALITY AS c(channel, endpoint, state, at, failures, since, reason, source, n) \
     ORDER BY n";

pub(super) static CLAIM: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE websub_endpoint_changes SET claimed_until = $2 \
         WHERE id IN (SELECT id FROM websub_endpoint_changes \
                      WHERE webhook_state = 'pending' AND next_attempt_at <= $1 \
                        AND (claimed_until IS NULL OR claimed_until <= $1) \
                      ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) \
         RETURNING {COLUMNS}"
    )
});

/// Writes `changes` on `connection`, as one row per element of the
/// arrays; see [`super::super::shared::SqlEventLog::append_rows`].
pub(super) async fn append_rows(
    connection: &mut PgConnection,
    changes: &[NewChange],
) -> Result<(), EventLogError> {
    let column = |get: fn(&NewChange) -> Option<String>| -> Vec<Option<String>> {
        changes.iter().map(get).collect()
    };
    sqlx::query(APPEND)
        .bind(column(|change| Some(change.channel.to_owned())))
        .bind(column(|change| Some(change.endpoint.clone())))
        .bind(column(|change| Some(change.to.as_str().to_owned())))
        .bind(changes.iter().map(|change| change.at).collect::<Vec<_>>())
        .bind(
            changes
                .iter()
                .map(|change| change.failures.and_then(|n| i32::try_from(n).ok()))
                .collect::<Vec<_>>(),
        )
        .bind(
            changes
                .iter()
                .map(|change| change.since)
                .collect::<Vec<_>>(),
        )
        .bind(column(|change| change.reason.clone()))
        .bind(column(|change| Some(change.source.to_owned())))
        .execute(&mut *connection)
        .await?;
    Ok(())
}

super::super::shared::endpoints::endpoint_changes_of!(PostgresEventLog);
