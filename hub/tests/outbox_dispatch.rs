//! The outbox dispatcher against a real PostgreSQL (a fresh database per
//! test) and real webhook receivers on 127.0.0.1: wake-up by NOTIFY, app
//! scoping, the start-from cutoff, retries and exhaustion, isolation of a
//! failing subscriber, in-process handlers, the webhook contract, and
//! several dispatchers (or a killed one) sharing a table.

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{NaiveDateTime, Utc};
use common::{
    Db, EVENT, Running, config, eventually_async, pool, run_listening_with_hook, run_with_hook,
    webhook,
};
use sqlx::AssertSqlSafe;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use websub_hub::delivery::RetryPolicy;
use websub_hub::delivery::net::NetPolicy;
use websub_hub::delivery::outbox::{
    Dispatcher, DispatcherConfig, Envelope, HandlerError, MESSAGING_EVENT_ID_HEADER,
    MESSAGING_SIGNATURE_HEADER, Outbox, RegistrationError, WebhookFilter, scan_index_ddl, verify,
};
use websub_hub::storage::events::sqlite::SqliteEventLog;
use websub_hub::storage::events::{DeliveryState, EventLog};
use websub_tests::{Answer, RecordingReceiver};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_event_wakes_the_dispatcher_through_notify_within_milliseconds() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let running = run_listening_with_hook(&db, &receiver).await;

    let mut latencies = Vec::new();
    for round in 0..40 {
        let outbox = db.outbox();
        let event = common::TestEvent::named(EVENT);
        let mut tx = db.pool.begin().await.expect("begin");
        outbox
            .message(&event)
            .notify()
            .send(&mut tx)
            .await
            .expect("send");
        tx.commit().await.expect("commit");
        let committed = Instant::now();
        assert!(
            receiver.wait_for("/hook", round + 1, WAIT).await,
            "event {round} was not delivered"
        );
        let received = receiver.received_at("/hook")[round].at;
        latencies.push(received.saturating_duration_since(committed));
    }
    latencies.sort();
    let p50 = latencies[latencies.len() / 2];
    let p99 = latencies[latencies.len() * 99 / 100];
    println!("commit to receipt over NOTIFY: p50 {p50:?}, p99 {p99:?}");
    assert!(
        latencies
            .iter()
            .all(|latency| *latency < Duration::from_secs(2)),
        "a delivery waited for polling: {latencies:?}"
    );
    assert!(p50 < Duration::from_millis(25), "p50 {p50:?}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_subscribers_of_their_app_and_of_every_app_never_another_app() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let dispatcher = Dispatcher::new(db.pool.clone(), config(&db.tables)).expect("dispatcher");
    let mut subscribers = webhook("ush-users", Some("ush"), receiver.url("/ush"));
    subscribers.extend(webhook(
        "financer-users",
        Some("financer"),
        receiver.url("/financer"),
    ));
    subscribers.extend(webhook("audit", None, receiver.url("/audit")));
    dispatcher
        .register_webhooks(EVENT, subscribers)
        .expect("register");
    let running = Running::start(dispatcher);

    let ush = db.produce(EVENT, Some("ush"), true).await;
    let financer = db.produce(EVENT, Some("financer"), true).await;
    let none = db.produce(EVENT, None, true).await;

    assert!(receiver.wait_for("/audit", 3, WAIT).await);
    assert!(receiver.wait_for("/ush", 2, WAIT).await);
    assert!(receiver.wait_for("/financer", 2, WAIT).await);
    // A few polls more: nothing else arrives.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let set = |ids: Vec<Uuid>| ids.into_iter().collect::<HashSet<_>>();
    assert_eq!(set(receiver.event_ids("/ush")), HashSet::from([ush, none]));
    assert_eq!(
        set(receiver.event_ids("/financer")),
        HashSet::from([financer, none])
    );
    assert_eq!(
        set(receiver.event_ids("/audit")),
        HashSet::from([ush, financer, none])
    );
    assert_eq!(receiver.received().len(), 7, "each delivered once");
    // The wrong app's events were never expanded: no row at all.
    assert!(db.delivery(financer, "ush-users").await.is_none());
    assert!(db.delivery(ush, "financer-users").await.is_none());
    assert_eq!(db.delivery_count(none).await, 3);
    // No secret configured: nothing is signed.
    assert!(
        receiver
            .received()
            .iter()
            .all(|received| received.header(MESSAGING_SIGNATURE_HEADER).is_none())
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_from_bounds_expansion_but_existing_rows_are_always_delivered() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let two_hours = Duration::from_secs(2 * 3600);
    let old_with_row = db.produce(EVENT, None, false).await;
    db.age(old_with_row, two_hours).await;
    let sql = format!(
        "INSERT INTO {} (event_id, subscriber) VALUES ($1, 'hook')",
        common::quoted(db.tables.deliveries())
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(old_with_row)
        .execute(&db.pool)
        .await
        .expect("an existing row");
    let old_without_row = db.produce(EVENT, None, false).await;
    db.age(old_without_row, two_hours).await;

    let config = DispatcherConfig {
        start_from: Some(Utc::now() - chrono::Duration::hours(1)),
        ..config(&db.tables)
    };
    let running = run_with_hook(db.pool.clone(), config, &receiver);
    let recent = db.produce(EVENT, None, true).await;

    assert!(receiver.wait_for("/hook", 2, WAIT).await);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let delivered: HashSet<Uuid> = receiver.event_ids("/hook").into_iter().collect();
    assert_eq!(delivered, HashSet::from([old_with_row, recent]));
    assert!(db.delivery(old_without_row, "hook").await.is_none());
    // The outcome is recorded after the receiver's answer: wait for it.
    let recorded = eventually_async(WAIT, || async {
        db.delivery(old_with_row, "hook")
            .await
            .is_some_and(|row| row.processed_at.is_some())
    })
    .await;
    assert!(recorded, "the existing row is recorded delivered");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_nobody_subscribes_to_get_no_rows() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let running = run_with_hook(db.pool.clone(), config(&db.tables), &receiver);
    let ignored = db.produce("billing.invoice.paid", None, true).await;
    let wanted = db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/hook", 1, WAIT).await);
    // Past a few polls (and the expansion each runs).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(receiver.event_ids("/hook"), [wanted]);
    assert_eq!(db.delivery_count(ignored).await, 0);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_retry_on_the_curve_then_exhaust_keeping_the_status() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer("/dead", Answer::status(500));
    // 3 retries, the last after 400 ms: waits 0, 200 ms, 400 ms.
    let dispatcher = Dispatcher::new(db.pool.clone(), config(&db.tables)).expect("dispatcher");
    dispatcher
        .register_webhooks(EVENT, webhook("dead", None, receiver.url("/dead")))
        .expect("register");
    let running = Running::start(dispatcher);
    let id = db.produce(EVENT, None, true).await;

    assert!(receiver.wait_for("/dead", 4, WAIT).await);
    let exhausted = eventually_async(WAIT, || async {
        db.delivery(id, "dead")
            .await
            .is_some_and(|row| row.retry_count == 4)
    })
    .await;
    assert!(exhausted, "the row did not record four failures");
    // Never claimed again, even once the subscriber would answer.
    receiver.answer("/dead", Answer::status(200));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let attempts = receiver.received_at("/dead");
    assert_eq!(attempts.len(), 4, "one attempt and three retries");
    let gaps: Vec<Duration> = attempts
        .windows(2)
        .map(|pair| pair[1].at - pair[0].at)
        .collect();
    assert!(
        gaps[0] < Duration::from_millis(150),
        "first retry: {gaps:?}"
    );
    assert!(gaps[1] >= Duration::from_millis(190), "second: {gaps:?}");
    assert!(gaps[2] >= Duration::from_millis(390), "last: {gaps:?}");
    assert!(gaps[2] > gaps[1], "growing: {gaps:?}");

    let row = db.delivery(id, "dead").await.expect("row");
    assert_eq!(row.processed_at, None);
    assert_eq!(row.processing_since, None);
    assert_eq!(row.next_attempt_at, None);
    assert_eq!(
        row.last_error.as_deref(),
        Some("HTTP 500 Internal Server Error")
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_briefly_unavailable_subscriber_is_picked_up_at_once() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer("/flaky", Answer::status(503));
    let config = DispatcherConfig {
        retry: RetryPolicy {
            max_retries: 10,
            max_backoff: Duration::from_secs(10),
        },
        // Far beyond the bound below: a retry that waited for a poll
        // could not pass for immediate, however busy the machine.
        poll_interval: Duration::from_secs(60),
        ..config(&db.tables)
    };
    let dispatcher = Dispatcher::new(db.pool.clone(), config).expect("dispatcher");
    dispatcher
        .register_webhooks(EVENT, webhook("flaky", None, receiver.url("/flaky")))
        .expect("register");
    let running = Running::start(dispatcher);
    // The event comes by its notification, not by a poll.
    running.listening().await;
    let id = db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/flaky", 1, WAIT).await);
    receiver.answer("/flaky", Answer::status(200));
    let delivered = eventually_async(WAIT, || async {
        db.delivery(id, "flaky")
            .await
            .is_some_and(|row| row.processed_at.is_some())
    })
    .await;
    assert!(delivered);
    let attempts = receiver.received_at("/flaky");
    // The first retry is immediate: no waiting for a poll or a backoff.
    let first_retry = attempts[1].at - attempts[0].at;
    assert!(first_retry < Duration::from_secs(1), "{first_retry:?}");
    let row = db.delivery(id, "flaky").await.expect("row");
    assert_eq!(
        row.retry_count,
        i32::try_from(attempts.len() - 1).expect("small")
    );
    assert_eq!(
        row.last_error.as_deref(),
        Some("HTTP 503 Service Unavailable"),
        "the last failure stays for inspection"
    );
    running.stop().await;
}

/// With the contract's defaults (10 retries, 10 s), a dead subscriber is
/// retried on the contract's curve: each wait follows the default policy,
/// which exhausts it in about 20 seconds. The test follows the first eight
/// retries (some 5 s) and reads the ninth's wait from the row; giving up
/// after the last retry is `failures_retry_on_the_curve_then_exhaust_keeping_the_status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_defaults_a_dead_subscriber_retries_on_the_contracts_curve() {
    const FOLLOWED: usize = 8;
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer("/dead", Answer::status(502));
    let config = DispatcherConfig {
        tables: db.tables.clone(),
        network: NetPolicy {
            allow_private_network: true,
        },
        ..DispatcherConfig::default()
    };
    let policy = config.retry;
    assert_eq!(policy, RetryPolicy::default());
    let dispatcher = Dispatcher::new(db.pool.clone(), config).expect("dispatcher");
    dispatcher
        .register_webhooks(EVENT, webhook("dead", None, receiver.url("/dead")))
        .expect("register");
    let running = Running::start(dispatcher);
    let id = db.produce(EVENT, None, true).await;
    assert!(
        receiver
            .wait_for("/dead", FOLLOWED + 1, Duration::from_secs(20))
            .await
    );
    let attempts = receiver.received_at("/dead");
    for (retry, pair) in (1u32..).zip(attempts.windows(2).take(FOLLOWED)) {
        let gap = pair[1].at - pair[0].at;
        let wait = policy.backoff(retry);
        assert!(
            gap + Duration::from_millis(10) >= wait && gap < wait + Duration::from_millis(700),
            "retry {retry} came {gap:?} after the attempt before it, not {wait:?}"
        );
    }
    // The ninth retry waits 5 s, as the row records.
    let scheduled = eventually_async(WAIT, || async {
        db.delivery(id, "dead").await.is_some_and(|row| {
            row.retry_count == FOLLOWED as i32 + 1 && row.next_attempt_at.is_some()
        })
    })
    .await;
    assert!(scheduled, "the ninth failure was not recorded");
    let row = db.delivery(id, "dead").await.expect("row");
    let wait = (row.next_attempt_at.expect("a next attempt") - Utc::now().naive_utc())
        .to_std()
        .unwrap_or_default();
    let ninth = policy.backoff(FOLLOWED as u32 + 1);
    assert!(
        wait <= ninth && wait + Duration::from_secs(2) > ninth,
        "the ninth retry is due in {wait:?}, not about {ninth:?}"
    );
    assert_eq!(row.last_error.as_deref(), Some("HTTP 502 Bad Gateway"));
    assert_eq!(receiver.received_at("/dead").len(), FOLLOWED + 1);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_subscriber_never_holds_up_another() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    // Answers after the delivery timeout: every attempt holds its slot for
    // the whole timeout.
    receiver.answer("/stuck", Answer::status(200).after(Duration::from_secs(5)));
    let config = DispatcherConfig {
        concurrency: 8,
        per_subscriber: 4,
        ..config(&db.tables)
    };
    let dispatcher = Dispatcher::new(db.pool.clone(), config).expect("dispatcher");
    let mut subscribers = webhook("stuck", None, receiver.url("/stuck"));
    subscribers.extend(webhook("healthy", None, receiver.url("/healthy")));
    dispatcher
        .register_webhooks(EVENT, subscribers)
        .expect("register");
    let running = Running::start(dispatcher);
    let started = Instant::now();
    for _ in 0..40 {
        db.produce(EVENT, None, true).await;
    }
    assert!(
        receiver
            .wait_for("/healthy", 40, Duration::from_secs(5))
            .await,
        "the healthy subscriber got {} of 40",
        receiver.received_at("/healthy").len()
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(2),
        "the healthy subscriber waited for the stuck one: {elapsed:?}"
    );
    assert!(
        receiver.received_at("/stuck").len() <= 4,
        "the stuck subscriber is held to its share of the slots"
    );
    running.token.cancel();
    // Draining waits for the stuck attempts' timeouts.
    tokio::time::timeout(Duration::from_secs(10), running.task)
        .await
        .expect("drains")
        .expect("task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_needs_a_subscriber_name() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let dispatcher = Dispatcher::new(db.pool.clone(), config(&db.tables)).expect("dispatcher");
    let handler = |_envelope: Envelope| async { Ok::<(), HandlerError>(()) };
    assert_eq!(
        dispatcher.register_handler(EVENT, handler),
        Err(RegistrationError::NoSubscriberName)
    );
    assert_eq!(
        dispatcher.register_catch_all_handler(handler),
        Err(RegistrationError::NoSubscriberName)
    );
    // Webhooks need none.
    dispatcher
        .register_webhooks(
            EVENT,
            webhook(
                "hook",
                None,
                url::Url::parse("http://127.0.0.1:9/").expect("url"),
            ),
        )
        .expect("webhooks without a subscriber name");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_get_the_envelope_and_their_failures_are_retried() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let config = DispatcherConfig {
        subscriber_name: Some("discord-notifier".to_owned()),
        ..config(&db.tables)
    };
    let dispatcher = Dispatcher::new(db.pool.clone(), config).expect("dispatcher");
    let seen: Arc<Mutex<Vec<Envelope>>> = Arc::default();
    let calls = seen.clone();
    dispatcher
        .register_handler("setup.created", move |envelope: Envelope| {
            let calls = calls.clone();
            async move {
                let mut calls = calls.lock().expect("lock");
                calls.push(envelope);
                if calls.len() == 1 {
                    return Err(HandlerError::from("the channel is unreachable"));
                }
                Ok(())
            }
        })
        .expect("register");
    let running = Running::start(dispatcher);
    let id = db.produce("setup.created", Some("lmu"), true).await;
    let processed = eventually_async(WAIT, || async {
        db.delivery(id, "discord-notifier")
            .await
            .is_some_and(|row| row.processed_at.is_some())
    })
    .await;
    assert!(processed);
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2, "one failure, one retry");
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].event_id, id);
    assert_eq!(seen[0].event_name, "setup.created");
    assert_eq!(seen[0].app.as_deref(), Some("lmu"));
    assert_eq!(seen[0].resource_type, "user");
    assert_eq!(seen[0].data["name"], "setup.created");
    let row = db.delivery(id, "discord-notifier").await.expect("row");
    assert_eq!(row.retry_count, 1);
    assert!(
        row.last_error
            .as_deref()
            .is_some_and(|error| error.contains("the channel is unreachable")),
        "{row:?}"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_get_the_exact_envelope_signature_and_headers() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let secret = "a signing secret of some length";
    let config = DispatcherConfig {
        signing_secret: Some(secret.to_owned()),
        webhook_headers: vec![
            ("X-Internal-API-Key".to_owned(), "k".repeat(32)),
            ("X-Origin".to_owned(), "auth-api".to_owned()),
        ],
        ..config(&db.tables)
    };
    let running = run_with_hook(db.pool.clone(), config, &receiver);
    let with_app = db.produce(EVENT, Some("ush"), true).await;
    let without_app = db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/hook", 2, WAIT).await);

    for received in receiver.received_at("/hook") {
        let id = received.event_id();
        let (created_at, resource_id): (NaiveDateTime, String) =
            sqlx::query_as("SELECT created_at, resource_id FROM outbox WHERE id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .expect("the event row");
        let app = (id == with_app).then(|| "ush".to_owned());
        let expected = Envelope {
            event_id: id,
            event_name: EVENT.to_owned(),
            app: app.clone(),
            occurred_at: created_at.and_utc(),
            resource_type: "user".to_owned(),
            resource_id,
            event_type: "authenticated".to_owned(),
            data: serde_json::json!({"name": EVENT, "n": 1}),
        };
        assert_eq!(received.body, expected.to_json(), "the exact body");
        let text = String::from_utf8(received.body.to_vec()).expect("utf-8");
        assert!(text.starts_with(&format!("{{\"event_id\":\"{id}\",\"event_name\":")));
        assert_eq!(text.contains("\"app\":\"ush\""), app.is_some(), "{text}");
        assert_eq!(text.contains("\"app\""), app.is_some(), "{text}");
        let occurred_at = expected
            .occurred_at
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        assert!(occurred_at.ends_with('Z'));
        assert!(
            text.contains(&format!("\"occurred_at\":\"{occurred_at}\"")),
            "{text}"
        );
        assert_eq!(received.header("content-type"), Some("application/json"));
        assert_eq!(
            received.header(MESSAGING_EVENT_ID_HEADER),
            Some(id.to_string().as_str())
        );
        let signature = received.header(MESSAGING_SIGNATURE_HEADER);
        assert!(signature.is_some_and(|value| value.starts_with("sha256=")));
        assert!(verify(secret.as_bytes(), &received.body, signature));
        assert!(!verify(b"another secret", &received.body, signature));
        assert_eq!(
            received.header("x-internal-api-key"),
            Some("k".repeat(32).as_str())
        );
        assert_eq!(received.header("x-origin"), Some("auth-api"));
    }
    assert_eq!(
        receiver
            .event_ids("/hook")
            .into_iter()
            .collect::<HashSet<_>>(),
        HashSet::from([with_app, without_app])
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_dispatchers_on_one_table_deliver_everything_once_and_never_concurrently() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer("/a", Answer::status(200).after(Duration::from_millis(5)));
    let mut runners = Vec::new();
    for _ in 0..2 {
        // Separate pools: as separate processes would.
        let own_pool = pool(&db.url, 4).await;
        let config = DispatcherConfig {
            concurrency: 16,
            batch_size: 20,
            ..config(&db.tables)
        };
        let dispatcher = Dispatcher::new(own_pool, config).expect("dispatcher");
        let mut subscribers = webhook("a", None, receiver.url("/a"));
        subscribers.extend(webhook("b", None, receiver.url("/b")));
        dispatcher
            .register_webhooks(EVENT, subscribers)
            .expect("register");
        runners.push(Running::start(dispatcher));
    }
    let mut produced = HashSet::new();
    for round in 0..150 {
        produced.insert(db.produce(EVENT, None, round % 2 == 0).await);
    }
    for path in ["/a", "/b"] {
        assert!(
            receiver.wait_for(path, 150, Duration::from_secs(20)).await,
            "{path} got {}",
            receiver.received_at(path).len()
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for path in ["/a", "/b"] {
        let ids = receiver.event_ids(path);
        let unique: HashSet<Uuid> = ids.iter().copied().collect();
        assert_eq!(unique, produced, "{path}: every event");
        assert_eq!(ids.len(), unique.len(), "{path}: each once");
    }
    assert_eq!(
        receiver.overlaps(MESSAGING_EVENT_ID_HEADER),
        0,
        "no row was delivered twice at once"
    );
    for runner in runners {
        runner.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_dispatcher_loses_nothing() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer(
        "/slow",
        Answer::status(200).after(Duration::from_millis(800)),
    );
    let short = DispatcherConfig {
        delivery_timeout: Duration::from_secs(1),
        visibility_timeout: Duration::from_secs(2),
        ..config(&db.tables)
    };
    let mut produced = HashSet::new();
    for _ in 0..10 {
        produced.insert(db.produce(EVENT, None, false).await);
    }

    // The first dispatcher runs on a runtime of its own: shutting that down
    // kills every task it has, mid-attempt, as a killed process would.
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let (url, tables_config, hook) = (db.url.clone(), short.clone(), receiver.url("/slow"));
    doomed.spawn(async move {
        let own_pool = pool(&url, 2).await;
        let dispatcher = Dispatcher::new(own_pool, tables_config).expect("dispatcher");
        dispatcher
            .register_webhooks(EVENT, webhook("slow", None, hook))
            .expect("register");
        dispatcher.run(CancellationToken::new()).await;
    });
    assert!(receiver.wait_for("/slow", 3, WAIT).await, "attempts began");
    doomed.shutdown_background();
    receiver.answer("/slow", Answer::status(200));

    let dispatcher = Dispatcher::new(db.pool.clone(), short).expect("dispatcher");
    dispatcher
        .register_webhooks(EVENT, webhook("slow", None, receiver.url("/slow")))
        .expect("register");
    let running = Running::start(dispatcher);
    let all_processed = eventually_async(Duration::from_secs(15), || async {
        let mut done = 0;
        for id in &produced {
            if db
                .delivery(*id, "slow")
                .await
                .is_some_and(|row| row.processed_at.is_some())
            {
                done += 1;
            }
        }
        done == produced.len()
    })
    .await;
    assert!(all_processed, "every event was delivered after the kill");
    let received: HashSet<Uuid> = receiver.event_ids("/slow").into_iter().collect();
    assert_eq!(received, produced);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_delivers_without_any_notify() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let running = run_with_hook(db.pool.clone(), config(&db.tables), &receiver);
    running.listening().await;
    let started = Instant::now();
    let id = db.produce(EVENT, None, false).await;
    assert!(receiver.wait_for("/hook", 1, WAIT).await);
    assert_eq!(receiver.event_ids("/hook"), [id]);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "one poll interval (200 ms) away"
    );
    running.stop().await;
}

/// Rows left unclaimed when their subscriber's room ran out go before
/// events notified after them, rather than after a poll (an hour away
/// here): newer events must not take every slot that frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_left_for_want_of_room_go_before_newer_events() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer(
        "/hook",
        Answer::status(200).after(Duration::from_millis(100)),
    );
    // Four attempts at once, about 40 deliveries a second, and sixteen rows
    // held (the visibility timeout leaves room for four waves): of a burst
    // of 40, 24 are left unclaimed.
    let running = run_with_hook(
        db.pool.clone(),
        DispatcherConfig {
            poll_interval: Duration::from_secs(3600),
            per_subscriber: 4,
            visibility_timeout: Duration::from_secs(60),
            ..config(&db.tables)
        },
        &receiver,
    );
    running.listening().await;
    let mut burst = Vec::new();
    for _ in 0..40 {
        burst.push(db.produce(EVENT, None, true).await);
    }
    // Newer events keep coming for four seconds, a little slower than the
    // subscriber takes them, so that the rows held never fall to half.
    let mut streamed = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        streamed.push(db.produce(EVENT, None, true).await);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(
        receiver
            .wait_for("/hook", burst.len() + streamed.len(), WAIT)
            .await
    );
    // Each burst row went as soon as a slot freed, ahead of the stream:
    // without that, dozens of newer events went first.
    let order = receiver.event_ids("/hook");
    let last_of_burst = order
        .iter()
        .rposition(|id| burst.contains(id))
        .expect("the burst arrived");
    let overtaking = order[..last_of_burst]
        .iter()
        .filter(|id| streamed.contains(id))
        .count();
    assert!(
        overtaking <= 4,
        "{overtaking} newer events went before the last of the burst"
    );
    running.stop().await;
}

/// A notified event whose expansion fails goes round again once the
/// database accepts it, without waiting for a poll (an hour away here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_expansion_of_a_notified_event_is_retried_without_a_poll() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let running = run_with_hook(
        db.pool.clone(),
        DispatcherConfig {
            poll_interval: Duration::from_secs(3600),
            ..config(&db.tables)
        },
        &receiver,
    );
    running.listening().await;
    sqlx::raw_sql(
        "CREATE SEQUENCE refusals; \
         CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             PERFORM nextval('refusals'); \
             RAISE EXCEPTION 'deliveries refused for the test'; \
         END $$; \
         CREATE TRIGGER refuse BEFORE INSERT ON outbox_deliveries \
             FOR EACH ROW EXECUTE FUNCTION refuse();",
    )
    .execute(&db.pool)
    .await
    .expect("the refusing trigger");
    let id = db.produce(EVENT, None, true).await;
    // The expansion is attempted, and refused (a sequence counts the
    // refusals: it is not rolled back with them).
    assert!(
        eventually_async(WAIT, || async {
            sqlx::query_scalar::<_, bool>("SELECT is_called FROM refusals")
                .fetch_one(&db.pool)
                .await
                .expect("the refusals")
        })
        .await,
        "the expansion reached the trigger"
    );
    assert!(receiver.received().is_empty());
    sqlx::query("DROP TRIGGER refuse ON outbox_deliveries")
        .execute(&db.pool)
        .await
        .expect("drop the trigger");
    assert!(
        receiver.wait_for("/hook", 1, WAIT).await,
        "retried within seconds"
    );
    assert_eq!(receiver.event_ids("/hook"), [id]);
    running.stop().await;
}

/// With the optional index on `created_at`, polls read it rather than the
/// whole outbox, and still find an event written without a NOTIFY among
/// thousands of old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_scan_index_polls_read_only_their_window() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    for _ in 0..2 {
        sqlx::raw_sql(AssertSqlSafe(scan_index_ddl(&db.tables)))
            .execute(&db.pool)
            .await
            .expect("the index (a second time changes nothing)");
    }
    sqlx::query(
        "INSERT INTO outbox (event_name, resource_type, resource_id, event_type, payload, created_at) \
         SELECT $1, 'user', g::text, 'created', '{}', timezone('utc', now()) - interval '2 days' \
         FROM generate_series(1, 20000) AS g",
    )
    .bind(EVENT)
    .execute(&db.pool)
    .await
    .expect("history");
    sqlx::query("ANALYZE outbox")
        .execute(&db.pool)
        .await
        .expect("analyze");
    let index_scans = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'idx_outbox_created_at'",
        )
        .fetch_one(&db.pool)
        .await
        .expect("index statistics")
    };
    let before = index_scans().await;

    let receiver = RecordingReceiver::start().await;
    let running = run_with_hook(
        db.pool.clone(),
        DispatcherConfig {
            start_from: Some(Utc::now() - chrono::Duration::hours(1)),
            ..config(&db.tables)
        },
        &receiver,
    );
    running.listening().await;
    let id = db.produce(EVENT, None, false).await;
    assert!(receiver.wait_for("/hook", 1, WAIT).await);
    assert_eq!(receiver.event_ids("/hook"), [id], "none of the history");
    // Statistics reach the view about a second after the statement.
    assert!(
        eventually_async(Duration::from_secs(20), || async {
            index_scans().await >= before + 3
        })
        .await,
        "polls read the created_at index (scans: {} before, {} now)",
        before,
        index_scans().await
    );
    running.stop().await;
}

/// Expansion is one statement whatever the number of subscribers: an event
/// with 10 000 of them has all its rows moments after its NOTIFY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_subscribers_of_one_event_expand_at_once() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let config = DispatcherConfig {
        poll_interval: Duration::from_secs(60),
        concurrency: 4,
        ..config(&db.tables)
    };
    let dispatcher = Dispatcher::new(db.pool.clone(), config).expect("dispatcher");
    let subscribers = (0..10_000)
        .map(|n| {
            (
                format!("subscriber-{n}"),
                websub_hub::delivery::outbox::WebhookSubscriber::new(
                    None,
                    receiver.url(&format!("/s/{n}")),
                ),
            )
        })
        .collect();
    dispatcher
        .register_webhooks(EVENT, subscribers)
        .expect("register");
    let running = Running::start(dispatcher);
    running.listening().await;
    let started = Instant::now();
    let id = db.produce(EVENT, None, true).await;
    let expanded = eventually_async(Duration::from_secs(5), || async {
        db.delivery_count(id).await == 10_000
    })
    .await;
    println!("10 000 rows in {:?}", started.elapsed());
    assert!(expanded, "{} rows", db.delivery_count(id).await);
    assert!(
        receiver.wait_for_any(Duration::from_secs(5)).await,
        "deliveries began"
    );
    running.stop().await;
}

/// A webhook that answers with a redirect has not received the event: the
/// attempt fails with the status, and the redirect target (which would get
/// the signature and the configured headers) is never contacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_a_failed_attempt_never_followed() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let elsewhere = receiver.url("/elsewhere");
    receiver.answer(
        "/moved",
        Answer::status(307).with_header("location", elsewhere.as_str()),
    );
    let dispatcher = Dispatcher::new(db.pool.clone(), config(&db.tables)).expect("dispatcher");
    dispatcher
        .register_webhooks(EVENT, webhook("moved", None, receiver.url("/moved")))
        .expect("register");
    let running = Running::start(dispatcher);
    let id = db.produce(EVENT, None, true).await;
    let failed = eventually_async(WAIT, || async {
        db.delivery(id, "moved")
            .await
            .is_some_and(|row| row.retry_count > 0)
    })
    .await;
    assert!(failed, "the redirect counts as a failed attempt");
    let row = db.delivery(id, "moved").await.expect("row");
    assert_eq!(row.processed_at, None);
    assert_eq!(
        row.last_error.as_deref(),
        Some("HTTP 307 Temporary Redirect")
    );
    assert!(receiver.received_at("/elsewhere").is_empty());
    running.stop().await;
}

/// Webhook URLs go through the network policy that guards WebSub callbacks:
/// a private address is refused at registration unless allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_webhook_is_refused_unless_private_networks_are_allowed() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let public_only = DispatcherConfig {
        network: NetPolicy::default(),
        ..config(&db.tables)
    };
    let dispatcher = Dispatcher::new(db.pool.clone(), public_only).expect("dispatcher");
    let refused =
        dispatcher.register_webhooks(EVENT, webhook("local", None, receiver.url("/local")));
    assert!(
        matches!(refused, Err(RegistrationError::RefusedUrl { .. })),
        "{refused:?}"
    );
    let allowed = Dispatcher::new(db.pool.clone(), config(&db.tables)).expect("dispatcher");
    allowed
        .register_webhooks(EVENT, webhook("local", None, receiver.url("/local")))
        .expect("allowed when private networks are");
}

/// Producers that write the contract's tables from another language send a
/// bare `NOTIFY channel;`, or one with a payload of their own: it wakes the
/// dispatcher as promptly as the library's own notification naming the
/// event, and the poll is a minute away. A payload that looks like an id but
/// names no event counts as naming none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_without_the_event_id_wakes_the_dispatcher_without_a_poll() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let running = run_listening_with_hook(&db, &receiver).await;
    // The start-up scan is done once the listener is up and a moment has
    // passed; what follows can only be found through the notification.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let foreign_id = Uuid::now_v7().to_string();
    let payloads = ["", "", "orders changed", foreign_id.as_str(), ""];
    for (round, payload) in payloads.into_iter().enumerate() {
        let event = common::TestEvent::named(EVENT);
        let mut tx = db.pool.begin().await.expect("begin");
        db.outbox()
            .message(&event)
            .send(&mut tx)
            .await
            .expect("send");
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(db.tables.default_channel())
            .bind(payload)
            .execute(&mut *tx)
            .await
            .expect("notify");
        tx.commit().await.expect("commit");
        let committed = Instant::now();
        assert!(
            receiver
                .wait_for("/hook", round + 1, Duration::from_secs(3))
                .await,
            "event {round} (payload {payload:?}) waited for a poll"
        );
        let took = committed.elapsed();
        assert!(took < Duration::from_secs(1), "event {round} took {took:?}");
    }
    running.stop().await;
}

/// A bare `NOTIFY` expands the newest events by `created_at`, which is when
/// the producer's transaction began: an event whose transaction stayed open
/// while newer ones were delivered is behind that window when it commits,
/// and the next poll's scan delivers it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_from_a_long_transaction_with_a_bare_notify_is_found_by_the_poll() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let config = DispatcherConfig {
        poll_interval: Duration::from_millis(500),
        ..config(&db.tables)
    };
    let running = run_with_hook(db.pool.clone(), config, &receiver);
    running.listening().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let notify = format!("NOTIFY {}", db.tables.default_channel());
    let outbox = db.outbox();
    async fn send(outbox: &Outbox, tx: &mut sqlx::PgConnection) {
        let event = common::TestEvent::named(EVENT);
        outbox.message(&event).send(tx).await.expect("send");
    }
    let mut long = db.pool.begin().await.expect("begin");
    send(&outbox, &mut long).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    for round in 0..3 {
        let mut tx = db.pool.begin().await.expect("begin");
        send(&outbox, &mut tx).await;
        sqlx::query(AssertSqlSafe(notify.clone()))
            .execute(&mut *tx)
            .await
            .expect("notify");
        tx.commit().await.expect("commit");
        assert!(
            receiver
                .wait_for("/hook", round + 1, Duration::from_secs(3))
                .await,
            "short transaction {round}"
        );
    }
    sqlx::query(AssertSqlSafe(notify))
        .execute(&mut *long)
        .await
        .expect("notify");
    long.commit().await.expect("commit");
    assert!(
        receiver.wait_for("/hook", 4, Duration::from_secs(10)).await,
        "the long transaction's event was never delivered"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        receiver.received_at("/hook").len(),
        4,
        "each event delivered once"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_failing_in_a_row_is_disabled_its_rows_skipped_and_its_attempts_kept() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let path = websub_storetest::scratch::path("webhook-health.db");
    let log: Arc<dyn EventLog> = Arc::new(
        SqliteEventLog::connect(&format!("sqlite:{}", path.display()))
            .await
            .expect("the hub's log"),
    );
    let receiver = RecordingReceiver::start().await;
    receiver.answer("/flaky", Answer::status(500));
    // 3 retries, the last after 400 ms; disabled after two exhaustions.
    let dispatcher = Dispatcher::new(db.pool.clone(), config(&db.tables))
        .expect("dispatcher")
        .with_operations(log.clone(), 2);
    dispatcher
        .register_webhooks(EVENT, webhook("flaky", None, receiver.url("/flaky")))
        .expect("register");
    let endpoints = dispatcher.endpoints().cloned().expect("operated");
    let steered = dispatcher.clone();
    let started = Utc::now() - chrono::Duration::seconds(1);
    let running = Running::start(dispatcher);
    let first = db.produce(EVENT, None, true).await;
    let second = db.produce(EVENT, None, true).await;
    let disabled = eventually_async(WAIT, || async {
        log.endpoints("webhook", 10)
            .await
            .expect("endpoints")
            .iter()
            .any(|record| record.endpoint == "flaky" && record.disabled_at.is_some())
    })
    .await;
    assert!(
        disabled,
        "two exhausted deliveries in a row disable the webhook"
    );
    let attempts = log
        .webhook_attempts(first, "flaky")
        .await
        .expect("attempts");
    assert_eq!(attempts.len(), 4, "{attempts:?}");
    assert!(attempts.iter().all(|attempt| attempt.status == Some(500)));
    assert_eq!(
        attempts[3].error.as_deref(),
        Some("HTTP 500 Internal Server Error")
    );
    assert_eq!(
        log.webhook_attempts(second, "flaky")
            .await
            .expect("attempts")
            .len(),
        4
    );

    // Disabled: a new event's row is closed as skipped, with no attempt.
    let sent = receiver.received_at("/flaky").len();
    let third = db.produce(EVENT, None, true).await;
    let skipped = eventually_async(WAIT, || async {
        db.delivery(third, "flaky")
            .await
            .is_some_and(|row| row.last_error.as_deref() == Some("endpoint disabled"))
    })
    .await;
    assert!(skipped, "the row of a disabled webhook is skipped");
    let row = db.delivery(third, "flaky").await.expect("row");
    assert_eq!(
        (row.retry_count, row.next_attempt_at, row.processed_at),
        (0, None, None)
    );
    assert_eq!(receiver.received_at("/flaky").len(), sent, "nothing sent");
    assert!(
        log.webhook_attempts(third, "flaky")
            .await
            .expect("attempts")
            .is_empty()
    );

    // Listed with their states, newest first.
    let listed = steered
        .webhook_deliveries(
            WebhookFilter {
                subscriber: Some("flaky"),
                ..WebhookFilter::default()
            },
            100,
        )
        .await
        .expect("list");
    let states: Vec<(Uuid, DeliveryState)> =
        listed.iter().map(|row| (row.event_id, row.state)).collect();
    assert_eq!(
        states,
        vec![
            (third, DeliveryState::Skipped),
            (second, DeliveryState::Failed),
            (first, DeliveryState::Failed),
        ]
    );
    assert_eq!(listed[0].event_name, EVENT);
    let failed = steered
        .webhook_deliveries(
            WebhookFilter {
                state: Some(DeliveryState::Failed),
                since: Some(started),
                ..WebhookFilter::default()
            },
            1,
        )
        .await
        .expect("list");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].event_id, second);

    // Enabled and fixed: the next event is delivered, and clears nothing
    // it need not.
    receiver.answer("/flaky", Answer::status(204));
    assert!(endpoints.enable("flaky", Utc::now()).await.expect("enable"));
    let fourth = db.produce(EVENT, None, true).await;
    let delivered = eventually_async(WAIT, || async {
        db.delivery(fourth, "flaky")
            .await
            .is_some_and(|row| row.processed_at.is_some())
    })
    .await;
    assert!(delivered, "an enabled webhook is delivered to again");
    // Attempts are kept in the hub's log after the row is written.
    let attempt_kept = eventually_async(WAIT, || async {
        !log.webhook_attempts(fourth, "flaky")
            .await
            .expect("attempts")
            .is_empty()
    })
    .await;
    assert!(attempt_kept, "the delivering attempt is kept");
    let kept = log
        .webhook_attempts(fourth, "flaky")
        .await
        .expect("attempts");
    assert_eq!(kept.len(), 1);
    assert_eq!(
        (kept[0].status, kept[0].error.as_deref()),
        (Some(204), None)
    );
    // The row skipped while disabled stays skipped: only a resend sends it.
    let still = db.delivery(third, "flaky").await.expect("row");
    assert_eq!(
        (still.retry_count, still.next_attempt_at, still.processed_at),
        (0, None, None)
    );
    assert_eq!(
        receiver.received_at("/flaky").len(),
        sent + 1,
        "only the new event was sent"
    );

    // Sent again: the rows of every event since the start are re-opened and
    // delivered; the history keeps each round's attempts.
    let reopened = steered
        .resend("flaky", Some(started), None, 100)
        .await
        .expect("resend");
    assert_eq!(reopened, 4);
    let all_delivered = eventually_async(WAIT, || async {
        let mut delivered = 0;
        for id in [first, second, third, fourth] {
            if db
                .delivery(id, "flaky")
                .await
                .is_some_and(|row| row.processed_at.is_some())
            {
                delivered += 1;
            }
        }
        delivered == 4
    })
    .await;
    assert!(all_delivered, "every re-opened row is delivered");
    // Attempts are kept in the hub's log after the rows are written.
    let history_kept = eventually_async(WAIT, || async {
        log.webhook_attempts(first, "flaky")
            .await
            .expect("attempts")
            .len()
            >= 5
    })
    .await;
    assert!(history_kept, "the delivering attempt joins the history");
    let history = log
        .webhook_attempts(first, "flaky")
        .await
        .expect("attempts");
    assert_eq!(
        history.len(),
        5,
        "four failures, then the delivery: {history:?}"
    );
    assert_eq!(history[4].status, Some(204));
    let one = steered
        .resend("flaky", None, Some(second), 100)
        .await
        .expect("resend one");
    assert_eq!(one, 1);
    running.stop().await;
}

/// A `429` with `Retry-After` pauses every delivery to that webhook, the
/// retried one and the ones after it, for as long as it asks (longer than
/// the retry policy's own wait here), then all of them are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhooks_retry_after_pauses_all_its_deliveries() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer_in_turn(
        "/hook",
        [
            Answer::status(429).with_header("Retry-After", "2"),
            Answer::status(204),
        ],
    );
    let running = run_listening_with_hook(&db, &receiver).await;
    let first = db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/hook", 1, WAIT).await);
    // The events after it are committed once the hub has taken the 429 in
    // (its row counts the failure): one committed while the answer is on
    // its way back would rightly go out at once.
    let answered = eventually_async(WAIT, || async {
        db.delivery(first, "hook")
            .await
            .is_some_and(|row| row.retry_count == 1)
    })
    .await;
    assert!(answered, "the 429 was never recorded");
    let mut later = Vec::new();
    for _ in 0..3 {
        later.push(db.produce(EVENT, None, true).await);
    }
    assert!(
        receiver.wait_for("/hook", 5, WAIT).await,
        "the 429 and then the four deliveries"
    );
    let attempts = receiver.received_at("/hook");
    assert_eq!(attempts.len(), 5, "{attempts:?}");
    for attempt in &attempts[1..] {
        let waited = attempt.at - attempts[0].at;
        assert!(
            waited >= Duration::from_millis(1_900),
            "an attempt went out {waited:?} after the 429, inside its Retry-After"
        );
    }
    let retried = db.delivery(first, "hook").await.expect("row");
    assert_eq!(retried.retry_count, 1, "the 429 counts as one failure");
    // The receiver has the last delivery before the hub has its answer
    // recorded: wait for the rows rather than read them at once.
    let later_recorded = eventually_async(WAIT, || async {
        let mut recorded = 0;
        for &id in &later {
            if db
                .delivery(id, "hook")
                .await
                .is_some_and(|row| row.processed_at.is_some())
            {
                recorded += 1;
            }
        }
        recorded == later.len()
    })
    .await;
    assert!(
        later_recorded,
        "the later deliveries are recorded delivered"
    );
    for id in later {
        let row = db.delivery(id, "hook").await.expect("row");
        assert_eq!(row.retry_count, 0, "a paused delivery spends no retry");
    }
    running.stop().await;
}

/// A webhook's in-flight limit adapts: above the first 8 while it answers
/// quickly, down to a few once its answers slow from 5 ms to 400 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhooks_limit_rises_while_it_is_quick_and_falls_when_it_slows() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer("/hook", Answer::status(204).after(Duration::from_millis(5)));
    for _ in 0..600 {
        db.produce(EVENT, None, false).await;
    }
    let config = DispatcherConfig {
        // Four waves of claims held: the lane is never short of rows.
        visibility_timeout: Duration::from_secs(20),
        ..config(&db.tables)
    };
    let running = run_with_hook(db.pool.clone(), config, &receiver);
    assert!(receiver.wait_for("/hook", 250, WAIT).await);
    receiver.answer(
        "/hook",
        Answer::status(204).after(Duration::from_millis(400)),
    );
    let slowed_at = Instant::now();
    let quick = receiver.most_at_once_where(|received| received.at < slowed_at);
    eprintln!("quick webhook: at most {quick} in flight");
    assert!(
        quick > 8,
        "a webhook answering quickly earns more than the first 8 ({quick})"
    );
    // Each round of slow answers cuts the limit; a few rounds on, what is
    // in flight is the slowed limit.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let measured_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let slowed = receiver.most_at_once_where(|received| received.at >= measured_from);
    eprintln!("slowed webhook: at most {slowed} in flight");
    assert!(
        (1..=4).contains(&slowed),
        "a webhook that slowed down gets fewer at once ({slowed}, was {quick})"
    );
    running.stop().await;
}
