//! The SQLite backend: subscriptions in one local file, for single-binary and
//! embedded deployments.
//!
//! It owns the `websub_subscriptions` table and its migrations
//! (`migrations/sqlite/store`, embedded at build time), recorded in their own
//! table, `websub_store_migrations`, so the hub's migrator can share the file.
//! The table is the PostgreSQL backend's wherever the dialects allow;
//! timestamps are INTEGER microseconds since the Unix epoch.
//!
//! The behaviour is the [`SubscriptionStore`] contract. What this backend adds:
//!
//! - **One writer.** SQLite lets any number of readers run beside a single
//!   writer (the file is opened in WAL mode). Within one process every write
//!   to the file, the hub's included, goes through one connection
//!   ([`Writer`]), queueing for it on an async lock; reads take one of the
//!   pool's [`POOL_SIZE`] connections. Between processes every write queues
//!   for the file's write lock, and one that waits longer than
//!   [`BUSY_TIMEOUT`] for it fails with [`StoreError::Backend`].
//! - **Conditional saves** run inside `BEGIN IMMEDIATE`, which takes the write
//!   lock before the count, so they are serialised against every other write
//!   to the file, from any process. That covers "per owner" with room to
//!   spare.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Connection, Executor, Row, Sqlite};

use crate::{OwnerQuota, StoreError, Subscription, SubscriptionStore, expiry_bound_micros};

mod writer;

pub use writer::Writer;

/// The most connections [`SqliteStore::connect`] opens; see the module doc.
pub const POOL_SIZE: u32 = 4;

/// How long a write waits for another connection's write lock before failing.
/// Generous, because under load the wait is queueing, not a fault.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The table the store's migrations are recorded in; see the module doc.
const MIGRATIONS_TABLE: &str = "websub_store_migrations";

/// A page of a topic's subscriptions in callback order, `$after` narrowing
/// where it starts, as one JSON value: an array of each one's [`columns!`].
/// sqlx hands each row over from SQLite's thread as a message of its own,
/// and a reader that keeps up is woken for each; a page is one message.
macro_rules! page_of {
    ($after:literal) => {
        concat!(
            "SELECT coalesce(json_group_array(json_array(",
            columns!(),
            ") ORDER BY callback), '[]') FROM (SELECT ",
            columns!(),
            " FROM websub_subscriptions WHERE topic = ?1 ",
            $after,
            " ORDER BY callback LIMIT CAST(?2 AS INTEGER))"
        )
    };
}

const UPSERT: &str = concat!(
    "INSERT INTO websub_subscriptions (",
    columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    replace_on_conflict!()
);

/// The rows of [`UPSERT_ALL`] and [`RENEW_ALL`]: a JSON array, each
/// element an array of [`columns!`]. `WHERE true` tells SQLite the `ON` is
/// the upsert's, not a join's.
macro_rules! json_columns {
    () => {
        concat!(
            "INSERT INTO websub_subscriptions (",
            columns!(),
            ") SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, \
                      value ->> 5, value ->> 6, value ->> 7 \
             FROM json_each(?1) WHERE true"
        )
    };
}

/// [`UPSERT`] of a JSON array.
const UPSERT_ALL: &str = concat!(json_columns!(), replace_on_conflict!());

/// [`UPSERT_ALL`] keeping a stored pair's `created_at`.
const RENEW_ALL: &str = concat!(json_columns!(), renew_on_conflict!());

/// Subscriptions in a SQLite database file.
///
/// Cloning is cheap and shares the pool.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// The file's write connection, shared with the hub's tables.
    writer: Arc<Writer>,
}

impl SqliteStore {
    /// Opens the database at `url_or_path` (a `sqlite:` URL or a plain file
    /// path), creating the file if it is missing, and brings the schema up to
    /// date.
    ///
    /// Every connection runs in WAL mode with foreign keys on and waits up to
    /// [`BUSY_TIMEOUT`] for the write lock; the pool holds at most
    /// [`POOL_SIZE`] connections.
    pub async fn connect(url_or_path: &str) -> Result<Self, StoreError> {
        let options = connect_options(url_or_path)?;
        let store = Self::from_pool(open_pool(options).await?);
        store.migrate().await?;
        Ok(store)
    }

    /// A store on an existing pool, for a caller that runs [`migrate`]
    /// itself (or knows the schema is current). The pool's options are the
    /// caller's; those [`connect`](Self::connect) sets are recommended.
    ///
    /// [`migrate`]: Self::migrate
    pub fn from_pool(pool: SqlitePool) -> Self {
        Self {
            writer: Writer::of(&pool),
            pool,
        }
    }

    /// Applies the store's pending migrations.
    ///
    /// sqlx's SQLite migrator takes no lock of its own, so two processes
    /// opening a new file at once would both try to create the table. The
    /// whole run is therefore one `BEGIN IMMEDIATE` transaction: the second
    /// process waits for the first, then finds nothing left to apply.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrate_locked(&self.pool, &migrator())
            .await
            .map_err(StoreError::backend)
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &SqlitePool {
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
        let rows: Vec<serde_json::Value> = subscriptions
            .iter()
            .map(|subscription| {
                serde_json::json!([
                    subscription.topic,
                    subscription.callback,
                    subscription.secret,
                    subscription.lease_seconds,
                    subscription.created_at.timestamp_micros(),
                    subscription.verified_at.timestamp_micros(),
                    subscription.expires_at.map(|at| at.timestamp_micros()),
                    subscription.owner,
                ])
            })
            .collect();
        sqlx::query(statement)
            .bind(serde_json::Value::Array(rows).to_string())
            .execute(&mut *self.writer.lock().await?)
            .await?;
        Ok(())
    }
}

/// How every websub-hub component opens a SQLite file: `url_or_path` is a
/// `sqlite:` URL or a plain path (created if missing); WAL journal, NORMAL
/// synchronisation, [`BUSY_TIMEOUT`], foreign keys on.
pub fn connect_options(url_or_path: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    // A plain path goes through `filename` so that characters a URL would
    // read as syntax (`?`, `%`) stay part of the name.
    let options = if url_or_path.starts_with("sqlite:") {
        SqliteConnectOptions::from_str(url_or_path)?
    } else {
        SqliteConnectOptions::new().filename(url_or_path)
    };
    Ok(options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // In WAL mode NORMAL survives a crash of the process (what the
        // embedded default must survive) and skips an fsync per commit;
        // only a power loss can take back the last commits.
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true))
}

/// Runs `migrator` as one `BEGIN IMMEDIATE` transaction.
///
/// sqlx's SQLite migrator takes no lock of its own, so two processes opening
/// a new file at once would both try to create the tables; inside one
/// immediate transaction the second waits for the first, then finds nothing
/// left to apply.
pub async fn migrate_locked(
    pool: &SqlitePool,
    migrator: &Migrator,
) -> Result<(), sqlx::migrate::MigrateError> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    // `run_direct` rather than `run`: `run` on a borrowed connection yields a
    // future the compiler cannot prove `Send` for every lifetime
    // ("implementation of `Acquire` is not general enough"), which would keep
    // `connect` out of spawned tasks. `run_direct` is sqlx's own workaround
    // for that, public but `#[doc(hidden)]`: re-check it when upgrading sqlx.
    // An error drops `tx`, rolling the whole run back.
    migrator.run_direct(None, &mut *tx, false).await?;
    tx.commit().await?;
    Ok(())
}

/// Connects the pool, retrying while another connection holds the lock.
///
/// Switching a new file to WAL needs an exclusive lock that SQLite does not
/// wait for with the busy timeout, so several processes (or pools) opening
/// one new file at once can see "database is locked" from the pragma. That
/// happens once per file, for an instant; waiting it out, up to the busy
/// timeout, is what the caller would otherwise have to do.
///
/// Shared with the hub's event log, which keeps its tables in the same file
/// by default: both open the file the same way.
pub async fn open_pool(options: SqliteConnectOptions) -> Result<SqlitePool, sqlx::Error> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        match SqlitePoolOptions::new()
            .max_connections(POOL_SIZE)
            .connect_with(options.clone())
            .await
        {
            Err(error) if is_busy(&error) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            result => return result,
        }
    }
}

/// Whether SQLite refused for a lock another connection holds: SQLITE_BUSY,
/// extended codes included.
fn is_busy(error: &sqlx::Error) -> bool {
    const SQLITE_BUSY: i32 = 5;
    error
        .as_database_error()
        .and_then(|error| error.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == SQLITE_BUSY)
}

fn migrator() -> Migrator {
    crate::migrations::migrator(
        include!(concat!(env!("OUT_DIR"), "/sqlite_store.rs")),
        MIGRATIONS_TABLE,
    )
}

/// Inserts or replaces the subscription on `executor`, which is the pool for a
/// plain save and the transaction for a conditional one.
async fn upsert<'e, E>(executor: E, subscription: &Subscription) -> Result<(), StoreError>
where
    E: Executor<'e, Database = Sqlite>,
{
    sqlx::query(UPSERT)
        .bind(&subscription.topic)
        .bind(&subscription.callback)
        .bind(&subscription.secret)
        .bind(subscription.lease_seconds.map(i64::from))
        .bind(subscription.created_at.timestamp_micros())
        .bind(subscription.verified_at.timestamp_micros())
        .bind(subscription.expires_at.map(|at| at.timestamp_micros()))
        .bind(&subscription.owner)
        .execute(executor)
        .await?;
    Ok(())
}

/// The body of a conditional save, on a transaction that already holds the
/// write lock.
async fn count_and_upsert(
    tx: &mut SqliteConnection,
    subscription: &Subscription,
    owner: &str,
    quota: &OwnerQuota,
) -> Result<(), StoreError> {
    let used: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM websub_subscriptions \
         WHERE owner = ?1 AND NOT (topic = ?2 AND callback = ?3)",
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

/// The one place a row becomes a [`Subscription`]; the row must carry
/// [`columns!`].
/// The subscriptions of `rows`, each converted as it arrives. A topic's
/// list is read whole at times (100 000 subscriptions and more): collected
/// as rows first, each holding copies of its values, it would sit in memory
/// twice over at the peak.
async fn subscriptions(
    mut rows: impl futures::Stream<Item = Result<SqliteRow, sqlx::Error>> + Unpin,
) -> Result<Vec<Subscription>, StoreError> {
    let mut listed = Vec::new();
    while let Some(row) = rows.try_next().await? {
        listed.push(subscription_from_row(&row)?);
    }
    Ok(listed)
}

fn subscription_from_row(row: &SqliteRow) -> Result<Subscription, StoreError> {
    subscription_from_columns((
        row.try_get("topic").map_err(invalid)?,
        row.try_get("callback").map_err(invalid)?,
        row.try_get("secret").map_err(invalid)?,
        row.try_get("lease_seconds").map_err(invalid)?,
        row.try_get("created_at").map_err(invalid)?,
        row.try_get("verified_at").map_err(invalid)?,
        row.try_get("expires_at").map_err(invalid)?,
        row.try_get("owner").map_err(invalid)?,
    ))
}

/// A subscription's stored values, in the order of [`columns!`].
type Columns = (
    String,
    String,
    Option<String>,
    Option<i64>,
    i64,
    i64,
    Option<i64>,
    Option<String>,
);

fn subscription_from_columns(
    (topic, callback, secret, lease_seconds, created_at, verified_at, expires_at, owner): Columns,
) -> Result<Subscription, StoreError> {
    let lease_seconds = lease_seconds
        .map(|seconds| {
            u32::try_from(seconds)
                .map_err(|_| StoreError::Invalid(format!("lease_seconds {seconds} out of range")))
        })
        .transpose()?;
    Ok(Subscription {
        topic,
        callback,
        secret,
        lease_seconds,
        created_at: from_micros(created_at)?,
        verified_at: from_micros(verified_at)?,
        expires_at: expires_at.map(from_micros).transpose()?,
        owner,
    })
}

fn from_micros(micros: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::Invalid(format!("timestamp {micros} µs out of range")))
}

/// A column that does not decode is a stored value this backend cannot hold,
/// not a failure of the database.
fn invalid(error: sqlx::Error) -> StoreError {
    StoreError::Invalid(error.to_string())
}

fn count(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Invalid(format!("negative count {value}")))
}

#[async_trait]
impl SubscriptionStore for SqliteStore {
    async fn save(&self, subscription: &Subscription) -> Result<(), StoreError> {
        upsert(&mut *self.writer.lock().await?, subscription).await
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
            " FROM websub_subscriptions WHERE topic = ?1 AND callback = ?2"
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
        sqlx::query("DELETE FROM websub_subscriptions WHERE topic = ?1 AND callback = ?2")
            .bind(topic)
            .bind(callback)
            .execute(&mut *self.writer.lock().await?)
            .await?;
        Ok(())
    }

    async fn list_by_topic(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        // One statement, prepared once per connection and cached (sqlx's
        // default for `query`), over the primary key's topic prefix.
        let query = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM websub_subscriptions WHERE topic = ?1"
        ))
        .bind(topic);
        subscriptions(query.fetch(&self.pool)).await
    }

    async fn list_by_topic_page(
        &self,
        topic: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Subscription>, StoreError> {
        // Byte order (the column's BINARY collation), walked along the
        // primary key from `after`: a page costs its own rows, wherever it
        // starts. Two statements rather than `?2 IS NULL OR`, which would
        // keep the planner from seeking to `after`. The limit is CAST: a bare
        // `LIMIT ?2` is planned with its bound value, and every page of
        // another size would prepare the statement again.
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let query = match after {
            None => sqlx::query_scalar(page_of!("")).bind(topic).bind(limit),
            Some(after) => sqlx::query_scalar(page_of!("AND callback > ?3"))
                .bind(topic)
                .bind(limit)
                .bind(after),
        };
        let page: String = query.fetch_one(&self.pool).await?;
        serde_json::from_str::<Vec<Columns>>(&page)
            .map_err(|error| StoreError::Invalid(format!("a page of subscriptions: {error}")))?
            .into_iter()
            .map(subscription_from_columns)
            .collect()
    }

    async fn has_subscriptions(&self, topic: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM websub_subscriptions WHERE topic = ?1)",
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
            " FROM websub_subscriptions WHERE expires_at < ?1"
        ))
        .bind(expiry_bound_micros(before))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(subscription_from_row)
        .collect()
    }

    async fn count_by_owner(&self, owner: &str) -> Result<u64, StoreError> {
        let used: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM websub_subscriptions WHERE owner = ?1")
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
            " FROM websub_subscriptions WHERE owner = ?1"
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
        // IMMEDIATE takes the write lock now, waiting up to the busy timeout
        // for it. A deferred BEGIN would take only a read snapshot at the
        // count, so two saves could both count below the limit; the later
        // one's upgrade to writer would then fail with SQLITE_BUSY at once
        // rather than wait, since its snapshot is stale.
        let mut writer = self.writer.lock().await?;
        let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
        if let Err(error) = count_and_upsert(&mut tx, subscription, owner, quota).await {
            // Rolled back here rather than on drop so the write lock is
            // released before the caller hears about the refusal. The first
            // error says more than a failed rollback, whose connection the
            // pool discards.
            let _ = tx.rollback().await;
            return Err(error);
        }
        tx.commit().await?;
        Ok(())
    }
}
