//! End to end: what an operator steers through the API. A callback that
//! keeps failing is disabled after failures in a row, its new deliveries are
//! skipped (and listed so), an operator enables it again and replays what it
//! missed; an event is redelivered to every subscription; the subscriber API
//! lists a user's own deliveries and nobody else's.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::TimeDelta;
use serde_json::{Value, json};
use websub_hub::web::auth::issue_token;
use websub_tests::{
    Answer, Backend, INTERNAL_KEY, TestHub, TestSubscriber, http_client, test_config,
};

const WAIT: Duration = Duration::from_secs(15);

/// Exhausted after two quick attempts; disabled after two exhaustions.
async fn hub_on(backend: Backend) -> Option<TestHub> {
    let mut config = test_config(backend).await?;
    config.internal_api_key = Some(INTERNAL_KEY.to_owned());
    config.delivery.retry.max_retries = 1;
    config.delivery.retry.max_backoff = Duration::from_millis(50);
    config.delivery.disable_endpoint_after = 2;
    // No breaker: these deliveries run out of retries at once.
    config.delivery.breaker.open_after = 0;
    config.retention = Some(Duration::from_secs(3600));
    Some(TestHub::start(config).await)
}

async fn operator(
    hub: &TestHub,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = http_client()
        .request(method, format!("{}api/v1/operator/{path}", hub.url))
        .header("X-Internal-API-Key", INTERNAL_KEY);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("operator request");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn get(hub: &TestHub, path: &str) -> Value {
    let (status, body) = operator(hub, reqwest::Method::GET, path, None).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// Polls `path` until `done` holds, for at most [`WAIT`].
async fn poll(hub: &TestHub, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let body = get(hub, path).await;
        if done(&body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {body} at GET {path}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn query(pairs: &[(&str, &str)]) -> String {
    serde_urlencoded::to_string(pairs).unwrap_or_default()
}

fn rows(value: &Value) -> Vec<Value> {
    value.as_array().cloned().unwrap_or_default()
}

async fn publish(hub: &TestHub, topic: &str, n: u32) {
    let (status, answer) = hub
        .fat_ping(topic, "application/json", format!("{{\"n\":{n}}}"))
        .await;
    assert_eq!(status, 202, "{answer}");
}

fn event_ids(deliveries: &[websub_tests::Received]) -> BTreeSet<String> {
    deliveries
        .iter()
        .filter_map(|received| received.header("x-websub-event-id").map(str::to_owned))
        .collect()
}

async fn a_failing_endpoint_is_disabled_skipped_enabled_and_replayed(backend: Backend) {
    let Some(hub) = hub_on(backend).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/steered";
    let (bad, good) = (subscriber.callback("bad"), subscriber.callback("good"));
    hub.subscribe(topic, &bad, &[]).await;
    hub.subscribe(topic, &good, &[]).await;
    let started = chrono::Utc::now() - chrono::Duration::seconds(1);

    subscriber.answer_delivery("bad", Answer::status(500));
    for n in 1..=2 {
        publish(&hub, topic, n).await;
    }
    let of_bad = query(&[("subscriber", &bad)]);
    let endpoints = poll(&hub, "endpoints", |listed| {
        rows(listed)
            .iter()
            .any(|row| row["endpoint"] == bad && row["disabled_at"].is_string())
    })
    .await;
    let row = rows(&endpoints)
        .into_iter()
        .find(|row| row["endpoint"] == bad)
        .unwrap_or_default();
    assert_eq!(row["failures"], 2, "{row}");
    assert_eq!(row["channel"], "websub", "{row}");
    assert!(
        row["disabled_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("2 deliveries")),
        "{row}"
    );
    let failed = get(&hub, &format!("deliveries?{of_bad}&state=failed")).await;
    assert_eq!(rows(&failed).len(), 2, "{failed}");

    // Disabled: the next event is recorded as skipped, and never sent.
    let attempts_before = subscriber.attempts("bad");
    publish(&hub, topic, 3).await;
    assert_eq!(
        subscriber.wait_for_deliveries("good", 3, WAIT).await.len(),
        3
    );
    let skipped = poll(
        &hub,
        &format!("deliveries?{of_bad}&state=skipped"),
        |listed| rows(listed).len() == 1,
    )
    .await;
    assert_eq!(skipped[0]["last_error"], "endpoint disabled", "{skipped}");
    assert_eq!(
        subscriber.attempts("bad"),
        attempts_before,
        "nothing sent to a disabled endpoint"
    );
    let (status, refused) = operator(
        &hub,
        reqwest::Method::POST,
        "redeliver",
        Some(json!({"event_id": skipped[0]["event_id"], "subscriber": bad})),
    )
    .await;
    assert_eq!(status, 409, "{refused}");

    // Fixed, enabled, replayed: every event arrives, under its own id.
    subscriber.answer_delivery("bad", Answer::status(204));
    let (status, enabled) = operator(
        &hub,
        reqwest::Method::POST,
        "endpoints/enable",
        Some(json!({"endpoint": bad})),
    )
    .await;
    assert_eq!(
        (status, &enabled["changed"]),
        (200, &json!(true)),
        "{enabled}"
    );
    assert!(
        rows(&get(&hub, "endpoints").await)
            .iter()
            .all(|row| row["endpoint"] != bad)
    );
    let since = started.to_rfc3339();
    let (status, replayed) = operator(
        &hub,
        reqwest::Method::POST,
        "replay",
        Some(json!({"topic": topic, "subscriber": bad, "since": since})),
    )
    .await;
    assert_eq!(status, 200, "{replayed}");
    assert_eq!(replayed["replayed"], 3, "{replayed}");
    assert_eq!(replayed["resume_since"], Value::Null);
    let arrived = subscriber.wait_for_deliveries("bad", 3, WAIT).await;
    let originals: BTreeSet<String> =
        rows(&get(&hub, &format!("deliveries?{of_bad}&state=failed")).await)
            .iter()
            .chain(rows(&skipped).iter())
            .filter_map(|row| row["event_id"].as_str().map(str::to_owned))
            .collect();
    assert_eq!(
        event_ids(&arrived),
        originals,
        "a replay carries the originals' ids"
    );

    // Each record keeps its round: the failed original and its delivered
    // redelivery.
    let first = rows(&failed)[1]["event_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let rounds = poll(
        &hub,
        &format!("deliveries?{of_bad}&{}", query(&[("event_id", &first)])),
        |listed| rows(listed).iter().any(|row| row["state"] == "delivered"),
    )
    .await;
    let states: Vec<(&str, bool)> = rows(&rounds)
        .iter()
        .map(|row| {
            (
                row["state"].as_str().unwrap_or_default(),
                row["original_id"].is_string(),
            )
        })
        .map(|(state, copy)| {
            (
                if state == "delivered" {
                    "delivered"
                } else {
                    "failed"
                },
                copy,
            )
        })
        .collect();
    assert_eq!(
        states,
        vec![("delivered", true), ("failed", false)],
        "{rounds}"
    );
    let (status, shown) = operator(
        &hub,
        reqwest::Method::GET,
        &format!(
            "delivery?{}",
            query(&[
                (
                    "event_id",
                    rows(&rounds)[0]["event_id"].as_str().unwrap_or_default()
                ),
                ("subscriber", &bad)
            ])
        ),
        None,
    )
    .await;
    assert_eq!(
        (status, &shown["state"]),
        (200, &json!("delivered")),
        "{shown}"
    );
    assert_eq!(
        shown["attempts"].as_array().map(Vec::len),
        Some(1),
        "{shown}"
    );

    // Redelivered to every subscription: a new record each.
    let (status, redelivered) = operator(
        &hub,
        reqwest::Method::POST,
        "redeliver",
        Some(json!({"event_id": first})),
    )
    .await;
    assert_eq!(status, 200, "{redelivered}");
    assert_eq!(redelivered["event_id"], first.as_str());
    assert_eq!(redelivered["subscribers"].as_array().map(Vec::len), Some(2));
    let again = subscriber.wait_for_deliveries("good", 4, WAIT).await;
    assert_eq!(
        again
            .last()
            .and_then(|received| received.header("x-websub-event-id")),
        Some(first.as_str())
    );

    // Operators disable by hand, too.
    let (status, disabled) = operator(
        &hub,
        reqwest::Method::POST,
        "endpoints/disable",
        Some(json!({"endpoint": good, "reason": "maintenance"})),
    )
    .await;
    assert_eq!(
        (status, &disabled["changed"]),
        (200, &json!(true)),
        "{disabled}"
    );
    let listed = get(&hub, "endpoints").await;
    assert!(
        rows(&listed)
            .iter()
            .any(|row| row["endpoint"] == good && row["disabled_reason"] == "maintenance"),
        "{listed}"
    );
    // Enabled only once the callback confirms its subscription.
    subscriber.answer_verification("good", Answer::status(404));
    let probe = json!({"endpoint": good, "probe": true});
    let (status, refused) = operator(
        &hub,
        reqwest::Method::POST,
        "endpoints/enable",
        Some(probe.clone()),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused
            .as_str()
            .is_some_and(|reason| reason.contains("stays disabled")),
        "{refused}"
    );
    subscriber.answer_verification("good", Answer::echo());
    let verified_before = subscriber.verifications().len();
    let (status, enabled) =
        operator(&hub, reqwest::Method::POST, "endpoints/enable", Some(probe)).await;
    assert_eq!(
        (status, &enabled["changed"]),
        (200, &json!(true)),
        "{enabled}"
    );
    let probed = subscriber.verifications();
    assert_eq!(probed.len(), verified_before + 1);
    assert_eq!(
        probed.last().and_then(|probe| probe.param("hub.mode")),
        Some("subscribe")
    );
    assert_eq!(
        probed.last().and_then(|probe| probe.param("hub.topic")),
        Some(topic)
    );
    hub.stop().await;
}

async fn bad_requests_are_refused_with_a_reason(backend: Backend) {
    let Some(hub) = hub_on(backend).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/refusals";
    let callback = subscriber.callback("one");
    hub.subscribe(topic, &callback, &[]).await;
    let cases: Vec<(reqwest::Method, &str, Option<Value>, u16, &str)> = vec![
        (
            reqwest::Method::GET,
            "deliveries?state=lost",
            None,
            400,
            "state must be one of",
        ),
        (
            reqwest::Method::GET,
            "deliveries?since=yesterday",
            None,
            400,
            "RFC 3339",
        ),
        (
            reqwest::Method::GET,
            "deliveries?event_id=42",
            None,
            400,
            "not a UUID",
        ),
        (
            reqwest::Method::GET,
            "deliveries?limit=0",
            None,
            400,
            "limit",
        ),
        (
            reqwest::Method::POST,
            "redeliver",
            Some(json!({"event_id": uuid::Uuid::now_v7()})),
            404,
            "no event",
        ),
        (
            reqwest::Method::POST,
            "redeliver",
            Some(json!({"id": 1})),
            400,
            "expected a JSON object",
        ),
        (
            reqwest::Method::POST,
            "replay",
            Some(json!({"topic": topic, "subscriber": callback, "since": "2000-01-01T00:00:00Z"})),
            410,
            "past the hub's retention",
        ),
        (
            reqwest::Method::POST,
            "replay",
            Some(
                json!({"topic": topic, "subscriber": callback, "since": chrono::Utc::now().to_rfc3339(), "limit": 10001}),
            ),
            400,
            "limit must be from 1 to 10000",
        ),
        (
            reqwest::Method::POST,
            "replay",
            Some(
                json!({"topic": topic, "subscriber": "http://127.0.0.1:9/nobody", "since": chrono::Utc::now().to_rfc3339()}),
            ),
            404,
            "has no subscription",
        ),
        (
            reqwest::Method::POST,
            "endpoints/disable",
            Some(json!({"endpoint": " "})),
            400,
            "endpoint must name",
        ),
    ];
    for (method, path, body, status, reason) in cases {
        let (got, answer) = operator(&hub, method.clone(), path, body).await;
        assert_eq!(got, status, "{method} {path}: {answer}");
        assert!(
            answer.as_str().is_some_and(|text| text.contains(reason)),
            "{method} {path}: {answer:?} should say {reason:?}"
        );
    }
    hub.stop().await;
}

const TOKEN_KEY: &str = "the-user-token-signing-key";

/// Subscribes `callback` to `topic` as `user`, and waits until it holds.
async fn subscribe_as(hub: &TestHub, user: &str, topic: &str, callback: &str) {
    let token = issue_token(TOKEN_KEY, user, None, TimeDelta::minutes(10));
    let response = http_client()
        .post(&hub.url)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/x-www-form-urlencoded")
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
    assert!(hub.wait_for_subscription(topic, callback, true).await);
}

async fn own_deliveries(hub: &TestHub, user: &str, query: &str) -> (u16, Value) {
    let token = issue_token(TOKEN_KEY, user, None, TimeDelta::minutes(10));
    let response = http_client()
        .get(format!("{}api/v1/deliveries?{query}", hub.url))
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
        .expect("GET own deliveries");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn subscribers_see_their_own_deliveries_only(backend: Backend) {
    let Some(mut config) = test_config(backend).await else {
        return;
    };
    config.internal_api_key = Some(INTERNAL_KEY.to_owned());
    config.user_token_key = Some(TOKEN_KEY.to_owned());
    let hub = TestHub::start(config).await;
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/owned";
    let (alices, bobs) = (subscriber.callback("alice"), subscriber.callback("bob"));
    subscribe_as(&hub, "alice", topic, &alices).await;
    subscribe_as(&hub, "bob", topic, &bobs).await;
    publish(&hub, topic, 1).await;
    subscriber.wait_for_deliveries("alice", 1, WAIT).await;
    subscriber.wait_for_deliveries("bob", 1, WAIT).await;

    let deadline = tokio::time::Instant::now() + WAIT;
    let listed = loop {
        let (status, listed) = own_deliveries(&hub, "alice", "").await;
        assert_eq!(status, 200, "{listed}");
        if rows(&listed)
            .first()
            .is_some_and(|row| row["state"] == "delivered")
        {
            break listed;
        }
        assert!(tokio::time::Instant::now() < deadline, "{listed}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(rows(&listed).len(), 1, "{listed}");
    assert_eq!(listed[0]["subscriber"], alices.as_str());
    assert_eq!(listed[0]["topic"], topic);
    let (_, filtered) = own_deliveries(&hub, "alice", &query(&[("callback", &bobs)])).await;
    assert_eq!(filtered, json!([]), "another user's callback shows nothing");
    let (_, pending) = own_deliveries(&hub, "alice", "state=pending").await;
    assert_eq!(pending, json!([]));
    let (status, refused) = own_deliveries(&hub, "alice", "state=lost").await;
    assert_eq!(status, 400, "{refused}");
    let (status, _) = own_deliveries(&hub, "carol", "").await;
    assert_eq!(status, 200, "a user without subscriptions has none");
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_deliveries_on_sqlite() {
    subscribers_see_their_own_deliveries_only(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_deliveries_on_postgres() {
    subscribers_see_their_own_deliveries_only(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_health_and_replay_on_sqlite() {
    a_failing_endpoint_is_disabled_skipped_enabled_and_replayed(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_health_and_replay_on_postgres() {
    a_failing_endpoint_is_disabled_skipped_enabled_and_replayed(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_on_sqlite() {
    bad_requests_are_refused_with_a_reason(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_on_postgres() {
    bad_requests_are_refused_with_a_reason(Backend::Postgres).await;
}
