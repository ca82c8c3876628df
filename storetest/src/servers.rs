//! The real servers backend tests run against.
//!
//! A test asks for a server's URL and gets, in this order:
//! 1. the URL in `WEBSUB_TEST_DATABASE_URL` / `WEBSUB_TEST_REDIS_URL`, when set
//!    (CI starts the servers and sets both);
//! 2. under `CI=true` without that variable, a panic naming it: a test that
//!    needs a server never passes by skipping in CI;
//! 3. otherwise a container started with testcontainers, once per test
//!    process, when a Docker engine answers;
//! 4. otherwise `None`, after printing why, so a developer without the server
//!    sees the test skip rather than fail.
//!
//! A Redis Cluster has no container fallback: its nodes come from
//! `WEBSUB_TEST_REDIS_CLUSTER_URLS` (CI starts three on loopback), under
//! `CI=true` its absence is a panic, and otherwise the test skips.

use std::time::Duration;

use testcontainers_modules::postgres::Postgres;
use testcontainers_modules::redis::Redis;
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, Image};
use tokio::sync::OnceCell;

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
    static CONTAINER: OnceCell<Result<Started<Postgres>, String>> = OnceCell::const_new();
    server_url(DATABASE_URL_VAR, &CONTAINER, || async {
        let container = Postgres::default()
            .start()
            .await
            .map_err(|e| e.to_string())?;
        let port = container
            .get_host_port_ipv4(5432)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Started {
            url: format!("postgres://postgres:postgres@127.0.0.1:{port}/postgres"),
            _container: container,
        })
    })
    .await
}

/// The URL of a Redis server for tests, or `None` (skip) outside CI.
///
/// # Panics
/// Under `CI=true` when [`REDIS_URL_VAR`] is not set.
pub async fn redis_url() -> Option<String> {
    static CONTAINER: OnceCell<Result<Started<Redis>, String>> = OnceCell::const_new();
    server_url(REDIS_URL_VAR, &CONTAINER, || async {
        let container = Redis::default().start().await.map_err(|e| e.to_string())?;
        let port = container
            .get_host_port_ipv4(6379)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Started {
            url: format!("redis://127.0.0.1:{port}/"),
            _container: container,
        })
    })
    .await
}

/// The node URLs of a Redis Cluster for tests, or `None` (skip) outside CI.
///
/// # Panics
/// Under `CI=true` when [`REDIS_CLUSTER_URLS_VAR`] is not set.
pub fn redis_cluster_urls() -> Option<Vec<String>> {
    let urls: Vec<String> = std::env::var(REDIS_CLUSTER_URLS_VAR)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    if !urls.is_empty() {
        return Some(urls);
    }
    if in_ci() {
        panic!(
            "{REDIS_CLUSTER_URLS_VAR} is not set: under CI=true the tests need a real \
             Redis Cluster; .ci/run starts one and exports {REDIS_CLUSTER_URLS_VAR}"
        );
    }
    eprintln!("skipping: {REDIS_CLUSTER_URLS_VAR} is not set and no cluster is started here");
    None
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

/// A container kept for the life of the test process, and its URL.
struct Started<I: Image> {
    url: String,
    _container: ContainerAsync<I>,
}

async fn server_url<I, F, Fut>(
    variable: &str,
    container: &'static OnceCell<Result<Started<I>, String>>,
    start: F,
) -> Option<String>
where
    I: Image,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Started<I>, String>>,
{
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
    // Tests run on their own runtimes; the container outlives each of them,
    // so it is started once, bounded in time, and kept in a static.
    let started = container
        .get_or_init(|| async {
            match tokio::time::timeout(Duration::from_secs(120), start()).await {
                Ok(result) => result,
                Err(_) => Err("the container did not start within 120 s".to_owned()),
            }
        })
        .await;
    match started {
        Ok(started) => Some(started.url.clone()),
        Err(reason) => {
            eprintln!(
                "skipping: {variable} is not set and no container could be started ({reason})"
            );
            None
        }
    }
}
