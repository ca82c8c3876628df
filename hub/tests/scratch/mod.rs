//! Scratch event logs for the suites that check both backends: a SQLite
//! file of its own, or a PostgreSQL schema of its own (on the connections'
//! `search_path`, so that no other test's rows or replicas show), each
//! removed when the check passes, as the conformance suite's `Fresh`
//! stores (the times they are written with are the suite's helpers).
//!
//! Every test binary uses a different part of this module.
#![allow(dead_code)]

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use uuid::Uuid;
use websub_hub::storage::events::postgres::PostgresEventLog;
use websub_hub::storage::events::sqlite::SqliteEventLog;

/// A fresh SQLite event log in its own file, removed by
/// [`SqliteScratch::remove`] when the check passes.
pub(crate) struct SqliteScratch {
    pub(crate) log: SqliteEventLog,
    pub(crate) path: std::path::PathBuf,
}

impl SqliteScratch {
    pub(crate) async fn new(name: &str) -> Self {
        let path = sqlite_path(name);
        let log = SqliteEventLog::connect(&format!("sqlite:{}", path.display()))
            .await
            .expect("open the SQLite event log");
        Self { log, path }
    }

    pub(crate) async fn remove(self) {
        self.log.pool().close().await;
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            // Already gone is fine: WAL files go away when the last
            // connection closes cleanly.
            let _ = std::fs::remove_file(path);
        }
    }
}

pub(crate) fn sqlite_path(name: &str) -> std::path::PathBuf {
    websub_storetest::scratch::path(&format!("events-{name}.db"))
}

/// A PostgreSQL schema of its own, migrated for the event log, dropped by
/// [`PgSchema::drop_schema`] when the check passes (a failing test leaves
/// it behind for inspection). `None` when no server is configured.
pub(crate) struct PgSchema {
    pub(crate) pool: PgPool,
    admin: PgPool,
    schema: String,
}

impl PgSchema {
    pub(crate) async fn new(prefix: &str, connections: u32) -> Option<Self> {
        let schema = Self::unmigrated(prefix, connections).await?;
        PostgresEventLog::from_pool(schema.pool.clone())
            .migrate()
            .await
            .expect("migrate the test schema");
        Some(schema)
    }

    /// An empty schema, for a check that migrates it itself.
    pub(crate) async fn unmigrated(prefix: &str, connections: u32) -> Option<Self> {
        let url = websub_storetest::servers::postgres_url().await?;
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("connect to the test PostgreSQL");
        let schema = format!("{prefix}_{}", Uuid::new_v4().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&admin)
            .await
            .expect("create the test schema");
        let options = PgConnectOptions::from_str(&url)
            .expect("parse the test database URL")
            .options([("search_path", schema.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .connect_with(options)
            .await
            .expect("connect the test pool");
        Some(Self {
            pool,
            admin,
            schema,
        })
    }

    pub(crate) async fn drop_schema(self) {
        self.pool.close().await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            self.schema
        )))
        .execute(&self.admin)
        .await
        .expect("drop the test schema");
    }
}

/// A PostgreSQL event log in a schema of its own.
pub(crate) struct PgScratch {
    pub(crate) log: PostgresEventLog,
    schema: PgSchema,
}

impl PgScratch {
    pub(crate) async fn new() -> Option<Self> {
        let schema = PgSchema::new("events_test", 12).await?;
        Some(Self {
            log: PostgresEventLog::from_pool(schema.pool.clone()),
            schema,
        })
    }

    pub(crate) async fn drop_schema(self) {
        self.log.pool().close().await;
        self.schema.drop_schema().await;
    }
}

impl websub_logtest::Fresh for SqliteScratch {
    type Log = SqliteEventLog;

    async fn new(check: &str) -> Option<Self> {
        Some(SqliteScratch::new(check).await)
    }

    fn log(&self) -> &SqliteEventLog {
        &self.log
    }

    async fn remove(self) {
        SqliteScratch::remove(self).await;
    }
}

impl websub_logtest::Fresh for PgScratch {
    type Log = PostgresEventLog;

    async fn new(_check: &str) -> Option<Self> {
        PgScratch::new().await
    }

    fn log(&self) -> &PostgresEventLog {
        &self.log
    }

    async fn remove(self) {
        self.drop_schema().await;
    }
}
