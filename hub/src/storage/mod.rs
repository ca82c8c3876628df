//! The hub's own tables, on SQLite or PostgreSQL (subscriptions are the
//! [`store`](crate::store) crate's):
//!
//! - [`events`]: the durable event log, the per-subscriber delivery records,
//!   the history of their attempts, endpoint state and retention;
//! - [`backlog`]: acknowledged work not yet done (pending topic fetches and
//!   verifications), durable before its answer, and the workers that claim
//!   it;
//! - [`replicas`]: the replicas sharing one PostgreSQL database, their
//!   heartbeats, and the takeover of a dead one's claims.

pub mod backlog;
pub mod events;
pub mod replicas;

/// The session settings of every connection to the hub's own PostgreSQL
/// tables, for the database at `url`. JIT compilation is off: the hub's
/// statements are short, and the planner's estimate for a generic plan of
/// one of them (the takeover of a dead replica's claims) crossed
/// `jit_above_cost`, so PostgreSQL spent some 100 to 180 ms compiling a
/// statement that runs in under a millisecond, at every start.
pub(crate) fn postgres_session(url: &str) -> Result<sqlx::postgres::PgConnectOptions, sqlx::Error> {
    use std::str::FromStr as _;
    Ok(sqlx::postgres::PgConnectOptions::from_str(url)?.options([("jit", "off")]))
}

/// `statement` on a connection of `pool`, unless acquiring the connection
/// and running the statement take longer than `limit`: then the statement
/// is abandoned with a timed-out error, and its connection closed rather
/// than handed back. A connection whose peer vanished without closing it
/// would otherwise hold the caller until the operating system gives up on
/// it, many minutes later; and handed back, it would hold its place in the
/// pool as long, the pool testing it with a ping that waits for an answer
/// that never comes: a few of those, and the pool has no connection left.
pub(crate) async fn bounded<T, E: From<sqlx::Error>>(
    limit: std::time::Duration,
    pool: &sqlx::PgPool,
    statement: impl AsyncFnOnce(&mut sqlx::PgConnection) -> Result<T, E>,
) -> Result<T, E> {
    let timed_out = || {
        E::from(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the database did not answer within {limit:?}"),
        )))
    };
    let deadline = tokio::time::Instant::now() + limit;
    let mut connection = match tokio::time::timeout_at(deadline, pool.acquire()).await {
        Ok(acquired) => acquired?,
        Err(_) => return Err(timed_out()),
    };
    match tokio::time::timeout_at(deadline, statement(&mut connection)).await {
        Ok(result) => result,
        Err(_) => {
            // Dropped without a word to the server (a goodbye could wait on
            // the same silent peer); the pool may open another.
            drop(connection.detach());
            Err(timed_out())
        }
    }
}
