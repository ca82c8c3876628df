//! The fault suite against the real `websubd` binary, on SQLite and on
//! PostgreSQL: whatever the hub acknowledged survives `kill -9` at the worst
//! moment, and past its bounds it sheds load with a clear answer instead of
//! growing. Each case checks that the fault landed where it should (the
//! kill came while the work was in flight), so that it cannot pass by
//! missing it.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::Method;
use axum::routing::get;
use common::{Websubd, free_port, scratch_dir};
use futures::StreamExt;
use websub_store::{Subscription, SubscriptionStore};
use websub_tests::{Answer, Route, TestSubscriber, http_client, serve_on_loopback};

/// The arguments every case shares: callbacks on loopback, short timeouts
/// so that a dead process's claims expire within seconds.
fn arguments<'a>(database_url: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut arguments = vec![
        "--database-url",
        database_url,
        "--allow-private-network",
        "--delivery-timeout",
        "2s",
        "--verification-timeout",
        "3s",
        "--poll-interval",
        "200ms",
    ];
    arguments.extend_from_slice(extra);
    arguments
}

async fn open_store(database_url: &str) -> Arc<dyn SubscriptionStore> {
    websub_hub::server::open_store(database_url)
        .await
        .expect("open the store websubd uses")
}

async fn post_form(hub: &str, form: &[(&str, &str)]) -> reqwest::Response {
    // One client for every request: building one per request would cost
    // more than the hub's answer.
    static CLIENT: std::sync::LazyLock<reqwest::Client> = std::sync::LazyLock::new(http_client);
    CLIENT
        .post(hub)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(form).expect("form"))
        .send()
        .await
        .expect("POST to the hub")
}

/// Asks `hub` to subscribe `count` callbacks of `subscriber` (named
/// `prefix0`, `prefix1`, …) to `topic`, each request answered 202.
async fn subscribe_each(
    hub: &str,
    subscriber: &TestSubscriber,
    topic: &str,
    prefix: &str,
    count: usize,
) {
    for index in 0..count {
        let callback = subscriber.callback(&format!("{prefix}{index}"));
        let answer = post_form(
            hub,
            &[
                ("hub.mode", "subscribe"),
                ("hub.topic", topic),
                ("hub.callback", &callback),
            ],
        )
        .await;
        assert_eq!(answer.status().as_u16(), 202);
    }
}

/// The metrics once they contain `sample`, or after 10 s: an outcome is
/// counted after the work it counts is written, so after what the test
/// waited for.
async fn metrics_with(hub: &Websubd, sample: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = hub.metrics_text().await;
        if metrics.contains(sample) || tokio::time::Instant::now() >= deadline {
            return metrics;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn kill_9_while_a_thin_ping_is_fetched_loses_nothing(database_url: String) {
    let dir = scratch_dir("ping");
    let subscriber = TestSubscriber::start().await;
    // The first fetch hangs, so the kill lands while it is in flight; the
    // next one answers.
    let fetches = Arc::new(AtomicUsize::new(0));
    let counted = fetches.clone();
    let publisher = serve_on_loopback(Router::new().route(
        "/feed",
        get(move || {
            let counted = counted.clone();
            async move {
                if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                    tokio::time::sleep(Duration::from_secs(120)).await;
                }
                (
                    [("content-type", "text/plain")],
                    "the content after the kill",
                )
            }
        }),
    ))
    .await;
    let topic = format!("http://{}/feed", publisher.address);
    let callback = subscriber.callback("ping");
    open_store(&database_url)
        .await
        .save(
            &Subscription::new(&topic, &callback)
                .with_lease(chrono::Duration::days(1), chrono::Utc::now()),
        )
        .await
        .expect("save the subscription");

    let args = arguments(&database_url, &[]);
    let first = Websubd::spawn(&dir, free_port(), &args).ready().await;
    let answer = post_form(&first.url, &[("hub.mode", "publish"), ("hub.url", &topic)]).await;
    assert_eq!(answer.status().as_u16(), 202);
    tokio::time::timeout(Duration::from_secs(30), async {
        while fetches.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the hub starts fetching the topic");
    first.kill_9();
    assert!(
        subscriber.deliveries_to("ping").is_empty(),
        "delivered before the kill; the test proves nothing"
    );

    let second = Websubd::spawn(&dir, free_port(), &args).ready().await;
    let delivered = subscriber
        .wait_for_deliveries("ping", 1, Duration::from_secs(60))
        .await;
    assert_eq!(
        delivered.first().map(|delivery| delivery.body.as_ref()),
        Some(b"the content after the kill".as_slice()),
        "the ping acknowledged before the kill was never honoured"
    );
    // The fetch is counted after its content is recorded, which may be
    // after the delivery arrived.
    let recorded = "websub_topic_fetches_total{outcome=\"recorded\"} 1";
    let metrics = metrics_with(&second, recorded).await;
    assert!(metrics.contains(recorded), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_a_thin_ping_is_fetched_loses_nothing_on_sqlite() {
    let dir = scratch_dir("ping-sqlite");
    kill_9_while_a_thin_ping_is_fetched_loses_nothing(format!(
        "sqlite:{}",
        dir.join("hub.db").display()
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_a_thin_ping_is_fetched_loses_nothing_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    kill_9_while_a_thin_ping_is_fetched_loses_nothing(url).await;
}

async fn kill_9_with_verifications_pending_loses_none(database_url: String) {
    const REQUESTS: usize = 40;
    let dir = scratch_dir("verifications");
    let subscriber = TestSubscriber::start().await;
    // Slow answers, few at once: most requests are still waiting, and some
    // in flight, when the hub dies.
    subscriber.receiver().answer(
        Route::method(Method::GET),
        Answer::echo().after(Duration::from_millis(500)),
    );
    let topic = "http://127.0.0.1:9/topics/verified";
    let args = arguments(&database_url, &["--verification-concurrency", "4"]);
    let first = Websubd::spawn(&dir, free_port(), &args).ready().await;
    subscribe_each(&first.url, &subscriber, topic, "v", REQUESTS).await;
    subscriber
        .wait_for_verifications(4, Duration::from_secs(30))
        .await;
    first.kill_9();
    let store = open_store(&database_url).await;
    let before = store.list_by_topic(topic).await.expect("list").len();
    assert!(
        before < REQUESTS,
        "every verification finished before the kill; the test proves nothing"
    );

    let second = Websubd::spawn(&dir, free_port(), &args).ready().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut held = before;
    while held < REQUESTS && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        held = store.list_by_topic(topic).await.expect("list").len();
    }
    assert_eq!(
        held, REQUESTS,
        "{before} subscribed before the kill, {held} of {REQUESTS} after the restart"
    );
    // A verification is counted after its subscription is saved.
    let verified = "websub_verifications_total{mode=\"subscribe\",outcome=\"verified\"}";
    let metrics = metrics_with(&second, verified).await;
    assert!(metrics.contains(verified), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_verifications_pending_loses_none_on_sqlite() {
    let dir = scratch_dir("verifications-sqlite");
    kill_9_with_verifications_pending_loses_none(format!(
        "sqlite:{}",
        dir.join("hub.db").display()
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_verifications_pending_loses_none_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    kill_9_with_verifications_pending_loses_none(url).await;
}

async fn a_subscribe_flood_is_shed_and_nothing_accepted_is_lost(database_url: String) {
    const REQUESTS: usize = 3000;
    const BOUND: &str = "200";
    let dir = scratch_dir("flood");
    let subscriber = TestSubscriber::start().await;
    subscriber.receiver().answer(
        Route::method(Method::GET),
        Answer::echo().after(Duration::from_millis(200)),
    );
    let topic = "http://127.0.0.1:9/topics/flood";
    let args = arguments(
        &database_url,
        &[
            "--verification-concurrency",
            "8",
            "--max-pending-verifications",
            BOUND,
        ],
    );
    let hub = Websubd::spawn(&dir, free_port(), &args).ready().await;
    let resident_before = hub.resident_kib();

    let answers = futures::stream::iter(0..REQUESTS)
        .map(|index| {
            let callback = subscriber.callback(&format!("f{index}"));
            let url = hub.url.clone();
            async move {
                let answer = post_form(
                    &url,
                    &[
                        ("hub.mode", "subscribe"),
                        ("hub.topic", topic),
                        ("hub.callback", &callback),
                    ],
                )
                .await;
                let retry_after = answer.headers().get("retry-after").cloned();
                (callback, answer.status().as_u16(), retry_after)
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    let accepted: HashSet<String> = answers
        .iter()
        .filter(|(_, status, _)| *status == 202)
        .map(|(callback, _, _)| callback.clone())
        .collect();
    let shed = answers
        .iter()
        .filter(|(_, status, retry_after)| *status == 503 && retry_after.is_some())
        .count();
    assert_eq!(
        accepted.len() + shed,
        REQUESTS,
        "every answer is a 202 or a 503 with Retry-After"
    );
    assert!(shed > 0, "the flood never reached the bound");
    let resident_after = hub.resident_kib();
    eprintln!(
        "{} accepted, {shed} shed; resident {resident_before} KiB before, {resident_after} KiB after",
        accepted.len()
    );
    assert!(
        resident_after < resident_before + 100 * 1024,
        "the flood grew websubd from {resident_before} KiB to {resident_after} KiB"
    );

    let store = open_store(&database_url).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let held = loop {
        let held: HashSet<String> = store
            .list_by_topic(topic)
            .await
            .expect("list")
            .into_iter()
            .map(|subscription| subscription.callback)
            .collect();
        if held.len() >= accepted.len() || tokio::time::Instant::now() >= deadline {
            break held;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let lost: Vec<&String> = accepted.difference(&held).collect();
    assert!(lost.is_empty(), "accepted but never subscribed: {lost:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_flood_is_shed_and_nothing_accepted_is_lost_on_sqlite() {
    let dir = scratch_dir("flood-sqlite");
    a_subscribe_flood_is_shed_and_nothing_accepted_is_lost(format!(
        "sqlite:{}",
        dir.join("hub.db").display()
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_flood_is_shed_and_nothing_accepted_is_lost_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    a_subscribe_flood_is_shed_and_nothing_accepted_is_lost(url).await;
}

/// On SQLite, which only one process uses, a restarted websubd takes over
/// the verifications its killed predecessor had in flight at once, not
/// after their claims go stale (three verification timeouts and 5 s: 14 s
/// here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_sqlite_takes_over_verifications_in_flight_at_once() {
    const REQUESTS: usize = 4;
    let dir = scratch_dir("verifications-takeover");
    let database_url = format!("sqlite:{}", dir.join("hub.db").display());
    let subscriber = TestSubscriber::start().await;
    subscriber.receiver().answer(
        Route::method(Method::GET),
        Answer::echo().after(Duration::from_millis(1500)),
    );
    let topic = "http://127.0.0.1:9/topics/taken-over";
    let args = arguments(&database_url, &[]);
    let port = free_port();
    let first = Websubd::spawn(&dir, port, &args).ready().await;
    subscribe_each(&first.url, &subscriber, topic, "t", REQUESTS).await;
    subscriber
        .wait_for_verifications(REQUESTS, Duration::from_secs(30))
        .await;
    first.kill_9();
    let store = open_store(&database_url).await;
    assert_eq!(
        store.list_by_topic(topic).await.expect("list").len(),
        0,
        "killed while every verification was in flight"
    );
    let restarted = std::time::Instant::now();
    let _second = Websubd::spawn(&dir, port, &args).ready().await;
    let deadline = restarted + Duration::from_secs(30);
    while store.list_by_topic(topic).await.expect("list").len() < REQUESTS {
        assert!(std::time::Instant::now() < deadline, "not taken over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = restarted.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the verifications were taken over at once: {took:?}"
    );
}
