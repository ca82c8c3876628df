//! The producer side of the outbox against a real PostgreSQL: a row and its
//! NOTIFY live and die with the caller's transaction, the DDL (and the SQL
//! template) create the contract's exact tables in any schema, and expired
//! events are purged on demand and by the retention sweep.

use crate::common;

use std::time::Duration;

use chrono::Utc;
use common::{Db, Running, config, eventually_async};
use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;
use websub_hub::delivery::outbox::{
    Dispatcher, DispatcherConfig, Envelope, HandlerError, OutboxTables, ddl, purge_expired,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_leaves_no_row_and_no_notification() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let outbox = db.outbox();
    let mut listener = PgListener::connect(&db.url).await.expect("listener");
    listener.listen(outbox.channel()).await.expect("listen");

    let event = common::TestEvent::named("user.created");
    let mut tx = db.pool.begin().await.expect("begin");
    outbox
        .message(&event)
        .for_app("ush")
        .notify()
        .send(&mut tx)
        .await
        .expect("send");
    tx.rollback().await.expect("rollback");
    assert_eq!(db.event_count().await, 0);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.recv())
            .await
            .is_err(),
        "a rolled-back NOTIFY was heard"
    );

    // Committed: the row, and the NOTIFY only once the commit is done.
    let mut tx = db.pool.begin().await.expect("begin");
    let id = outbox
        .message(&event)
        .for_app("ush")
        .notify()
        .send(&mut tx)
        .await
        .expect("send");
    assert!(
        tokio::time::timeout(Duration::from_millis(200), listener.recv())
            .await
            .is_err(),
        "the NOTIFY was heard before the commit"
    );
    tx.commit().await.expect("commit");
    let notification = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("the NOTIFY after the commit")
        .expect("a notification");
    assert_eq!(notification.payload(), id.to_string());
    assert_eq!(
        id.get_version_num(),
        7,
        "generated client side, time-ordered"
    );

    let row = sqlx::query(
        "SELECT event_name, resource_type, resource_id, event_type, app, payload::text, \
             created_at, extract(epoch FROM (timezone('utc', now()) - created_at)) \
         FROM outbox WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .expect("the row");
    assert_eq!(row.get::<String, _>(0), "user.created");
    assert_eq!(row.get::<String, _>(1), "user");
    assert_eq!(row.get::<String, _>(2), event.resource_id);
    assert_eq!(row.get::<String, _>(3), "authenticated");
    assert_eq!(row.get::<Option<String>, _>(4).as_deref(), Some("ush"));
    let payload: serde_json::Value = serde_json::from_str(&row.get::<String, _>(5)).expect("json");
    assert_eq!(payload, event.data);
    // created_at is the table default: the database's time in UTC.
    let created_at: chrono::NaiveDateTime = row.get(6);
    let skew = (Utc::now().naive_utc() - created_at).num_seconds().abs();
    assert!(skew < 60, "created_at is UTC: {created_at}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_notify_nothing_is_announced() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let outbox = db.outbox();
    let mut listener = PgListener::connect(&db.url).await.expect("listener");
    listener.listen(outbox.channel()).await.expect("listen");
    db.produce("user.created", None, false).await;
    assert_eq!(db.event_count().await, 1);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.recv())
            .await
            .is_err()
    );
    // An empty app is no app.
    let event = common::TestEvent::named("user.created");
    let mut connection = db.pool.acquire().await.expect("connection");
    let id = outbox
        .message(&event)
        .for_app("")
        .send(&mut connection)
        .await
        .expect("send outside a transaction");
    let app: Option<String> = sqlx::query_scalar("SELECT app FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .expect("row");
    assert_eq!(app, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ddl_creates_working_tables_in_a_custom_schema() {
    let tables =
        OutboxTables::new("billing.events", "billing.event_deliveries").expect("valid names");
    let Some(db) = Db::fresh(tables.clone()).await else {
        return;
    };
    // Running it again changes nothing.
    sqlx::raw_sql(AssertSqlSafe(ddl(&tables)))
        .execute(&db.pool)
        .await
        .expect("the DDL is idempotent");
    let index: String = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes \
         WHERE schemaname = 'billing' AND tablename = 'event_deliveries' \
           AND indexname = 'idx_event_deliveries_pending'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the pending index");
    assert!(
        index.contains("(next_attempt_at) WHERE (processed_at IS NULL)"),
        "{index}"
    );
    // The id default works without the producer.
    let id: Uuid = sqlx::query_scalar(
        "INSERT INTO billing.events (event_name, resource_type, resource_id, event_type, payload) \
         VALUES ('invoice.paid', 'invoice', '7', 'paid', '{}') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .expect("insert with the defaults");
    assert_eq!(id.get_version_num(), 4);

    let config = DispatcherConfig {
        subscriber_name: Some("ledger".to_owned()),
        ..config(&tables)
    };
    let dispatcher = Dispatcher::new(db.pool.clone(), config).expect("dispatcher");
    let (sender, mut received) = tokio::sync::mpsc::unbounded_channel();
    dispatcher
        .register_handler("invoice.paid", move |envelope: Envelope| {
            let sender = sender.clone();
            async move {
                sender.send(envelope.event_id)?;
                Ok::<(), HandlerError>(())
            }
        })
        .expect("register");
    let running = Running::start(dispatcher);
    let produced = db.produce("invoice.paid", None, true).await;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let id = tokio::time::timeout(Duration::from_secs(10), received.recv())
            .await
            .expect("both events delivered")
            .expect("the handler is alive");
        seen.push(id);
    }
    seen.sort();
    let mut expected = vec![id, produced];
    expected.sort();
    assert_eq!(seen, expected);
    let recorded = eventually_async(Duration::from_secs(5), || async {
        db.delivery(produced, "ledger")
            .await
            .is_some_and(|row| row.processed_at.is_some())
    })
    .await;
    assert!(
        recorded,
        "the delivery was recorded in billing.event_deliveries"
    );
    running.stop().await;
}

/// The template, rendered for one schema, and `ddl()` for the default names
/// in another create the same columns, defaults, constraints and index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_template_and_the_ddl_create_the_same_shape() {
    let Some(db) = Db::fresh(OutboxTables::in_schema("from_ddl").expect("valid")).await else {
        return;
    };
    let template = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../migrations/postgres/outbox/template.sql"
    ))
    .expect("the template");
    sqlx::raw_sql(AssertSqlSafe(template.replace("<schema>", "from_template")))
        .execute(&db.pool)
        .await
        .expect("the rendered template runs");

    let shape = |schema: &'static str| {
        let pool = db.pool.clone();
        async move {
            let columns: Vec<(String, String, String, String, Option<String>)> = sqlx::query_as(
                "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text, \
                     replace(column_default, $1, 'S') \
                 FROM information_schema.columns WHERE table_schema = $1 \
                 ORDER BY table_name, ordinal_position",
            )
            .bind(schema)
            .fetch_all(&pool)
            .await
            .expect("columns");
            let constraints: Vec<(String, String)> = sqlx::query_as(
                "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint \
                 WHERE connamespace = $1::regnamespace ORDER BY 1, 2",
            )
            .bind(schema)
            .fetch_all(&pool)
            .await
            .expect("constraints");
            let indexes: Vec<(String, String)> = sqlx::query_as(
                "SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY 1",
            )
            .bind(schema)
            .fetch_all(&pool)
            .await
            .expect("indexes");
            let normalise = |text: String| text.replace(schema, "S");
            (
                columns,
                constraints
                    .into_iter()
                    .map(|(table, definition)| (normalise(table), normalise(definition)))
                    .collect::<Vec<_>>(),
                indexes
                    .into_iter()
                    .map(|(name, definition)| (name, normalise(definition)))
                    .collect::<Vec<_>>(),
            )
        }
    };
    let from_template = shape("from_template").await;
    let from_ddl = shape("from_ddl").await;
    assert_eq!(from_template.0.len(), 15, "8 + 7 columns");
    assert_eq!(from_template, from_ddl);
    assert!(
        from_ddl
            .1
            .iter()
            .any(|(_, definition)| definition.contains("ON DELETE CASCADE"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_expired_deletes_old_events_and_their_deliveries() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let two_days = Duration::from_secs(2 * 86_400);
    let old = [
        db.produce("user.created", None, false).await,
        db.produce("user.created", None, false).await,
    ];
    let fresh = db.produce("user.created", None, false).await;
    for id in old {
        db.age(id, two_days).await;
    }
    for id in old.iter().chain([&fresh]) {
        sqlx::query(
            "INSERT INTO outbox_deliveries (event_id, subscriber, processed_at) \
             VALUES ($1, 'a', timezone('utc', now())), ($1, 'b', NULL)",
        )
        .bind(id)
        .execute(&db.pool)
        .await
        .expect("delivery rows");
    }
    let deleted = purge_expired(&db.pool, &db.tables, Duration::from_secs(86_400))
        .await
        .expect("purge");
    assert_eq!(deleted, 2);
    assert_eq!(db.event_count().await, 1);
    for id in old {
        assert_eq!(db.delivery_count(id).await, 0, "cascaded");
    }
    assert_eq!(db.delivery_count(fresh).await, 2, "kept");
    // Through the producer handle, nothing more is old enough.
    assert_eq!(
        db.outbox()
            .purge_expired(&db.pool, Duration::from_secs(86_400))
            .await
            .expect("purge"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_sweep_deletes_expired_events_soon_after_start() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let old = db.produce("user.created", None, false).await;
    db.age(old, Duration::from_secs(3 * 86_400)).await;
    let fresh = db.produce("user.created", None, false).await;
    let config = DispatcherConfig {
        retention: Some(Duration::from_secs(86_400)),
        ..config(&db.tables)
    };
    let running = Running::start(Dispatcher::new(db.pool.clone(), config).expect("dispatcher"));
    let swept = eventually_async(Duration::from_secs(5), || async {
        db.event_count().await == 1
    })
    .await;
    assert!(swept, "the expired event is still there");
    let left: Uuid = sqlx::query_scalar("SELECT id FROM outbox")
        .fetch_one(&db.pool)
        .await
        .expect("one event");
    assert_eq!(left, fresh);
    running.stop().await;
}
