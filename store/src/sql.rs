//! The SQL the two SQL backends share, where SQLite's and PostgreSQL's
//! dialects agree: written once, as macros so that each backend's
//! statements stay `&'static str` built with `concat!`.

/// The columns each backend's `subscription_from_row` reads, in every
/// `SELECT`, and every insert's column list, in this order.
macro_rules! columns {
    () => {
        "topic, callback, secret, lease_seconds, created_at, verified_at, expires_at, owner"
    };
}

/// What a save replaces of a pair already stored: everything but the pair.
macro_rules! replace_on_conflict {
    () => {
        concat!(renew_on_conflict!(), ", created_at = excluded.created_at")
    };
}

/// What a renewal replaces of a pair already stored: everything but the
/// pair and when it was created.
macro_rules! renew_on_conflict {
    () => {
        " ON CONFLICT (topic, callback) DO UPDATE SET \
         secret = excluded.secret, \
         lease_seconds = excluded.lease_seconds, \
         verified_at = excluded.verified_at, \
         expires_at = excluded.expires_at, \
         owner = excluded.owner"
    };
}

/// What a SQL backend's [`SubscriptionStore::ready`] reads: a count for
/// nobody, one indexed read.
///
/// [`SubscriptionStore::ready`]: crate::SubscriptionStore::ready
pub(crate) const READY: &str = "SELECT COUNT(*) FROM websub_subscriptions WHERE owner = ''";

/// [`READY`] on `pool` within `limit`, its connection closed if it does not
/// answer ([`crate::bounded`]).
pub(crate) async fn ready<Db>(
    pool: &sqlx::Pool<Db>,
    limit: std::time::Duration,
) -> Result<(), crate::StoreError>
where
    Db: sqlx::Database,
    for<'c> &'c mut Db::Connection: sqlx::Executor<'c, Database = Db>,
    Db::Arguments: sqlx::IntoArguments<Db>,
{
    crate::bounded(limit, pool, async |connection| {
        sqlx::query(READY)
            .fetch_one(&mut *connection)
            .await
            .map(drop)
    })
    .await
    .map_err(crate::StoreError::from)
}
