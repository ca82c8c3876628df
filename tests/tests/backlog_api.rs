//! End to end: what becomes of accepted work that is not done at once. A
//! verification the callback could not answer is tried again; one that
//! failed for good is listed, with its last error, to its requester and to
//! the operator; a thin ping whose content is over the size limit is
//! recorded as a failed fetch, not dropped; a ping for a topic nobody
//! subscribes to is not kept at all.

use std::time::Duration;

use axum::http::Method;
use chrono::TimeDelta;
use serde_json::Value;
use websub_hub::web::auth::issue_token;
use websub_tests::{
    Answer, Backend, INTERNAL_KEY, Route, TestHub, TestPublisher, TestSubscriber, http_client,
    test_config,
};

const WAIT: Duration = Duration::from_secs(15);
const TOKEN_KEY: &str = "the-user-token-signing-key";

async fn hub_on(backend: Backend) -> Option<TestHub> {
    let mut config = test_config(backend).await?;
    config.internal_api_key = Some(INTERNAL_KEY.to_owned());
    config.user_token_key = Some(TOKEN_KEY.to_owned());
    config.verification.timeout = Duration::from_secs(2);
    config.verification.attempts = 3;
    config.verification.retry_wait = Duration::from_millis(100);
    config.max_content_bytes = 100;
    Some(TestHub::start(config).await)
}

async fn get_json(url: String, header: (&str, &str)) -> (u16, Value) {
    let response = http_client()
        .get(url)
        .header(header.0, header.1)
        .send()
        .await
        .expect("GET");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn operator(hub: &TestHub, path_and_query: &str) -> Value {
    let (status, body) = get_json(
        format!("{}api/v1/operator/{path_and_query}", hub.url),
        ("X-Internal-API-Key", INTERNAL_KEY),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Polls the operator listing at `path_and_query` until `done` holds.
async fn wait_for_listing(
    hub: &TestHub,
    path_and_query: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let listed = operator(hub, path_and_query).await;
        if done(&listed) || tokio::time::Instant::now() >= deadline {
            return listed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn entries(listed: &Value) -> &[Value] {
    listed.as_array().map(Vec::as_slice).unwrap_or_default()
}

async fn unanswered_verifications_are_retried_and_failures_are_listed(backend: Backend) {
    let Some(hub) = hub_on(backend).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/backlog";
    // Failing on the hub's side of the wire twice, then answering.
    let flaky = subscriber.callback("flaky");
    subscriber.receiver().answer_in_turn(
        Route::get("/cb/flaky"),
        [Answer::status(503), Answer::status(502), Answer::echo()],
    );
    // A refusal: final at once.
    let refusing = subscriber.callback("refusing");
    subscriber.answer_verification("refusing", Answer::status(404));
    // Nobody there: every attempt fails to connect.
    let absent = "http://127.0.0.1:9/cb/absent";
    let token = issue_token(TOKEN_KEY, "alice", None, TimeDelta::minutes(10));
    for callback in [flaky.as_str(), refusing.as_str(), absent] {
        let response = http_client()
            .post(&hub.url)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("authorization", format!("Bearer {token}"))
            .body(
                serde_urlencoded::to_string([
                    ("hub.mode", "subscribe"),
                    ("hub.topic", topic),
                    ("hub.callback", callback),
                ])
                .expect("form"),
            )
            .send()
            .await
            .expect("subscribe");
        assert_eq!(response.status().as_u16(), 202);
    }

    assert!(
        hub.wait_for_subscription(topic, &flaky, true).await,
        "the callback that failed twice is subscribed on its third attempt"
    );
    assert_eq!(
        subscriber
            .receiver()
            .count_where(|received| received.method == Method::GET && received.path == "/cb/flaky"),
        3
    );

    let failed = wait_for_listing(&hub, "verifications?state=failed", |listed| {
        entries(listed).len() == 2
    })
    .await;
    let by_callback = |callback: &str| {
        entries(&failed)
            .iter()
            .find(|entry| entry["callback"] == callback)
            .cloned()
            .unwrap_or_else(|| panic!("{callback} is not listed as failed: {failed}"))
    };
    let refused = by_callback(&refusing);
    assert_eq!(
        refused["attempts"], 1,
        "a refusal is not retried: {refused}"
    );
    assert!(
        refused["last_error"]
            .as_str()
            .is_some_and(|error| error.contains("404")),
        "{refused}"
    );
    let unreachable = by_callback(absent);
    assert_eq!(unreachable["attempts"], 3, "{unreachable}");
    assert_eq!(unreachable["state"], "failed");
    assert_eq!(unreachable["owner"], "alice");
    assert!(
        unreachable["last_error"]
            .as_str()
            .is_some_and(|error| error.contains("connect")),
        "{unreachable}"
    );
    // The subscription is saved before its verification leaves the
    // backlog (two stores, two writes): the last one settles just after.
    let pending = wait_for_listing(&hub, "verifications?state=pending", |listed| {
        entries(listed).is_empty()
    })
    .await;
    assert!(
        entries(&pending).is_empty(),
        "nothing is left waiting: {pending}"
    );

    // The requester sees their own; someone else sees none of them.
    let (status, own) = get_json(
        format!("{}api/v1/verifications", hub.url),
        ("authorization", &format!("Bearer {token}")),
    )
    .await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(entries(&own).len(), 2, "{own}");
    assert!(entries(&own).iter().all(|entry| entry["state"] == "failed"));
    let stranger = issue_token(TOKEN_KEY, "bob", None, TimeDelta::minutes(10));
    let (status, theirs) = get_json(
        format!("{}api/v1/verifications", hub.url),
        ("authorization", &format!("Bearer {stranger}")),
    )
    .await;
    assert_eq!(status, 200);
    assert!(entries(&theirs).is_empty(), "{theirs}");
    let (status, _) = get_json(
        format!("{}api/v1/operator/verifications?state=done", hub.url),
        ("X-Internal-API-Key", INTERNAL_KEY),
    )
    .await;
    assert_eq!(status, 400, "an unknown state is named as bad input");
    hub.stop().await;
}

#[tokio::test]
async fn unanswered_verifications_are_retried_and_failures_are_listed_on_sqlite() {
    unanswered_verifications_are_retried_and_failures_are_listed(Backend::Sqlite).await;
}

#[tokio::test]
async fn unanswered_verifications_are_retried_and_failures_are_listed_on_postgres() {
    unanswered_verifications_are_retried_and_failures_are_listed(Backend::Postgres).await;
}

async fn an_oversized_topic_is_a_failed_fetch(backend: Backend) {
    let Some(hub) = hub_on(backend).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let publisher = TestPublisher::start().await;
    let topic = publisher.topic_url("large");
    publisher.set_topic("large", "text/plain", "x".repeat(1000), None);
    hub.subscribe(&topic, &subscriber.callback("large"), &[])
        .await;

    let (status, _) = hub.publish(&[&topic]).await;
    assert_eq!(status, 202);
    let failed = wait_for_listing(&hub, "fetches?state=failed", |listed| {
        !entries(listed).is_empty()
    })
    .await;
    let entry = entries(&failed)
        .first()
        .unwrap_or_else(|| panic!("the oversized fetch is not listed: {failed}"));
    assert_eq!(entry["topic"], topic.as_str());
    assert_eq!(entry["attempts"], 1, "size is final, not retried: {entry}");
    assert!(
        entry["last_error"]
            .as_str()
            .is_some_and(|error| error.contains("larger than 100 bytes")),
        "{entry}"
    );
    assert!(subscriber.deliveries_to("large").is_empty());
    // A fat ping over the limit is refused at once.
    let (status, reason) = hub.fat_ping(&topic, "text/plain", "y".repeat(1000)).await;
    assert_eq!(status, 413, "{reason}");
    hub.stop().await;
}

#[tokio::test]
async fn an_oversized_topic_is_a_failed_fetch_on_sqlite() {
    an_oversized_topic_is_a_failed_fetch(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_oversized_topic_is_a_failed_fetch_on_postgres() {
    an_oversized_topic_is_a_failed_fetch(Backend::Postgres).await;
}

/// Pinged with no fetcher running, so that what the ping wrote stays to be
/// read: only the subscribed topic is kept, and pings cannot grow the
/// backlog past one row per subscribed topic.
#[tokio::test]
async fn a_ping_for_a_topic_nobody_subscribes_to_is_not_kept() {
    let Some(config) = test_config(Backend::Sqlite).await else {
        return;
    };
    let events = websub_hub::storage::events::connect(&config.database_url)
        .await
        .expect("event log");
    let backlog = websub_hub::storage::backlog::connect(&config.database_url)
        .await
        .expect("backlog");
    let store = std::sync::Arc::new(websub_store::memory::MemoryStore::new());
    let subscribed = "http://127.0.0.1:9/topics/subscribed";
    websub_store::SubscriptionStore::save(
        &*store,
        &websub_store::Subscription::new(subscribed, "http://127.0.0.1:9/cb/one")
            .with_lease(chrono::Duration::days(1), chrono::Utc::now()),
    )
    .await
    .expect("save");
    let hub = websub_hub::server::Hub::assemble(
        config,
        store,
        events,
        backlog.clone(),
        std::sync::Arc::new(websub_hub::clock::SystemClock),
    )
    .expect("assemble");
    hub.intake()
        .ping(
            &[
                subscribed.to_owned(),
                "http://127.0.0.1:9/topics/nobodys".to_owned(),
            ],
            None,
        )
        .await
        .expect("ping");
    let kept: Vec<String> = backlog
        .fetches(websub_hub::storage::backlog::Listing::default(), 10)
        .await
        .expect("list")
        .into_iter()
        .map(|fetch| fetch.topic)
        .collect();
    assert_eq!(kept, [subscribed]);
}
