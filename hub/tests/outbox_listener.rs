//! The dispatcher's LISTEN connection under failure, against real
//! PostgreSQL: a terminated listener comes back and NOTIFY is fast again;
//! while it cannot come back, polling alone keeps delivering; and a restart
//! of the whole server (a private cluster this test starts) loses nothing.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::{
    Db, EVENT, PrivateCluster, Running, config, eventually, eventually_async,
    run_listening_with_hook, run_with_hook,
};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio::time::Instant;
use uuid::Uuid;
use websub_hub::delivery::outbox::{DispatcherConfig, Outbox, OutboxTables, ddl};
use websub_tests::{Answer, RecordingReceiver};

/// Produces one notified event and returns how long it took to arrive.
async fn notified_delivery(db: &Db, receiver: &RecordingReceiver) -> Duration {
    let before = receiver.received_at("/hook").len();
    let started = Instant::now();
    db.produce(EVENT, None, true).await;
    assert!(
        receiver
            .wait_for("/hook", before + 1, Duration::from_secs(10))
            .await
    );
    started.elapsed()
}

async fn terminate(pool: &PgPool, pid: i32) {
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(pool)
        .await
        .expect("terminate");
    assert!(terminated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listener_comes_back_and_notify_is_fast_again() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let running = run_listening_with_hook(&db, &receiver).await;
    assert!(notified_delivery(&db, &receiver).await < Duration::from_secs(1));

    let first = db.listener_pid().await.expect("a LISTEN connection");
    terminate(&db.pool, first).await;
    let replaced = eventually_async(Duration::from_secs(10), || async {
        db.listener_pid().await.is_some_and(|pid| pid != first)
    })
    .await;
    assert!(replaced, "the listener did not reconnect");
    running.listening().await;
    for _ in 0..3 {
        let took = notified_delivery(&db, &receiver).await;
        assert!(took < Duration::from_secs(1), "took {took:?}");
    }
    running.stop().await;
}

/// The database's name in a connection URL.
fn database_name(url: &str) -> String {
    url.rsplit('/')
        .next()
        .and_then(|tail| tail.split('?').next())
        .expect("a database name")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_carries_on_while_the_listener_cannot_reconnect() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    // Connections opened up front and kept: once the database refuses new
    // connections, these are all there is.
    let dispatcher_pool = PgPoolOptions::new()
        .min_connections(3)
        .max_connections(3)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect(&db.url)
        .await
        .expect("pool");
    let held: Vec<_> = futures::future::join_all((0..3).map(|_| dispatcher_pool.acquire()))
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("warm the pool");
    drop(held);
    let mut producer = PgConnection::connect(&db.url).await.expect("producer");
    let mut admin = PgConnection::connect(
        &websub_storetest::servers::postgres_url()
            .await
            .expect("the server"),
    )
    .await
    .expect("admin");
    let name = database_name(&db.url);

    let running = run_with_hook(dispatcher_pool, config(&db.tables), &receiver);
    running.listening().await;

    let listener = db.listener_pid().await.expect("a LISTEN connection");
    sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS false"
    )))
    .execute(&mut admin)
    .await
    .expect("refuse new connections");
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(listener)
        .fetch_one(&mut admin)
        .await
        .expect("terminate");
    assert!(terminated);
    assert!(
        eventually(Duration::from_secs(5), || !running
            .dispatcher
            .is_listening())
        .await,
        "the listener noticed"
    );

    let outbox = Outbox::new(db.tables.clone());
    let mut produced = Vec::new();
    for _ in 0..3 {
        let event = common::TestEvent::named(EVENT);
        let mut tx = producer.begin().await.expect("begin");
        produced.push(
            outbox
                .message(&event)
                .notify()
                .send(&mut tx)
                .await
                .expect("send"),
        );
        tx.commit().await.expect("commit");
    }
    assert!(
        receiver.wait_for("/hook", 3, Duration::from_secs(5)).await,
        "polling (every 200 ms) did not deliver"
    );
    assert!(
        !running.dispatcher.is_listening(),
        "delivered while the listener was down"
    );
    assert_eq!(
        receiver
            .event_ids("/hook")
            .into_iter()
            .collect::<HashSet<_>>(),
        produced.into_iter().collect::<HashSet<_>>()
    );

    sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS true"
    )))
    .execute(&mut admin)
    .await
    .expect("accept connections again");
    // The listener's backoff in this configuration tops out at 500 ms.
    running.listening().await;
    let took = notified_delivery(&db, &receiver).await;
    assert!(took < Duration::from_secs(5), "took {took:?}");
    running.stop().await;
}

/// A PostgreSQL restart in the middle of a stream of events: every event
/// whose commit succeeded is delivered, and the listener recovers by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_mid_flow_loses_nothing() {
    let Some(cluster) = PrivateCluster::start().await else {
        return;
    };
    websub_hub::delivery::net::install_crypto_provider();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(3))
        .connect(&cluster.url())
        .await
        .expect("connect to the private cluster");
    let tables = OutboxTables::default();
    sqlx::raw_sql(AssertSqlSafe(ddl(&tables)))
        .execute(&pool)
        .await
        .expect("the outbox tables");
    let receiver = RecordingReceiver::start().await;
    // A slow subscriber, two attempts at a time: a backlog is claimed and in
    // flight when the server goes away.
    receiver.answer(
        "/hook",
        Answer::status(200).after(Duration::from_millis(100)),
    );
    let dispatcher_pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(3))
        .connect(&cluster.url())
        .await
        .expect("dispatcher pool");
    let config = DispatcherConfig {
        per_subscriber: 2,
        ..config(&tables)
    };
    let running = run_with_hook(dispatcher_pool, config, &receiver);
    running.listening().await;

    let outbox = Outbox::new(tables.clone());
    let produce = |pool: PgPool, outbox: Outbox| async move {
        let event = common::TestEvent::named(EVENT);
        let mut tx = pool.begin().await.ok()?;
        let id = outbox.message(&event).notify().send(&mut tx).await.ok()?;
        tx.commit().await.ok()?;
        Some(id)
    };
    let mut committed: HashSet<Uuid> = HashSet::new();
    for _ in 0..20 {
        if let Some(id) = produce(pool.clone(), outbox.clone()).await {
            committed.insert(id);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before_restart = receiver.received_at("/hook").len();
    assert!(
        before_restart < committed.len(),
        "the restart should find a backlog"
    );
    cluster.restart().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after_restart = 0;
    while after_restart < 20 && Instant::now() < deadline {
        match produce(pool.clone(), outbox.clone()).await {
            Some(id) => {
                committed.insert(id);
                after_restart += 1;
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(after_restart, 20, "the database came back");

    let everything = receiver
        .wait_until(Duration::from_secs(20), |receiver| {
            let received: HashSet<Uuid> = receiver.event_ids("/hook").into_iter().collect();
            committed.is_subset(&received)
        })
        .await;
    let received: HashSet<Uuid> = receiver.event_ids("/hook").into_iter().collect();
    assert!(
        everything,
        "{} of {} committed events delivered",
        committed.intersection(&received).count(),
        committed.len()
    );
    running.listening().await;
    running.stop().await;
    pool.close().await;
}

/// A listener connection whose peer vanished without a word (a NAT dropping
/// an idle connection) is found by its liveness check and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_listener_is_found_by_its_liveness_check() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let server: std::net::SocketAddr = {
        let url = url::Url::parse(&db.url).expect("url");
        let host = url.host_str().expect("host").to_owned();
        tokio::net::lookup_host((host, url.port().unwrap_or(5432)))
            .await
            .expect("resolve")
            .next()
            .expect("an address")
    };
    let proxy = common::SilentProxy::start(server).await;
    let dispatcher_pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_millis(500))
        .connect(&proxy.url_for(&db.url))
        .await
        .expect("a pool through the proxy");
    let config = DispatcherConfig {
        poll_interval: Duration::from_secs(60),
        listener_ping_interval: Duration::from_millis(300),
        query_timeout: Duration::from_secs(1),
        ..config(&db.tables)
    };
    let running = run_with_hook(dispatcher_pool, config, &receiver);
    running.listening().await;
    let first = db.listener_pid().await.expect("a LISTEN connection");

    proxy.freeze();
    // The silenced backend lives on, unaware; a second one appears.
    let replaced = eventually_async(Duration::from_secs(15), || async {
        db.listener_pids().await.iter().any(|pid| *pid != first)
    })
    .await;
    assert!(replaced, "the silent listener was never replaced");
    running.listening().await;
    // The pool's own connections went silent too: each is dropped as a
    // statement on it (or its pre-acquire ping) times out, never handed
    // back to wait on its release ping, and delivery resumes. Within 10 s
    // (the wait of `notified_delivery`), well inside the 60 s poll: the
    // event came by its notification.
    let took = notified_delivery(&db, &receiver).await;
    assert!(took < Duration::from_secs(10), "took {took:?}");
    running.stop().await;
}

/// A dispatcher whose listener checks its connection every `interval`,
/// listening.
async fn run_checking_liveness_every(
    db: &Db,
    receiver: &RecordingReceiver,
    interval: Duration,
) -> Running {
    let config = DispatcherConfig {
        listener_ping_interval: interval,
        ..config(&db.tables)
    };
    let running = run_with_hook(db.pool.clone(), config, receiver);
    running.listening().await;
    running
}

/// An idle, healthy listener answers its own liveness checks and keeps its
/// connection: twenty check intervals with nothing else happening, and the
/// same backend is still listening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_healthy_listener_keeps_its_connection() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let interval = Duration::from_millis(100);
    let running = run_checking_liveness_every(&db, &receiver, interval).await;
    let first = db.listener_pid().await.expect("a LISTEN connection");
    // Observing that nothing happens takes the time it covers.
    tokio::time::sleep(interval * 20).await;
    assert_eq!(
        db.listener_pids().await,
        vec![first],
        "the listener gave up a healthy connection"
    );
    assert!(notified_delivery(&db, &receiver).await < Duration::from_secs(1));
    running.stop().await;
}

/// A listener whose connection is killed reconnects exactly once: one new
/// backend listens, and it is still the one after twenty liveness periods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listener_connection_is_replaced_exactly_once() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let interval = Duration::from_millis(100);
    let running = run_checking_liveness_every(&db, &receiver, interval).await;
    let first = db.listener_pid().await.expect("a LISTEN connection");
    terminate(&db.pool, first).await;
    let replaced = eventually_async(Duration::from_secs(10), || async {
        db.listener_pid().await.is_some_and(|pid| pid != first)
    })
    .await;
    assert!(replaced, "the listener did not reconnect");
    let second = db.listener_pid().await.expect("the new LISTEN connection");
    // Observing that nothing more happens takes the time it covers.
    tokio::time::sleep(interval * 20).await;
    assert_eq!(
        db.listener_pids().await,
        vec![second],
        "the listener reconnected more than once"
    );
    running.stop().await;
}
