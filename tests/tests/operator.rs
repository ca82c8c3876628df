//! End to end: the operator API (topics, subscriptions, failed deliveries
//! and their retry, one delivery with its attempts) and the discovery answer
//! of topics the hub publishes.

use std::time::Duration;

use serde_json::Value;
use websub_tests::{
    Answer, Backend, INTERNAL_KEY, TestHub, TestSubscriber, http_client, test_config,
};

const WAIT: Duration = Duration::from_secs(10);

async fn hub_on(backend: Backend) -> Option<TestHub> {
    let mut config = test_config(backend).await?;
    config.internal_api_key = Some(INTERNAL_KEY.to_owned());
    // Exhausted after two quick attempts.
    config.delivery.retry.max_retries = 1;
    config.delivery.retry.max_backoff = Duration::from_millis(50);
    Some(TestHub::start(config).await)
}

/// A GET or POST to the operator API with the internal key; status and JSON.
async fn operator(
    hub: &TestHub,
    method: reqwest::Method,
    path_and_query: &str,
    body: Option<&str>,
) -> (u16, Value) {
    let url = format!("{}api/v1/operator/{path_and_query}", hub.url);
    let mut request = http_client()
        .request(method, url)
        .header("X-Internal-API-Key", INTERNAL_KEY);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.expect("operator request");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, json)
}

/// A fat ping of JSON content, accepted.
async fn publish(hub: &TestHub, topic: &str, body: &str) {
    let (status, answer) = hub
        .fat_ping(topic, "application/json", body.to_owned())
        .await;
    assert_eq!(status, 202, "{answer}");
}

async fn operator_api_lists_and_retries(backend: Backend) {
    let Some(hub) = hub_on(backend).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let busy = "http://127.0.0.1:9/topics/busy";
    let quiet = "http://127.0.0.1:9/topics/quiet";
    hub.subscribe(
        busy,
        &subscriber.callback("one"),
        &[("hub.secret", "s3cret")],
    )
    .await;
    hub.subscribe(busy, &subscriber.callback("two"), &[]).await;
    hub.subscribe(quiet, &subscriber.callback("three"), &[])
        .await;

    let (status, topics) = operator(&hub, reqwest::Method::GET, "topics", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        topics,
        serde_json::json!([
            {"topic": busy, "subscribers": 2},
            {"topic": quiet, "subscribers": 1},
        ])
    );

    let query = serde_urlencoded::to_string([("topic", busy)]).unwrap_or_default();
    let (status, listed) = operator(
        &hub,
        reqwest::Method::GET,
        &format!("subscriptions?{query}"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let listed = listed.as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["callback"], subscriber.callback("one"));
    assert_eq!(listed[0]["has_secret"], true);
    assert!(
        listed[0].get("secret").is_none(),
        "secrets never leave the hub"
    );
    assert_eq!(listed[1]["has_secret"], false);
    assert!(listed[1]["expires_at"].is_string());

    // "two" fails every attempt until told otherwise.
    subscriber.answer_delivery("two", Answer::status(500));
    publish(&hub, busy, "{\"n\":1}").await;
    assert_eq!(
        subscriber.wait_for_deliveries("one", 1, WAIT).await.len(),
        1
    );
    let failed_query = format!("deliveries/failed?{query}");
    let mut failed = Value::Null;
    for _ in 0..200 {
        let (status, listed) = operator(&hub, reqwest::Method::GET, &failed_query, None).await;
        assert_eq!(status, 200);
        if listed.as_array().is_some_and(|rows| !rows.is_empty()) {
            failed = listed;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let rows = failed.as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 1, "one exhausted record: {failed}");
    assert_eq!(rows[0]["subscriber"], subscriber.callback("two"));
    assert_eq!(rows[0]["topic"], busy);
    assert_eq!(rows[0]["attempts"], 2);
    assert!(
        rows[0]["last_error"]
            .as_str()
            .is_some_and(|error| error.contains("500")),
        "the status is kept: {}",
        rows[0]
    );
    assert_eq!(subscriber.attempts("two"), 2);

    subscriber.answer_delivery("two", Answer::status(204));
    let (status, answer) = operator(
        &hub,
        reqwest::Method::POST,
        "deliveries/retry",
        Some(&format!("{{\"topic\": \"{busy}\"}}")),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer, serde_json::json!({"retried": 1}));
    assert_eq!(
        subscriber.wait_for_deliveries("two", 1, WAIT).await.len(),
        1
    );
    let (_, failed) = operator(&hub, reqwest::Method::GET, &failed_query, None).await;
    assert_eq!(failed, serde_json::json!([]));
    // Nothing left to retry, asked with no body and with `null`.
    for body in [None, Some("null")] {
        let (status, answer) =
            operator(&hub, reqwest::Method::POST, "deliveries/retry", body).await;
        assert_eq!(status, 200, "{body:?}");
        assert_eq!(answer, serde_json::json!({"retried": 0}));
    }
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_api_lists_and_retries_on_sqlite() {
    operator_api_lists_and_retries(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_api_lists_and_retries_on_postgres() {
    operator_api_lists_and_retries(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_api_refuses_bad_requests() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let url = format!("{}api/v1/operator/topics", hub.url);
    let response = http_client().get(&url).send().await.expect("GET");
    assert_eq!(response.status().as_u16(), 401);
    let response = http_client()
        .get(&url)
        .header(
            "X-Internal-API-Key",
            "not-the-key-but-just-as-long-as-it-is!!!",
        )
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status().as_u16(), 401);
    // Header names are case-insensitive; the reason names it either way.
    assert!(
        response
            .text()
            .await
            .unwrap_or_default()
            .to_ascii_lowercase()
            .contains("x-internal-api-key")
    );

    for (method, path, body, reason) in [
        (reqwest::Method::GET, "subscriptions", None, "topic"),
        (
            reqwest::Method::GET,
            "deliveries/failed?limit=0",
            None,
            "limit",
        ),
        (
            reqwest::Method::GET,
            "deliveries/failed?limit=many",
            None,
            "limit",
        ),
        (
            reqwest::Method::POST,
            "deliveries/retry",
            Some("{\"topics\": []}"),
            "JSON",
        ),
        (
            reqwest::Method::POST,
            "deliveries/retry",
            Some("[1"),
            "JSON",
        ),
    ] {
        let (status, answer) = operator(&hub, method, path, body).await;
        assert_eq!(status, 400, "{path} {body:?}: {answer}");
        assert!(
            answer.as_str().is_some_and(|text| text.contains(reason)),
            "{path} {body:?}: {answer}"
        );
    }
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hub_topics_answer_discovery_with_their_latest_content() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let topic = format!("{}topics/orders.created", hub.url);
    let link = format!("<{}>; rel=\"hub\", <{topic}>; rel=\"self\"", hub.url);

    let response = http_client().get(&topic).send().await.expect("GET topic");
    assert_eq!(response.status().as_u16(), 204);
    assert_eq!(
        response.headers().get("link").and_then(|v| v.to_str().ok()),
        Some(link.as_str())
    );

    publish(&hub, &topic, "{\"order\":1}").await;
    publish(&hub, &topic, "{\"order\":2}").await;
    let response = http_client().get(&topic).send().await.expect("GET topic");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers().get("link").and_then(|v| v.to_str().ok()),
        Some(link.as_str())
    );
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    assert_eq!(response.text().await.unwrap_or_default(), "{\"order\":2}");
    hub.stop().await;
}

/// A delivery that failed once and then went through shows both attempts,
/// oldest first, with their statuses, errors and the answers' beginnings;
/// a bad or unknown delivery is refused with a reason.
async fn a_delivery_shows_its_attempts(backend: Backend) {
    let Some(mut config) = test_config(backend).await else {
        return;
    };
    config.internal_api_key = Some(INTERNAL_KEY.to_owned());
    config.delivery.retry.max_backoff = Duration::from_millis(50);
    let hub = TestHub::start(config).await;
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/history";
    let callback = subscriber.callback("history");
    hub.subscribe(topic, &callback, &[]).await;
    subscriber.answer_deliveries_in_turn(
        "history",
        [
            Answer::status(503).with_body("busy, come back later"),
            Answer::status(200).with_body("thanks"),
        ],
    );
    publish(&hub, topic, "{\"n\":1}").await;
    assert!(
        subscriber
            .wait_until(WAIT, |s| !s.deliveries_to("history").is_empty())
            .await,
        "delivered, after the 503"
    );
    let event_id = subscriber.deliveries_to("history")[0]
        .header("x-websub-event-id")
        .expect("an event id")
        .to_owned();
    let query = serde_urlencoded::to_string([("event_id", &event_id), ("subscriber", &callback)])
        .unwrap_or_default();
    let deadline = std::time::Instant::now() + WAIT;
    let shown = loop {
        let (status, shown) = operator(
            &hub,
            reqwest::Method::GET,
            &format!("delivery?{query}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{shown}");
        if shown["state"] == "delivered" {
            break shown;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never delivered: {shown}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(shown["event_id"], event_id.as_str());
    assert_eq!(shown["subscriber"], callback.as_str());
    assert_eq!(shown["retry_count"], 1);
    let attempts = shown["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{shown}");
    assert_eq!(attempts[0]["status"], 503);
    assert_eq!(attempts[0]["error"], "HTTP 503 Service Unavailable");
    assert_eq!(attempts[0]["response"], "busy, come back later");
    assert_eq!(attempts[1]["status"], 200);
    assert_eq!(attempts[1]["error"], Value::Null);
    assert_eq!(attempts[1]["response"], "thanks");
    assert!(attempts[0]["at"].as_str() <= attempts[1]["at"].as_str());
    assert!(
        attempts[0]["duration_ms"]
            .as_f64()
            .is_some_and(|ms| ms >= 0.0)
    );

    for (query, status) in [
        ("subscriber=x".to_owned(), 400),
        ("event_id=not-a-uuid&subscriber=x".to_owned(), 400),
        (format!("event_id={event_id}"), 400),
        (
            format!("event_id={}&subscriber=x", uuid::Uuid::now_v7()),
            404,
        ),
    ] {
        let (answered, reason) = operator(
            &hub,
            reqwest::Method::GET,
            &format!("delivery?{query}"),
            None,
        )
        .await;
        assert_eq!(answered, status, "{query}: {reason}");
        assert!(
            reason.as_str().is_some_and(|text| !text.is_empty()),
            "{query}: a reason"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_shows_its_attempts_on_sqlite() {
    a_delivery_shows_its_attempts(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_shows_its_attempts_on_postgres() {
    a_delivery_shows_its_attempts(Backend::Postgres).await;
}
