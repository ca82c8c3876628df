//! A statement bounded in time, for the SQL backends here and the hub's
//! own tables: a connection whose peer went silent is closed, not handed
//! back to the pool.

/// `statement` on a connection of `pool`, unless acquiring the connection
/// and running the statement take longer than `limit`: then the statement
/// is abandoned with a timed-out error, and its connection closed rather
/// than handed back. A connection whose peer vanished without closing it
/// would otherwise hold the caller until the operating system gives up on
/// it, many minutes later; and handed back, it would hold its place in the
/// pool as long, the pool testing it with a ping that waits for an answer
/// that never comes: a few of those, and the pool has no connection left.
pub async fn bounded<Db: sqlx::Database, T, E: From<sqlx::Error>>(
    limit: std::time::Duration,
    pool: &sqlx::Pool<Db>,
    statement: impl AsyncFnOnce(&mut Db::Connection) -> Result<T, E>,
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
