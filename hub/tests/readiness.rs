//! A readiness check bounded inside the subscription store: a connection
//! whose peer went silent (a NAT dropping an idle connection) fails the
//! check within its limit and is closed, not handed back to the pool.

use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use websub_store::SubscriptionStore;
use websub_store::postgres::PostgresStore;

use crate::common::SilentProxy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_gone_silent_is_not_ready_and_its_connection_is_closed() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        eprintln!("skipping: no PostgreSQL server for tests");
        return;
    };
    PostgresStore::connect(&url)
        .await
        .expect("the store's schema");
    let server = {
        let parsed = url::Url::parse(&url).expect("url");
        let host = parsed.host_str().expect("host").to_owned();
        tokio::net::lookup_host((host, parsed.port().unwrap_or(5432)))
            .await
            .expect("resolve")
            .next()
            .expect("an address")
    };
    let proxy = SilentProxy::start(server).await;
    // One connection: kept while silent, it would leave the pool none. Not
    // pinged as it is taken, so that the silence meets the check's own
    // statement (a ping that does not answer in time has the pool drop the
    // connection by itself).
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&proxy.url_for(&url))
        .await
        .expect("a pool through the proxy");
    let store = PostgresStore::from_pool(pool);
    store
        .ready(Duration::from_secs(2))
        .await
        .expect("ready while the database answers");
    // The pool pings a connection as it takes it back: frozen before that
    // ping's answer, it would hang in the pool's own hands, not the check's.
    let idle = crate::common::eventually(Duration::from_secs(5), || store.pool().num_idle() == 1);
    assert!(idle.await, "the connection never went back to the pool");

    proxy.freeze();
    let started = Instant::now();
    store
        .ready(Duration::from_secs(1))
        .await
        .expect_err("a store that does not answer is not ready");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "the check took {took:?}");

    // The silent connection is gone: the next check opens another, which
    // the proxy forwards.
    let started = Instant::now();
    store
        .ready(Duration::from_secs(3))
        .await
        .expect("ready again on a new connection");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "the check took {took:?}");
}
