//! The PostgreSQL backend: subscriptions in one table of a database that
//! several hub replicas share.
//!
//! It owns the `websub_subscriptions` table and its migrations
//! (`migrations/postgres/store`, embedded at build time). Those are recorded
//! in their own table, `websub_store_migrations`, so the hub's migrator can
//! run on the same database without either one taking the other's history for
//! missing migrations.
//!
//! The behaviour is the [`SubscriptionStore`] contract. What this backend adds:
//! [`save_within_limit`](SubscriptionStore::save_within_limit) serialises on a
//! transaction-scoped advisory lock named by [`OwnerQuota::lock_key`], so
//! conditional saves for one owner queue across every replica, while other
//! owners and other quota types never wait on each other.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::{Executor, Postgres, Row};

use crate::{OwnerQuota, StoreError, Subscription, SubscriptionStore, expiry_bound_micros};

/// The table the store's migrations are recorded in; see the module doc.
const MIGRATIONS_TABLE: &str = "websub_store_migrations";

const UPSERT: &str = concat!(
    "INSERT INTO websub_subscriptions (",
    columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    replace_on_conflict!()
);

/// The rows of [`UPSERT_ALL`] and [`RENEW_ALL`]: one array per column.
macro_rules! unnest_columns {
    () => {
        concat!(
            "INSERT INTO websub_subscriptions (",
            columns!(),
            ") SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], \
                 $5::timestamptz[], $6::timestamptz[], $7::timestamptz[], $8::text[])"
        )
    };
}

/// [`UPSERT`] of one array per column.
const UPSERT_ALL: &str = concat!(unnest_columns!(), replace_on_conflict!());

/// [`UPSERT_ALL`] keeping a stored pair's `created_at`.
const RENEW_ALL: &str = concat!(unnest_columns!(), renew_on_conflict!());

/// Subscriptions in a PostgreSQL database.
///
/// Cloning is cheap and shares the pool.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects a pool to `url` and brings the schema up to date.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let store = Self::from_pool(PgPool::connect(url).await?);
        store.migrate().await?;
        Ok(store)
    }

    /// A store on an existing pool, for a caller that runs [`migrate`]
    /// itself (or knows the schema is current).
    ///
    /// [`migrate`]: Self::migrate
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Applies the store's pending migrations. Safe to run from several
    /// replicas at once: the migrator takes a database-wide advisory lock.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrator()
            .run(&self.pool)
            .await
            .map_err(StoreError::backend)
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// `statement` ([`UPSERT_ALL`] or [`RENEW_ALL`]) of `subscriptions`.
    async fn upsert_all(
        &self,
        statement: &'static str,
        subscriptions: &[Subscription],
    ) -> Result<(), StoreError> {
        if subscriptions.is_empty() {
            return Ok(());
        }
        let column = |value: fn(&Subscription) -> Option<&str>| -> Vec<Option<&str>> {
            subscriptions.iter().map(value).collect()
        };
        let time =
            |value: fn(&Subscription) -> Option<DateTime<Utc>>| -> Vec<Option<DateTime<Utc>>> {
                subscriptions.iter().map(value).collect()
            };
        sqlx::query(statement)
            .bind(column(|s| Some(&s.topic)))
            .bind(column(|s| Some(&s.callback)))
            .bind(column(|s| s.secret.as_deref()))
            .bind(
                subscriptions
                    .iter()
                    .map(|s| s.lease_seconds.map(i64::from))
                    .collect::<Vec<_>>(),
            )
            .bind(time(|s| Some(s.created_at)))
            .bind(time(|s| Some(s.verified_at)))
            .bind(time(|s| s.expires_at))
            .bind(column(|s| s.owner.as_deref()))
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

fn migrator() -> Migrator {
    crate::migrations::migrator(
        include!(concat!(env!("OUT_DIR"), "/postgres_store.rs")),
        MIGRATIONS_TABLE,
    )
}

/// Inserts or replaces the subscription on `executor`, which is the pool for a
/// plain save and the transaction for a conditional one.
async fn upsert<'e, E>(executor: E, subscription: &Subscription) -> Result<(), StoreError>
where
    E: Executor<'e, Database = Postgres>,
{
    sqlx::query(UPSERT)
        .bind(&subscription.topic)
        .bind(&subscription.callback)
        .bind(&subscription.secret)
        .bind(subscription.lease_seconds.map(i64::from))
        .bind(subscription.created_at)
        .bind(subscription.verified_at)
        .bind(subscription.expires_at)
        .bind(&subscription.owner)
        .execute(executor)
        .await?;
    Ok(())
}

/// The one place a row becomes a [`Subscription`]; the row must carry
/// [`columns!`].
fn subscription_from_row(row: &PgRow) -> Result<Subscription, StoreError> {
    let lease_seconds = row
        .try_get::<Option<i64>, _>("lease_seconds")
        .map_err(invalid)?
        .map(|seconds| {
            u32::try_from(seconds)
                .map_err(|_| StoreError::Invalid(format!("lease_seconds {seconds} out of range")))
        })
        .transpose()?;
    Ok(Subscription {
        topic: row.try_get("topic").map_err(invalid)?,
        callback: row.try_get("callback").map_err(invalid)?,
        secret: row.try_get("secret").map_err(invalid)?,
        lease_seconds,
        created_at: row.try_get("created_at").map_err(invalid)?,
        verified_at: row.try_get("verified_at").map_err(invalid)?,
        expires_at: row.try_get("expires_at").map_err(invalid)?,
        owner: row.try_get("owner").map_err(invalid)?,
    })
}

/// A column that does not decode is a stored value this backend cannot hold,
/// not a failure of the database.
fn invalid(error: sqlx::Error) -> StoreError {
    StoreError::Invalid(error.to_string())
}

/// The body of a conditional save, on its transaction.
async fn lock_count_and_upsert(
    tx: &mut PgConnection,
    subscription: &Subscription,
    owner: &str,
    quota: &OwnerQuota,
) -> Result<(), StoreError> {
    // Transaction-scoped, so the commit or rollback releases it and it can
    // never outlive the save on a pooled connection.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(quota.lock_key(owner))
        .execute(&mut *tx)
        .await?;
    let used: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM websub_subscriptions \
         WHERE owner = $1 AND NOT (topic = $2 AND callback = $3)",
    )
    .bind(owner)
    .bind(&subscription.topic)
    .bind(&subscription.callback)
    .fetch_one(&mut *tx)
    .await?;
    let used = count(used)?;
    if used >= quota.limit {
        return Err(StoreError::LimitReached {
            limit: quota.limit,
            used,
        });
    }
    upsert(&mut *tx, subscription).await
}

fn count(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Invalid(format!("negative count {value}")))
}

#[async_trait]
impl SubscriptionStore for PostgresStore {
    async fn save(&self, subscription: &Subscription) -> Result<(), StoreError> {
        upsert(&self.pool, subscription).await
    }

    async fn save_all(&self, subscriptions: &[Subscription]) -> Result<(), StoreError> {
        self.upsert_all(UPSERT_ALL, subscriptions).await
    }

    async fn renew_all(&self, subscriptions: &[Subscription]) -> Result<(), StoreError> {
        self.upsert_all(RENEW_ALL, subscriptions).await
    }

    async fn get(&self, topic: &str, callback: &str) -> Result<Subscription, StoreError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM websub_subscriptions WHERE topic = $1 AND callback = $2"
        ))
        .bind(topic)
        .bind(callback)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => subscription_from_row(&row),
            None => Err(StoreError::unknown(topic, callback)),
        }
    }

    async fn delete(&self, topic: &str, callback: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM websub_subscriptions WHERE topic = $1 AND callback = $2")
            .bind(topic)
            .bind(callback)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn list_by_topic(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        // One round trip on a statement each connection prepares once and
        // caches (sqlx's default for `query`), over the primary key's topic
        // prefix.
        sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM websub_subscriptions WHERE topic = $1"
        ))
        .bind(topic)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(subscription_from_row)
        .collect()
    }

    async fn list_by_topic_page(
        &self,
        topic: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Subscription>, StoreError> {
        // The column's collation orders the walk, which the primary key
        // serves from `after` on: a page costs its own rows, wherever it
        // starts. Two statements rather than `$2 IS NULL OR`, which would
        // keep the planner from seeking to `after`.
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let query = match after {
            None => sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM websub_subscriptions WHERE topic = $1 ORDER BY callback LIMIT $2"
            ))
            .bind(topic)
            .bind(limit),
            Some(after) => sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM websub_subscriptions WHERE topic = $1 AND callback > $3 \
                 ORDER BY callback LIMIT $2"
            ))
            .bind(topic)
            .bind(limit)
            .bind(after),
        };
        // A planner whose statistics predate a large topic (one just
        // loaded, not yet analysed) believes it holds a few rows, and would
        // read and sort all the rest of the topic for every page. Sorting
        // ruled out for this transaction, the walk along the key remains.
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET LOCAL enable_sort = off")
            .execute(&mut *tx)
            .await?;
        let rows = query.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        rows.iter().map(subscription_from_row).collect()
    }

    async fn has_subscriptions(&self, topic: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM websub_subscriptions WHERE topic = $1)",
        )
        .bind(topic)
        .fetch_one(&self.pool)
        .await?)
    }

    async fn topics(&self) -> Result<Vec<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT DISTINCT topic FROM websub_subscriptions")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn list_expiring(&self, before: DateTime<Utc>) -> Result<Vec<Subscription>, StoreError> {
        sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM websub_subscriptions WHERE expires_at < $1"
        ))
        .bind(DateTime::from_timestamp_micros(expiry_bound_micros(before)).unwrap_or(before))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(subscription_from_row)
        .collect()
    }

    async fn count_by_owner(&self, owner: &str) -> Result<u64, StoreError> {
        let used: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM websub_subscriptions WHERE owner = $1")
                .bind(owner)
                .fetch_one(&self.pool)
                .await?;
        count(used)
    }

    async fn ready(&self, limit: std::time::Duration) -> Result<(), StoreError> {
        crate::sql::ready(&self.pool, limit).await
    }

    async fn list_by_owner(&self, owner: &str) -> Result<Vec<Subscription>, StoreError> {
        sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM websub_subscriptions WHERE owner = $1"
        ))
        .bind(owner)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(subscription_from_row)
        .collect()
    }

    async fn save_within_limit(
        &self,
        subscription: &Subscription,
        quota: &OwnerQuota,
    ) -> Result<(), StoreError> {
        let owner = subscription
            .owner
            .as_deref()
            .ok_or(StoreError::MissingOwner)?;
        // Read committed, stated rather than inherited from the server's
        // default_transaction_isolation: the count must see every save
        // committed before the lock was granted, and a repeatable-read or
        // serializable snapshot could predate the previous holder's commit.
        let mut tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await?;
        if let Err(error) = lock_count_and_upsert(&mut tx, subscription, owner, quota).await {
            // Rolled back here rather than on drop so the lock is released
            // before the caller hears about the refusal. The first error says
            // more than a failed rollback, whose connection the pool discards.
            let _ = tx.rollback().await;
            return Err(error);
        }
        tx.commit().await?;
        Ok(())
    }
}

/// `url` with its database replaced by `database` (query string kept): how
/// tools and tests reach a sibling database on the same server.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let authority_start = base.find("://").map_or(0, |at| at + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |at| authority_start + at);
    let mut out = format!("{}/{database}", &base[..path_start]);
    if !query.is_empty() {
        out.push('?');
        out.push_str(query);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn with_database_replaces_only_the_path() {
        assert_eq!(
            super::with_database("postgres://u@127.0.0.1:5/postgres?sslmode=disable", "x"),
            "postgres://u@127.0.0.1:5/x?sslmode=disable"
        );
        assert_eq!(
            super::with_database("postgres://u@h:5", "x"),
            "postgres://u@h:5/x"
        );
    }
}
