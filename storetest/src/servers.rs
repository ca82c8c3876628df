//! The real servers backend tests run against.
//!
//! A test asks for a server's URL and gets, in this order:
//! 1. the URL in `WEBSUB_TEST_DATABASE_URL` / `WEBSUB_TEST_REDIS_URL`, when set
//!    (CI starts the servers and sets both);
//! 2. under `CI=true` without that variable, a panic naming it: a test that
//!    needs a server never passes by skipping in CI;
//! 3. otherwise `None`, after printing why and how to start the servers
//!    (`.ci/servers`, as CI does), so a developer without them sees the
//!    test skip rather than fail.
//!
//! A Redis Cluster's nodes come from `WEBSUB_TEST_REDIS_CLUSTER_URLS` (CI
//! starts three on loopback), under the same rules.

/// The variable naming the PostgreSQL server tests use.
pub const DATABASE_URL_VAR: &str = "WEBSUB_TEST_DATABASE_URL";
/// The variable naming the Redis server tests use.
pub const REDIS_URL_VAR: &str = "WEBSUB_TEST_REDIS_URL";

/// The variable naming the nodes of the Redis Cluster tests use: their
/// `redis://host:port/` URLs, separated by commas.
pub const REDIS_CLUSTER_URLS_VAR: &str = "WEBSUB_TEST_REDIS_CLUSTER_URLS";

/// The URL of a PostgreSQL server for tests, or `None` (skip) outside CI.
///
/// # Panics
/// Under `CI=true` when [`DATABASE_URL_VAR`] is not set.
pub async fn postgres_url() -> Option<String> {
    server_url(DATABASE_URL_VAR)
}

/// The URL of a Redis server for tests, or `None` (skip) outside CI.
///
/// # Panics
/// Under `CI=true` when [`REDIS_URL_VAR`] is not set.
pub async fn redis_url() -> Option<String> {
    server_url(REDIS_URL_VAR)
}

/// The node URLs of a Redis Cluster for tests, or `None` (skip) outside CI.
///
/// # Panics
/// Under `CI=true` when [`REDIS_CLUSTER_URLS_VAR`] is not set.
pub fn redis_cluster_urls() -> Option<Vec<String>> {
    let urls = server_url(REDIS_CLUSTER_URLS_VAR)?;
    Some(
        urls.split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// A URL of a database of its own on the test PostgreSQL server, created for
/// the caller (for tests whose tables must not be shared), or `None` (skip)
/// outside CI.
///
/// # Panics
/// Under `CI=true` when [`DATABASE_URL_VAR`] is not set, or when the
/// database cannot be created.
pub async fn fresh_postgres_url() -> Option<String> {
    use sqlx::Connection;
    let admin_url = postgres_url().await?;
    let name = format!("websub_test_{}", rand::random::<u64>());
    let mut admin = sqlx::PgConnection::connect(&admin_url)
        .await
        .unwrap_or_else(|error| panic!("connect to the test PostgreSQL: {error}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|error| panic!("create database {name}: {error}"));
    let _ = admin.close().await;
    Some(websub_store::postgres::with_database(&admin_url, &name))
}

/// Whether the tests run in CI, where nothing may skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !value.is_empty() && value != "false" && value != "0")
}

/// How a developer starts the servers the tests need, as CI does.
const START_THEM: &str =
    "`source .ci/servers && start_test_servers` starts them all on loopback and exports their URLs";

fn server_url(variable: &str) -> Option<String> {
    if let Ok(url) = std::env::var(variable)
        && !url.is_empty()
    {
        return Some(url);
    }
    if in_ci() {
        panic!(
            "{variable} is not set: under CI=true the tests need a real server; \
             .ci/run starts one and exports {variable}"
        );
    }
    eprintln!("skipping: {variable} is not set; {START_THEM}");
    None
}
