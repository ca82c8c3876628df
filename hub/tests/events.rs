//! The event log's contract on both backends: the conformance suite
//! (`websub-logtest`, one test per check) on SQLite, a fresh file per check
//! under the target's temporary directory, and on PostgreSQL, a schema of
//! its own per check (on the connections' `search_path`), so that a claim in
//! one check never takes another's rows; then what is particular to each
//! backend: its own constraints, connecting, and claimers sharing one log
//! from many tasks.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use uuid::Uuid;
use websub_hub::storage::events::postgres::PostgresEventLog;
use websub_hub::storage::events::sqlite::SqliteEventLog;
use websub_hub::storage::events::*;
use websub_logtest::events::helpers::*;

use crate::scratch::{self, PgScratch, SqliteScratch, sqlite_path};

mod sqlite {
    websub_logtest::event_log_suite!(crate::scratch::SqliteScratch);
}

mod postgres {
    websub_logtest::event_log_suite!(crate::scratch::PgScratch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_claimers_postgres() {
    let Some(scratch) = PgScratch::new().await else {
        return;
    };
    concurrent_claimers_never_share_a_record(Arc::new(scratch.log.clone())).await;
    scratch.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_claimers_sqlite() {
    let scratch = SqliteScratch::new("concurrent").await;
    concurrent_claimers_never_share_a_record(Arc::new(scratch.log.clone())).await;
    scratch.remove().await;
}

/// The database itself refuses delivery records without an event, deletes
/// them with their event, and never lets either key change (PostgreSQL
/// enforces this with statement-level triggers; see the migration).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_delivery_records_need_their_event() {
    let Some(scratch) = PgScratch::new().await else {
        return;
    };
    let log = &scratch.log;
    let pool = log.pool();
    let orphan = sqlx::query(
        "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at) \
         VALUES ($1, 'https://subscriber.example/orphan', now())",
    )
    .bind(Uuid::now_v7())
    .execute(pool)
    .await
    .expect_err("a record for a missing event");
    assert_eq!(
        orphan.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("23503"),
        "{orphan}"
    );

    let event = record(log, &topic(), base_time()).await;
    log.expand(event.id, &subscribers("fk", 3), base_time())
        .await
        .expect("expand");
    let moved = sqlx::query("UPDATE websub_deliveries SET event_id = $1 WHERE event_id = $2")
        .bind(Uuid::now_v7())
        .bind(event.id)
        .execute(pool)
        .await
        .expect_err("moving records to another event");
    assert_eq!(
        moved.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("23503")
    );
    sqlx::query("UPDATE websub_events SET id = $1 WHERE id = $2")
        .bind(Uuid::now_v7())
        .bind(event.id)
        .execute(pool)
        .await
        .expect_err("changing an event's id");

    sqlx::query("DELETE FROM websub_events WHERE id = $1")
        .bind(event.id)
        .execute(pool)
        .await
        .expect("delete the event");
    assert_eq!(log.deliveries(event.id).await.expect("deliveries"), vec![]);
    scratch.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_delivery_records_need_their_event() {
    let scratch = SqliteScratch::new("fk").await;
    let log = &scratch.log;
    let pool = log.pool();
    sqlx::query(
        "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at) \
         VALUES (?1, 'https://subscriber.example/orphan', 0)",
    )
    .bind(Uuid::now_v7())
    .execute(pool)
    .await
    .expect_err("a record for a missing event");

    let event = record(log, &topic(), base_time()).await;
    log.expand(event.id, &subscribers("fk", 3), base_time())
        .await
        .expect("expand");
    sqlx::query("DELETE FROM websub_events WHERE id = ?1")
        .bind(event.id)
        .execute(pool)
        .await
        .expect("delete the event");
    assert_eq!(log.deliveries(event.id).await.expect("deliveries"), vec![]);
    scratch.remove().await;
}

// ---------------------------------------------------------------------------
// Connecting and migrating
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_connect_is_idempotent_and_concurrent() {
    let path = sqlite_path("connect");
    let url = format!("sqlite:{}", path.display());
    // Several pools opening one new file at once, the subscription store's
    // among them: one migrates each schema, the others find nothing to do.
    let (opened, store) = tokio::join!(
        futures::future::join_all((0..4).map(|_| SqliteEventLog::connect(&url))),
        websub_hub::store::sqlite::SqliteStore::connect(&url)
    );
    let store = store.expect("open the subscription store on the same file");
    let logs: Vec<SqliteEventLog> = opened
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("concurrent connects");
    let event = record(&logs[0], &topic(), base_time()).await;
    let again = SqliteEventLog::connect(path.to_str().expect("utf-8 path"))
        .await
        .expect("reopen by plain path");
    assert_eq!(again.event(event.id).await.expect("read"), Some(event));

    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(again.pool())
            .await
            .expect("list tables");
    for table in [
        "websub_hub_migrations",
        "websub_store_migrations",
        "websub_events",
        "websub_deliveries",
        "websub_subscriptions",
    ] {
        assert!(tables.contains(&table.to_owned()), "{table} in {tables:?}");
    }
    assert!(
        !tables.contains(&"_sqlx_migrations".to_owned()),
        "{tables:?}"
    );
    let (journal, foreign_keys, synchronous): (String, i64, i64) = sqlx::query_as(
        "SELECT (SELECT journal_mode FROM pragma_journal_mode), \
                (SELECT foreign_keys FROM pragma_foreign_keys), \
                (SELECT synchronous FROM pragma_synchronous)",
    )
    .fetch_one(again.pool())
    .await
    .expect("read pragmas");
    assert_eq!(journal, "wal");
    assert_eq!(foreign_keys, 1);
    assert_eq!(synchronous, 1, "NORMAL");

    store.pool().close().await;
    again.pool().close().await;
    for log in logs {
        log.pool().close().await;
    }
    SqliteScratch { log: again, path }.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_connect_migrates_the_default_schema() {
    let Some(url) = websub_storetest::servers::postgres_url().await else {
        return;
    };
    // Replicas starting together, each migrating the subscription store and
    // the event log: the migrators' advisory lock serialises them, and each
    // keeps its own history table. The tables may already exist from another
    // test binary; nothing here assumes they are empty.
    let (a, b, store) = tokio::join!(
        PostgresEventLog::connect(&url),
        PostgresEventLog::connect(&url),
        websub_hub::store::postgres::PostgresStore::connect(&url)
    );
    let (a, b) = (a.expect("connect a"), b.expect("connect b"));
    store.expect("migrate the subscription store beside the event log");
    let event = record(&a, &topic(), base_time()).await;
    assert_eq!(b.event(event.id).await.expect("read"), Some(event.clone()));
    // The log's sessions compile no statement: JIT is off, and commits
    // of claims and outcomes do not wait for a WAL flush.
    for (setting, expected) in [("jit", "off"), ("synchronous_commit", "off")] {
        let value: String = sqlx::query_scalar("SELECT current_setting($1)")
            .bind(setting)
            .fetch_one(a.pool())
            .await
            .expect("read a session setting");
        assert_eq!(value, expected, "{setting}");
    }
    for table in ["websub_hub_migrations", "websub_store_migrations"] {
        let found: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
            .bind(table)
            .fetch_one(a.pool())
            .await
            .expect("look up a migrations table");
        assert_eq!(found.as_deref(), Some(table));
    }
    // Leave nothing behind in the shared schema.
    sqlx::query("DELETE FROM websub_events WHERE id = $1")
        .bind(event.id)
        .execute(a.pool())
        .await
        .expect("clean up");
}

// ---------------------------------------------------------------------------
// What operators read and steer
// ---------------------------------------------------------------------------

/// Eight dispatchers draining one event's 5 000 records at once.
async fn concurrent_claimers_never_share_a_record(log: Arc<dyn EventLog>) {
    let t0 = base_time();
    let event = record(&*log, &topic(), t0).await;
    let subs = subscribers("concurrent", 5_000);
    log.expand(event.id, &subs, t0).await.expect("expand");

    let claimers: Vec<_> = (0..8)
        .map(|_| {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let batch = log.claim(37, t0, VISIBILITY).await.expect("claim");
                    if batch.is_empty() {
                        return mine;
                    }
                    mine.extend(batch);
                }
            })
        })
        .collect();
    let mut seen = HashSet::new();
    let mut per_claimer = Vec::new();
    for claimer in claimers {
        let mine = claimer.await.expect("claimer task");
        per_claimer.push(mine.len());
        for claimed in mine {
            assert_eq!(claimed.event_id, event.id);
            assert!(
                seen.insert(claimed.subscriber.clone()),
                "{} was claimed twice",
                claimed.subscriber
            );
        }
    }
    assert_eq!(
        seen.len(),
        subs.len(),
        "every record claimed ({per_claimer:?})"
    );
    println!("{}: 8 claimers took {per_claimer:?}", backend(&*log));
}

/// The partitions of `websub_events` by name, the DEFAULT one included.
async fn partitions(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::TEXT FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'websub_events'::regclass ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("list the partitions")
}

/// The partition a row of `table` is kept in.
async fn partition_of(pool: &sqlx::PgPool, table: &str, column: &str, id: Uuid) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT tableoid::regclass::TEXT FROM {table} WHERE {column} = $1 LIMIT 1"
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("find the row's partition")
}

/// On PostgreSQL, room made ahead is a partition per span in each of the
/// three tables; an event, its records and its attempts are kept in the
/// partitions of its time, and retention drops those partitions whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_retention_drops_partitions() {
    let Some(scratch) = PgScratch::new().await else {
        return;
    };
    let (log, pool) = (&scratch.log, scratch.log.pool().clone());
    assert_eq!(
        partitions(&pool).await,
        ["websub_events_default", "websub_events_legacy"],
        "a new log has the partition from before partitioning and the default one"
    );
    let made = log
        .partition_ahead(Duration::from_secs(60), Utc::now())
        .await
        .expect("make room ahead");
    assert!(made >= 5, "made {made}");
    let ahead = partitions(&pool).await;
    assert_eq!(ahead.len(), 2 + usize::try_from(made).expect("a count"));

    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    let subscriber = subscribers("partitioned", 1).remove(0);
    log.expand(event.id, std::slice::from_ref(&subscriber), t0)
        .await
        .expect("expand");
    log.complete(&[retried(event.id, &subscriber, t0, 500)], t0)
        .await
        .expect("complete");
    let home = partition_of(&pool, "websub_events", "id", event.id).await;
    assert!(home.starts_with("websub_events_p"), "{home}");
    let suffix = home.trim_start_matches("websub_events");
    assert_eq!(
        partition_of(&pool, "websub_deliveries", "event_id", event.id).await,
        format!("websub_deliveries{suffix}")
    );
    assert_eq!(
        partition_of(&pool, "websub_attempts", "event_id", event.id).await,
        format!("websub_attempts{suffix}")
    );

    // A cutoff inside the event's span keeps its partition whole.
    assert_eq!(log.purge_before(t0).await.expect("purge"), 0);
    assert!(partitions(&pool).await.contains(&home));

    let purged = log
        .purge_before(Utc::now() + secs(3_600))
        .await
        .expect("purge past it");
    assert_eq!(purged, 1);
    let left = partitions(&pool).await;
    assert!(!left.contains(&home), "{home} dropped: {left:?}");
    for table in ["websub_events", "websub_deliveries", "websub_attempts"] {
        let gone: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::TEXT")
            .bind(format!("{table}{suffix}"))
            .fetch_one(&pool)
            .await
            .expect("look the partition up");
        assert_eq!(gone, None, "{table}{suffix} dropped");
    }
    assert!(left.contains(&"websub_events_default".to_owned()));
    scratch.drop_schema().await;
}

/// A log written before partitioning keeps every row through the
/// migration, in the legacy partition, which retention drops whole once all
/// of it is older than the cutoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_partitioning_keeps_a_log_written_before_it() {
    let Some(schema) = scratch::PgSchema::unmigrated("events_legacy", 4).await else {
        return;
    };
    let pool = schema.pool.clone();
    // The schema as it was before 0016.
    let mut before = websub_hub::storage::events::postgres::migrator();
    before.migrations = before
        .migrations
        .iter()
        .filter(|migration| migration.version < 16)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    before.run(&pool).await.expect("migrate to 0015");
    let old = PostgresEventLog::from_pool(pool.clone());
    let t0 = base_time();
    let subs = subscribers("legacy", 3);
    // Written as that schema takes it, without the columns of later
    // migrations.
    let event = LoggedEvent {
        id: Uuid::now_v7(),
        topic: topic(),
        content_type: "application/json".to_owned(),
        body: bytes::Bytes::from_static(b"{\"legacy\":true}"),
        created_at: t0,
        original_id: None,
        trace_context: None,
    };
    sqlx::query(
        "INSERT INTO websub_events (id, topic, content_type, body, created_at) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(event.id)
    .bind(&event.topic)
    .bind(&event.content_type)
    .bind(event.body.as_ref())
    .bind(event.created_at)
    .execute(&pool)
    .await
    .expect("record an event before 0016");
    old.expand(event.id, &subs, t0).await.expect("expand");
    old.complete(&[completion(event.id, &subs[0], Outcome::Delivered)], t0)
        .await
        .expect("complete");

    let log = PostgresEventLog::from_pool(pool.clone());
    log.migrate().await.expect("partition the log");
    assert_eq!(
        log.event(event.id).await.expect("read"),
        Some(event.clone())
    );
    let records = log.deliveries(event.id).await.expect("deliveries");
    assert_eq!(records.len(), 3);
    assert_eq!(
        partition_of(&pool, "websub_events", "id", event.id).await,
        "websub_events_legacy"
    );
    // Claims and new events work on the partitioned tables.
    let claimed = log
        .claim(100, t0 + secs(1), Duration::from_secs(30))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    log.partition_ahead(Duration::from_secs(60), Utc::now())
        .await
        .expect("make room ahead");
    let new = record(&log, &topic(), Utc::now()).await;
    assert!(
        partition_of(&pool, "websub_events", "id", new.id)
            .await
            .starts_with("websub_events_p")
    );

    let purged = log
        .purge_before(Utc::now() + secs(3_600))
        .await
        .expect("purge past both");
    assert_eq!(purged, 2);
    assert!(
        !partitions(&pool)
            .await
            .contains(&"websub_events_legacy".to_owned())
    );
    schema.drop_schema().await;
}
