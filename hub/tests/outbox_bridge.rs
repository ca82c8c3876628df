//! Outbox feeds against real PostgreSQL: the WebSub bridge records each
//! outbox event whose topic has WebSub subscribers as a hub event (the
//! envelope, on its rendered topic, under the envelope's id) in the hub's
//! event log, once however often it is handed over; the hub's own
//! dispatcher delivers it to a WebSub subscriber on 127.0.0.1 with `Link`,
//! `X-Hub-Signature` and the envelope's id; an event nobody subscribes to
//! gets no delivery row; and a feed's webhooks file is watched and reloaded
//! (a broken one changes nothing).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::Utc;
use common::{Db, EVENT, eventually, eventually_async};
use tokio_util::sync::CancellationToken;
use url::Url;
use uuid::Uuid;
use websub_hub::clock::SystemClock;
use websub_hub::config::DeliveryPolicy;
use websub_hub::delivery::net::NetPolicy;
use websub_hub::delivery::outbox::{Envelope, Handler, MESSAGING_SIGNATURE_HEADER};
use websub_hub::delivery::websub::Distributor;
use websub_hub::intake::feed::{
    BEFORE_FIRST_SUBSCRIPTION, DEFAULT_TOPIC_TEMPLATE, Feed, FeedConfig, FeedError,
    SubscribedTopics, TopicTemplate, WebSubBridge,
};
use websub_hub::signature::{EVENT_ID_HEADER, HUB_SIGNATURE_HEADER, verify};
use websub_hub::storage::events::postgres::PostgresEventLog;
use websub_hub::storage::events::sqlite::SqliteEventLog;
use websub_hub::storage::events::{EventIntake, EventLog, LoggedEvent};
use websub_store::memory::MemoryStore;
use websub_store::{Subscription, SubscriptionStore};
use websub_tests::RecordingReceiver;

const WAIT: Duration = Duration::from_secs(10);

/// Another event name, which nothing subscribes to.
const UNSUBSCRIBED: &str = "billing.invoice.paid";

fn hub_url() -> Url {
    Url::parse("https://hub.example/").expect("url")
}

/// The hub's event log, in a fresh database of its own.
async fn event_log() -> Option<Arc<PostgresEventLog>> {
    let url = websub_storetest::servers::fresh_postgres_url().await?;
    Some(Arc::new(
        PostgresEventLog::connect(&url)
            .await
            .expect("open the hub's event log"),
    ))
}

/// Events recorded in the hub's log and not yet expanded (nothing expands
/// them in these tests unless a hub dispatcher runs).
async fn recorded(events: &PostgresEventLog) -> Vec<LoggedEvent> {
    events.unexpanded(100).await.expect("read the event log")
}

fn counter() -> (Arc<AtomicUsize>, Arc<dyn Fn() + Send + Sync>) {
    let count = Arc::new(AtomicUsize::new(0));
    let wakes = count.clone();
    (
        count,
        Arc::new(move || {
            wakes.fetch_add(1, Ordering::SeqCst);
        }),
    )
}

fn feed_config(db: &Db) -> FeedConfig {
    FeedConfig {
        poll_interval: Some("200ms".to_owned()),
        delivery_max_backoff: Some("400ms".to_owned()),
        allow_private_network: Some(true),
        ..FeedConfig::new(db.url.clone())
    }
}

/// The topic the default template gives `event_name`.
fn topic_of(event_name: &str) -> String {
    format!("https://hub.example/topics/{event_name}")
}

/// A store holding a subscription of a callback that is never called to
/// each of `topics`.
async fn store_with(topics: &[String]) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    for topic in topics {
        store
            .save(&Subscription::new(topic, "http://127.0.0.1:9/unused"))
            .await
            .expect("subscribe");
    }
    store
}

/// The hub's WebSub scheduler over `events` and `store`, polling slowly (a
/// wake-up or the expander finds new events).
fn distributor(events: Arc<dyn EventLog>, store: Arc<dyn SubscriptionStore>) -> Distributor {
    let policy = DeliveryPolicy::default();
    let client = websub_hub::delivery::pool::HostClients::new(
        &NetPolicy {
            allow_private_network: true,
        },
        policy.timeout,
        &websub_hub::delivery::client::Trust::system(),
        websub_hub::delivery::pool::IdleLimits::of_budget(64, 8),
    )
    .expect("delivery clients");
    Distributor::new(
        events,
        store,
        client,
        hub_url().to_string(),
        policy,
        Duration::from_secs(60),
        Arc::new(SystemClock),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_records_each_event_as_a_hub_event_on_its_topic() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let Some(events) = event_log().await else {
        return;
    };
    let (wakes, wake) = counter();
    let config = FeedConfig {
        topic_template: "{public_url}apps/{app}/{event_name}".to_owned(),
        ..feed_config(&db)
    };
    let store = store_with(&[
        format!("https://hub.example/apps/ush/{EVENT}"),
        format!("https://hub.example/apps//{EVENT}"),
    ])
    .await;
    let shutdown = CancellationToken::new();
    let feed = Feed::start(
        config,
        events.clone(),
        wake,
        SubscribedTopics::new(store),
        &hub_url(),
        shutdown.clone(),
    )
    .await
    .expect("the feed starts");
    assert!(
        eventually(WAIT, || feed.dispatcher().is_listening()).await,
        "listening"
    );

    let with_app = db.produce(EVENT, Some("ush"), true).await;
    let without_app = db.produce(EVENT, None, true).await;
    // Nobody subscribes to this app's topic.
    let other_app = db.produce(EVENT, Some("financer"), true).await;
    let both = eventually_async(WAIT, || async { recorded(&events).await.len() == 2 }).await;
    let hub_events = recorded(&events).await;
    assert!(both, "recorded {} hub events", hub_events.len());
    for hub_event in &hub_events {
        assert_eq!(hub_event.content_type, "application/json");
        let envelope: Envelope = serde_json::from_slice(&hub_event.body).expect("an envelope");
        let expected_topic = if envelope.event_id == with_app {
            assert_eq!(envelope.app.as_deref(), Some("ush"));
            format!("https://hub.example/apps/ush/{EVENT}")
        } else {
            assert_eq!(envelope.event_id, without_app);
            assert_eq!(envelope.app, None);
            format!("https://hub.example/apps//{EVENT}")
        };
        assert_eq!(hub_event.topic, expected_topic);
        assert_eq!(hub_event.id, envelope.event_id, "recorded under its own id");
        assert_eq!(envelope.event_name, EVENT);
        assert_eq!(envelope.data["name"], EVENT);
        // Byte for byte what a webhook would get.
        assert_eq!(hub_event.body.as_ref(), envelope.to_json().as_slice());
    }
    // The bridge wakes the hub after its recording commits.
    assert!(
        eventually(WAIT, || wakes.load(Ordering::SeqCst) >= 2).await,
        "the hub was woken"
    );
    for id in [with_app, without_app] {
        let processed = eventually_async(WAIT, || async {
            db.delivery(id, "websub-hub")
                .await
                .is_some_and(|row| row.processed_at.is_some())
        })
        .await;
        assert!(processed, "the bridge's outbox row is processed");
    }
    assert_eq!(db.delivery_count(other_app).await, 0);
    assert_eq!(recorded(&events).await.len(), 2);
    shutdown.cancel();
    feed.stopped().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_whose_topic_has_no_websub_subscriber_gets_no_delivery_row() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let Some(events) = event_log().await else {
        return;
    };
    let (_, wake) = counter();
    let store = store_with(&[topic_of(EVENT)]).await;
    let shutdown = CancellationToken::new();
    let feed = Feed::start(
        feed_config(&db),
        events.clone(),
        wake,
        SubscribedTopics::new(store),
        &hub_url(),
        shutdown.clone(),
    )
    .await
    .expect("the feed starts");
    assert!(
        eventually(WAIT, || feed.dispatcher().is_listening()).await,
        "listening"
    );
    let ignored = db.produce(UNSUBSCRIBED, None, true).await;
    let wanted = db.produce(EVENT, None, true).await;
    let processed = eventually_async(WAIT, || async {
        db.delivery(wanted, "websub-hub")
            .await
            .is_some_and(|row| row.processed_at.is_some())
    })
    .await;
    assert!(processed, "the subscribed topic's event is bridged");
    // Long enough for several polls, each of them scanning recent events.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(db.delivery_count(ignored).await, 0, "no row for the bridge");
    let hub_events = recorded(&events).await;
    assert_eq!(hub_events.len(), 1);
    assert_eq!(hub_events[0].id, wanted);
    shutdown.cancel();
    feed.stopped().await;
}

/// A subscription saved after the feed started: an event committed after
/// it reaches it, even one committed before the feed heard of the change
/// (expanded meanwhile with the old list), while an event older than the
/// subscription by more than [`BEFORE_FIRST_SUBSCRIPTION`] is not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_made_after_the_feed_started_gets_the_events_committed_after_it() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let Some(events) = event_log().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let store = Arc::new(MemoryStore::new());
    let topics = SubscribedTopics::new(store.clone());
    let hub = distributor(events.clone(), store.clone());
    let shutdown = CancellationToken::new();
    let hub_task = tokio::spawn(hub.clone().run(shutdown.clone()));
    let waker = hub.clone();
    let feed = Feed::start(
        feed_config(&db),
        events.clone(),
        Arc::new(move || waker.wake()),
        topics.clone(),
        &hub_url(),
        shutdown.clone(),
    )
    .await
    .expect("the feed starts");
    assert!(
        eventually(WAIT, || feed.dispatcher().is_listening()).await,
        "listening"
    );

    let before = db.produce(EVENT, None, true).await;
    // Long past when the subscription is made.
    db.age(before, BEFORE_FIRST_SUBSCRIPTION * 2).await;
    let unsubscribed_yet = db.produce(EVENT, None, true).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        db.delivery_count(unsubscribed_yet).await,
        0,
        "nobody wanted it yet"
    );

    let topic = topic_of(EVENT);
    store
        .save(&Subscription::new(&topic, receiver.url("/cb").to_string()))
        .await
        .expect("subscribe");
    // Committed after the save, but expanded before the feed is told.
    let in_the_gap = db.produce(EVENT, None, true).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        db.delivery_count(in_the_gap).await,
        0,
        "expanded with the old list"
    );
    topics.changed(&topic);
    let after = db.produce(EVENT, None, true).await;

    // The one made just before the subscription is within the margin.
    let expected = [unsubscribed_yet, in_the_gap, after];
    assert!(
        receiver.wait_for("/cb", expected.len(), WAIT).await,
        "delivered: {:?}",
        receiver.event_ids("/cb")
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut delivered = receiver.event_ids("/cb");
    delivered.sort_unstable();
    let mut wanted = expected.to_vec();
    wanted.sort_unstable();
    assert_eq!(delivered, wanted);
    assert_eq!(
        db.delivery_count(before).await,
        0,
        "the topic's past is not sent"
    );
    shutdown.cancel();
    feed.stopped().await;
    hub_task.await.expect("the hub dispatcher");
}

/// A bridge call made again after one whose recording committed (the
/// outbox gave up waiting, or could not mark the row processed) records
/// nothing new: one hub event, one delivery, under the envelope's id.
async fn a_bridged_event_handed_over_twice_is_delivered_once(events: Arc<dyn EventLog>) {
    websub_hub::delivery::net::install_crypto_provider();
    let receiver = RecordingReceiver::start().await;
    let topic = topic_of(EVENT);
    let store = Arc::new(MemoryStore::new());
    store
        .save(&Subscription::new(&topic, receiver.url("/cb").to_string()))
        .await
        .expect("subscribe");
    let hub = distributor(events.clone(), store);
    let waker = hub.clone();
    let bridge = WebSubBridge::new(
        events.clone(),
        Arc::new(move || waker.wake()),
        hub_url(),
        TopicTemplate::parse(DEFAULT_TOPIC_TEMPLATE).expect("the default template"),
    );
    let envelope = Envelope {
        event_id: Uuid::new_v4(),
        event_name: EVENT.to_owned(),
        app: None,
        occurred_at: Utc::now(),
        resource_type: "user".to_owned(),
        resource_id: "42".to_owned(),
        event_type: "authenticated".to_owned(),
        data: serde_json::json!({"user": 42}),
    };
    bridge.handle(&envelope).await.expect("the first call");
    bridge.handle(&envelope).await.expect("the call made again");
    let (first, second) = tokio::join!(bridge.handle(&envelope), bridge.handle(&envelope));
    first.and(second).expect("calls at once");
    let unexpanded = events.unexpanded(100).await.expect("read the log");
    assert_eq!(unexpanded.len(), 1, "one event");
    assert_eq!(unexpanded[0].id, envelope.event_id);

    let shutdown = CancellationToken::new();
    let hub_task = tokio::spawn(hub.run(shutdown.clone()));
    assert!(receiver.wait_for("/cb", 1, WAIT).await, "delivered");
    bridge
        .handle(&envelope)
        .await
        .expect("a call after delivery");
    // Stopping drains the dispatcher: a second delivery would be in by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.cancel();
    hub_task.await.expect("the hub dispatcher");
    let received = receiver.received_at("/cb");
    assert_eq!(received.len(), 1, "one delivery");
    let expected_id = envelope.event_id.to_string();
    assert_eq!(
        received[0].header(EVENT_ID_HEADER),
        Some(expected_id.as_str())
    );
    assert_eq!(received[0].envelope(), envelope);
    let records = events
        .deliveries(envelope.event_id)
        .await
        .expect("read the records");
    assert_eq!(records.len(), 1, "one delivery record");
    assert!(
        events
            .unexpanded(100)
            .await
            .expect("read the log")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_event_handed_over_twice_is_delivered_once_on_postgres() {
    let Some(events) = event_log().await else {
        return;
    };
    a_bridged_event_handed_over_twice_is_delivered_once(events).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_event_handed_over_twice_is_delivered_once_on_sqlite() {
    let path = websub_storetest::scratch::path("bridge.db");
    let events = SqliteEventLog::connect(&format!("sqlite:{}", path.display()))
        .await
        .expect("open the SQLite event log");
    a_bridged_event_handed_over_twice_is_delivered_once(Arc::new(events)).await;
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_limited_to_some_event_names_forwards_only_those() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let Some(events) = event_log().await else {
        return;
    };
    let (_, wake) = counter();
    let config = FeedConfig {
        events: Some(vec![EVENT.to_owned()]),
        subscriber: "hub-eu".to_owned(),
        ..feed_config(&db)
    };
    // Listed, an event name is forwarded with or without subscribers, and
    // only listed ones are.
    let store = store_with(&[topic_of(UNSUBSCRIBED)]).await;
    let shutdown = CancellationToken::new();
    let feed = Feed::start(
        config,
        events.clone(),
        wake,
        SubscribedTopics::new(store),
        &hub_url(),
        shutdown.clone(),
    )
    .await
    .expect("the feed starts");
    let ignored = db.produce(UNSUBSCRIBED, None, true).await;
    let wanted = db.produce(EVENT, None, true).await;
    assert!(eventually_async(WAIT, || async { recorded(&events).await.len() == 1 }).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let hub_events = recorded(&events).await;
    assert_eq!(hub_events.len(), 1);
    assert_eq!(
        hub_events[0].topic,
        format!("https://hub.example/topics/{EVENT}")
    );
    assert!(db.delivery(wanted, "hub-eu").await.is_some());
    assert_eq!(db.delivery_count(ignored).await, 0);
    shutdown.cancel();
    feed.stopped().await;
}

/// The whole path: outbox row → feed → hub event log → the hub's dispatcher
/// → a WebSub subscriber of the topic, signed, with Link headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_event_reaches_a_websub_subscriber_of_its_topic() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let Some(events) = event_log().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let topic = topic_of(EVENT);
    let store = Arc::new(MemoryStore::new());
    let mut subscription = Subscription::new(&topic, receiver.url("/cb?id=7").to_string());
    subscription.secret = Some("subscriber secret".to_owned());
    store.save(&subscription).await.expect("subscribe");
    let hub = distributor(events.clone(), store.clone());
    let shutdown = CancellationToken::new();
    let hub_task = tokio::spawn(hub.clone().run(shutdown.clone()));
    let waker = hub.clone();
    let feed = Feed::start(
        feed_config(&db),
        events.clone(),
        Arc::new(move || waker.wake()),
        SubscribedTopics::new(store),
        &hub_url(),
        shutdown.clone(),
    )
    .await
    .expect("the feed starts");

    let id = db.produce(EVENT, Some("ush"), true).await;
    assert!(
        receiver.wait_for("/cb", 1, WAIT).await,
        "delivered over WebSub"
    );
    let delivery = &receiver.received_at("/cb")[0];
    let envelope = delivery.envelope();
    assert_eq!(envelope.event_id, id);
    assert_eq!(envelope.app.as_deref(), Some("ush"));
    assert_eq!(delivery.header("content-type"), Some("application/json"));
    assert_eq!(
        delivery.header("link"),
        Some(format!("<https://hub.example/>; rel=\"hub\", <{topic}>; rel=\"self\"").as_str())
    );
    assert!(verify(
        b"subscriber secret",
        &delivery.body,
        delivery.header(HUB_SIGNATURE_HEADER)
    ));
    assert!(
        delivery.header(MESSAGING_SIGNATURE_HEADER).is_none(),
        "a WebSub delivery carries the hub's signature only"
    );
    assert_eq!(
        delivery.header(EVENT_ID_HEADER),
        Some(id.to_string().as_str()),
        "the event id is the envelope's"
    );
    shutdown.cancel();
    feed.stopped().await;
    hub_task.await.expect("the hub dispatcher");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhooks_file_is_watched_and_a_broken_one_changes_nothing() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let Some(events) = event_log().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let path = websub_storetest::scratch::path("webhooks.toml");
    let file_for = |url: &Url| {
        format!(
            "[[webhook]]\nevent = \"{EVENT}\"\nsubscriber = \"users\"\napp = \"ush\"\nurl = \"{url}\"\n"
        )
    };
    std::fs::write(&path, file_for(&receiver.url("/a"))).expect("write the file");
    let secret = "webhook signing secret";
    let config = FeedConfig {
        webhooks_file: Some(path.clone()),
        signing_secret: Some(secret.to_owned()),
        webhook_headers: [("X-Internal-API-Key".to_owned(), "k".repeat(32))].into(),
        ..feed_config(&db)
    };
    let (_, wake) = counter();
    let store = store_with(&[topic_of(EVENT)]).await;
    let shutdown = CancellationToken::new();
    let feed = Feed::start(
        config,
        events.clone(),
        wake,
        SubscribedTopics::new(store),
        &hub_url(),
        shutdown.clone(),
    )
    .await
    .expect("the feed starts");

    let first = db.produce(EVENT, Some("ush"), true).await;
    let other_app = db.produce(EVENT, Some("financer"), true).await;
    assert!(receiver.wait_for("/a", 1, WAIT).await);
    let delivery = &receiver.received_at("/a")[0];
    assert_eq!(delivery.event_id(), first);
    assert!(verify(
        secret.as_bytes(),
        &delivery.body,
        delivery.header(MESSAGING_SIGNATURE_HEADER)
    ));
    assert_eq!(
        delivery.header("x-internal-api-key"),
        Some("k".repeat(32).as_str())
    );

    // Changed on disk: picked up by the watcher.
    std::fs::write(&path, file_for(&receiver.url("/b"))).expect("rewrite the file");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second = db.produce(EVENT, None, true).await;
    assert!(
        receiver.wait_for("/b", 1, WAIT).await,
        "the new URL is used"
    );
    assert_eq!(receiver.event_ids("/b"), [second]);

    // Broken: reported, and nothing changes.
    std::fs::write(&path, "[[webhook]]\nevent = ").expect("break the file");
    assert!(matches!(feed.reload(), Err(FeedError::Config(_))));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let third = db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/b", 2, WAIT).await, "still delivered");
    assert_eq!(receiver.event_ids("/b"), [second, third]);
    assert_eq!(receiver.event_ids("/a"), [first]);
    assert!(
        db.delivery(other_app, "users").await.is_none(),
        "app scoping"
    );
    // The bridge got everything meanwhile.
    assert!(eventually_async(WAIT, || async { recorded(&events).await.len() == 4 }).await);
    shutdown.cancel();
    feed.stopped().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_refuses_to_start_without_its_tables() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let Some(events) = event_log().await else {
        return;
    };
    let (_, wake) = counter();
    let config = FeedConfig {
        outbox_table: "elsewhere.outbox".to_owned(),
        ..feed_config(&db)
    };
    let started = Feed::start(
        config,
        events,
        wake,
        SubscribedTopics::new(Arc::new(MemoryStore::new())),
        &hub_url(),
        CancellationToken::new(),
    )
    .await;
    match started {
        Err(FeedError::Database { tables, .. }) => assert!(tables.contains("elsewhere.outbox")),
        other => panic!("expected a database error, got {other:?}"),
    }
}
