//! End to end: the subscription quota and user tokens in the hub, against
//! the fake subscriptions service and real PostgreSQL, and the subscriber
//! API (own subscriptions with delivery health, removal, usage).

use std::sync::Arc;
use std::time::Duration;

use chrono::TimeDelta;
use serde_json::Value;
use websub_hub::intake::quota::Quota;
use websub_hub::intake::quota::fake::FakeQuotaServer;
use websub_hub::web::auth::issue_token;
use websub_tests::{
    Answer, Backend, INTERNAL_KEY, RecordingReceiver, TestHub, TestSubscriber, http_client,
    test_config,
};

const WAIT: Duration = Duration::from_secs(10);
const TOKEN_KEY: &str = "the-user-token-signing-key";
const QUOTA_TYPE: &str = "websub_subscriptions";

fn token(user: &str) -> String {
    issue_token(TOKEN_KEY, user, None, TimeDelta::minutes(10))
}

/// A config for a hub enforcing the quota `service` serves (PostgreSQL).
async fn quota_config(service: &FakeQuotaServer) -> Option<websub_hub::HubConfig> {
    let mut config = test_config(Backend::Postgres).await?;
    config.internal_api_key = Some(INTERNAL_KEY.to_owned());
    config.user_token_key = Some(TOKEN_KEY.to_owned());
    config.quota_url = Some(service.url());
    config.quota_timeout = Duration::from_secs(2);
    Some(config)
}

/// A subscription request with an optional user token: status and body.
async fn request(
    hub: &TestHub,
    mode: &str,
    topic: &str,
    callback: &str,
    token: Option<&str>,
) -> (u16, String) {
    let form = [
        ("hub.mode", mode),
        ("hub.topic", topic),
        ("hub.callback", callback),
    ];
    let mut request = http_client()
        .post(&hub.url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(form).unwrap_or_default());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("POST to the hub");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

fn code_of(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|json| json["code"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

async fn owned_by(hub: &TestHub, owner: &str) -> usize {
    hub.store
        .count_by_owner(owner)
        .await
        .expect("count_by_owner") as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_caps_subscriptions_per_owner() {
    let service = FakeQuotaServer::start(INTERNAL_KEY);
    service.set_default_quotas(vec![Quota::total(QUOTA_TYPE, 2)]);
    let Some(config) = quota_config(&service).await else {
        return;
    };
    let hub = TestHub::start(config).await;
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/capped";
    let alice = token("alice");

    // Without a token, or with a bad one: 401 and nothing verified.
    let (status, body) = request(&hub, "subscribe", topic, &subscriber.callback("x"), None).await;
    assert_eq!(status, 401, "{body}");
    let forged = issue_token("another-key", "alice", None, TimeDelta::minutes(10));
    let (status, _) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("x"),
        Some(&forged),
    )
    .await;
    assert_eq!(status, 401);
    let expired = issue_token(TOKEN_KEY, "alice", None, TimeDelta::minutes(-10));
    let (status, _) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("x"),
        Some(&expired),
    )
    .await;
    assert_eq!(status, 401);

    for name in ["a1", "a2"] {
        let callback = subscriber.callback(name);
        let (status, body) = request(&hub, "subscribe", topic, &callback, Some(&alice)).await;
        assert_eq!(status, 202, "{body}");
        assert!(hub.wait_for_subscription(topic, &callback, true).await);
        let saved = hub.store.get(topic, &callback).await.expect("saved");
        assert_eq!(saved.owner.as_deref(), Some("alice"));
    }
    assert!(
        subscriber
            .verifications()
            .iter()
            .all(|v| v.param("hub.mode") == Some("subscribe"))
    );

    // Full: refused at once with the code, before any verification.
    let verifications = subscriber.verifications().len();
    let (status, body) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("a3"),
        Some(&alice),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(code_of(&body), "limit_reached");
    let json: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(
        (json["limit"].as_u64(), json["used"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(subscriber.verifications().len(), verifications);

    // A re-subscribe of a held pair is not new.
    let (status, body) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("a1"),
        Some(&alice),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    subscriber
        .wait_for_verifications(verifications + 1, WAIT)
        .await;
    assert_eq!(owned_by(&hub, "alice").await, 2);

    // Another user's pool is separate; a pair held by alice is not theirs.
    let bob = token("bob");
    let (status, body) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("a1"),
        Some(&bob),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, _) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("b1"),
        Some(&bob),
    )
    .await;
    assert_eq!(status, 202);
    assert!(
        hub.wait_for_subscription(topic, &subscriber.callback("b1"), true)
            .await
    );

    // An unsubscribe frees a slot.
    let (status, _) = request(
        &hub,
        "unsubscribe",
        topic,
        &subscriber.callback("a2"),
        Some(&alice),
    )
    .await;
    assert_eq!(status, 202);
    assert!(
        hub.wait_for_subscription(topic, &subscriber.callback("a2"), false)
            .await
    );
    let (status, body) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("a3"),
        Some(&alice),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert!(
        hub.wait_for_subscription(topic, &subscriber.callback("a3"), true)
            .await
    );
    assert_eq!(owned_by(&hub, "alice").await, 2);

    // A tier without the quota: 403 quota_not_allowed.
    service.set_quotas("carol", vec![]);
    let (status, body) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("c1"),
        Some(&token("carol")),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(code_of(&body), "quota_not_allowed");

    // The service down: 503, and nothing saved.
    service.respond_unreachable();
    let (status, body) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("d1"),
        Some(&token("dave")),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(code_of(&body), "quota_unavailable");
    // And a 500 from it: 502.
    service.reachable();
    service.respond_with(http::StatusCode::INTERNAL_SERVER_ERROR);
    let (status, body) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("d1"),
        Some(&token("dave")),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(owned_by(&hub, "dave").await, 0);
    hub.stop().await;
}

/// Each verification's `hub.mode` and `hub.reason`, in arrival order.
fn modes(callback: &RecordingReceiver) -> Vec<(String, Option<String>)> {
    callback
        .received()
        .iter()
        .map(|received| {
            (
                received.param("hub.mode").unwrap_or_default().to_owned(),
                received.param("hub.reason").map(str::to_owned),
            )
        })
        .collect()
}

/// The `hub.reason` of the first denial `callback` received, if any.
fn denial(callback: &RecordingReceiver) -> Option<Option<String>> {
    modes(callback)
        .into_iter()
        .find(|(mode, _)| mode == "denied")
        .map(|(_, reason)| reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limit_reached_after_the_answer_is_denied_at_save_time() {
    let service = FakeQuotaServer::start(INTERNAL_KEY);
    service.set_default_quotas(vec![Quota::total(QUOTA_TYPE, 1)]);
    let Some(config) = quota_config(&service).await else {
        return;
    };
    let hub = TestHub::start(config).await;
    // The subscribe verification waits for the gate; the denial after it
    // does not.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let server = RecordingReceiver::start().await;
    server.answer_in_turn("/cb", [Answer::echo().gated(gate.clone()), Answer::echo()]);
    let callback = format!("http://{}/cb", server.address());
    let topic = "http://127.0.0.1:9/topics/late";

    // Nothing held yet: the early check passes and the verification starts.
    let (status, body) = request(&hub, "subscribe", topic, &callback, Some(&token("erin"))).await;
    assert_eq!(status, 202, "{body}");
    // While the subscriber thinks it over, another replica saves erin's one
    // allowed subscription.
    let mut held = websub_store::Subscription::new(topic, "http://127.0.0.1:9/elsewhere");
    held.owner = Some("erin".to_owned());
    hub.store.save(&held).await.expect("save");
    gate.add_permits(1);

    let denied = server
        .wait_until(WAIT, |server| denial(server).is_some())
        .await;
    assert!(denied, "no denial: {:?}", modes(&server));
    let denial = denial(&server).flatten();
    assert!(denial.is_some_and(|reason| reason.contains("limit")));
    assert!(
        hub.store.get(topic, &callback).await.is_err(),
        "refused at save time"
    );
    assert_eq!(owned_by(&hub, "erin").await, 1);
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn a_hundred_concurrent_subscribes_over_two_hubs_save_exactly_the_limit() {
    let service = FakeQuotaServer::start(INTERNAL_KEY);
    service.set_default_quotas(vec![Quota::total(QUOTA_TYPE, 5)]);
    let Some(config) = quota_config(&service).await else {
        return;
    };
    let first = TestHub::start(config.clone()).await;
    let second = TestHub::start(config).await;
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/contended";
    let frank = token("frank");
    let requests = (0..100).map(|i| {
        let hub = if i % 2 == 0 { &first } else { &second };
        let callback = subscriber.callback(&format!("f{i}"));
        let frank = frank.clone();
        async move { request(hub, "subscribe", topic, &callback, Some(&frank)).await }
    });
    let answers = futures::future::join_all(requests).await;
    let accepted = answers.iter().filter(|(status, _)| *status == 202).count();
    let refused = answers
        .iter()
        .filter(|(status, body)| *status == 403 && code_of(body) == "limit_reached")
        .count();
    assert_eq!(accepted + refused, 100, "{answers:?}");
    // Every accepted request is verified, then saved or denied.
    let settled = subscriber
        .wait_until(WAIT, |s| {
            let denied = s
                .verifications()
                .iter()
                .filter(|v| v.param("hub.mode") == Some("denied"))
                .count();
            denied >= accepted.saturating_sub(5)
        })
        .await;
    assert!(settled, "denials never arrived");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(owned_by(&first, "frank").await, 5);
    let listed = first.store.list_by_topic(topic).await.expect("list");
    assert_eq!(listed.len(), 5);
    first.stop().await;
    second.stop().await;
}

/// A GET or DELETE on the subscriber API: status and JSON (or text).
async fn api(
    hub: &TestHub,
    method: reqwest::Method,
    path_and_query: &str,
    token: Option<&str>,
) -> (u16, Value) {
    let mut request = http_client().request(method, format!("{}api/v1/{path_and_query}", hub.url));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("API request");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscriber_api_lists_removes_and_reports_usage() {
    let service = FakeQuotaServer::start(INTERNAL_KEY);
    service.set_default_quotas(vec![Quota::total(QUOTA_TYPE, 3)]);
    service.set_quotas("vip", vec![Quota::unlimited(QUOTA_TYPE)]);
    let Some(mut config) = quota_config(&service).await else {
        return;
    };
    config.delivery.retry.max_retries = 0;
    let hub = TestHub::start(config).await;
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/api";
    let grace = token("grace");
    for name in ["ok", "broken"] {
        let (status, _) = request(
            &hub,
            "subscribe",
            topic,
            &subscriber.callback(name),
            Some(&grace),
        )
        .await;
        assert_eq!(status, 202);
        assert!(
            hub.wait_for_subscription(topic, &subscriber.callback(name), true)
                .await
        );
    }
    let (status, _) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("other"),
        Some(&token("heidi")),
    )
    .await;
    assert_eq!(status, 202);
    assert!(
        hub.wait_for_subscription(topic, &subscriber.callback("other"), true)
            .await
    );

    subscriber.answer_delivery("broken", Answer::status(500));
    assert_eq!(hub.fat_ping(topic, "text/plain", "news").await.0, 202);
    assert_eq!(subscriber.wait_for_deliveries("ok", 1, WAIT).await.len(), 1);
    assert!(
        subscriber
            .wait_until(WAIT, |s| s.attempts("broken") >= 1)
            .await
    );

    // The list shows grace's two subscriptions and how delivery goes.
    let mut listed = Value::Null;
    for _ in 0..200 {
        let (status, json) = api(&hub, reqwest::Method::GET, "subscriptions", Some(&grace)).await;
        assert_eq!(status, 200, "{json}");
        // Settled once each has its outcome written: a record held until
        // its first outcome is not yet counted as pending.
        let settled = json.as_array().is_some_and(|rows| {
            rows.iter().all(|row| {
                let delivery = &row["delivery"];
                delivery["pending"] == 0
                    && (delivery["failed"] != 0 || delivery["last_success"].is_string())
            })
        });
        listed = json;
        if settled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let rows = listed.as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 2, "{listed}");
    let row_of = |name: &str| {
        rows.iter()
            .find(|row| row["callback"] == subscriber.callback(name))
            .cloned()
            .unwrap_or_default()
    };
    let broken = row_of("broken");
    assert_eq!(broken["topic"], topic);
    assert_eq!(broken["delivery"]["failed"], 1, "{broken}");
    assert!(
        broken["delivery"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("500"))
    );
    assert!(broken["delivery"]["last_success"].is_null());
    let ok = row_of("ok");
    assert_eq!(ok["delivery"]["failed"], 0);
    assert!(ok["delivery"]["last_success"].is_string(), "{ok}");
    assert!(ok["delivery"]["last_error"].is_null());
    assert!(ok["expires_at"].is_string() && ok["created_at"].is_string());

    let (status, usage) = api(&hub, reqwest::Method::GET, "usage", Some(&grace)).await;
    assert_eq!(status, 200);
    assert_eq!(
        usage,
        serde_json::json!({"quota_type": QUOTA_TYPE, "used": 2, "limit": 3, "unlimited": false})
    );
    let (_, usage) = api(&hub, reqwest::Method::GET, "usage", Some(&token("vip"))).await;
    assert_eq!(usage["unlimited"], true);
    assert!(usage["limit"].is_null());

    // Removing: not someone else's, and needs both names.
    let pair = |name: &str| {
        serde_urlencoded::to_string([("topic", topic), ("callback", &subscriber.callback(name))])
            .unwrap_or_default()
    };
    let (status, _) = api(
        &hub,
        reqwest::Method::DELETE,
        &format!("subscriptions?{}", pair("other")),
        Some(&grace),
    )
    .await;
    assert_eq!(status, 404);
    assert!(
        hub.store
            .get(topic, &subscriber.callback("other"))
            .await
            .is_ok()
    );
    let (status, _) = api(
        &hub,
        reqwest::Method::DELETE,
        "subscriptions?topic=x",
        Some(&grace),
    )
    .await;
    assert_eq!(status, 400);
    let verifications = subscriber.verifications().len();
    let (status, _) = api(
        &hub,
        reqwest::Method::DELETE,
        &format!("subscriptions?{}", pair("broken")),
        Some(&grace),
    )
    .await;
    assert_eq!(status, 204);
    assert!(
        hub.store
            .get(topic, &subscriber.callback("broken"))
            .await
            .is_err()
    );
    assert_eq!(
        subscriber.verifications().len(),
        verifications,
        "no verification needed"
    );
    let (_, usage) = api(&hub, reqwest::Method::GET, "usage", Some(&grace)).await;
    assert_eq!(usage["used"], 1);

    // Without a token: 401 with a challenge.
    for path in ["subscriptions", "usage"] {
        let (status, _) = api(&hub, reqwest::Method::GET, path, None).await;
        assert_eq!(status, 401);
    }
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_quota_a_token_is_optional_and_names_the_owner() {
    let Some(mut config) = test_config(Backend::Sqlite).await else {
        return;
    };
    config.user_token_key = Some(TOKEN_KEY.to_owned());
    let hub = TestHub::start(config).await;
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/open";
    let (status, _) = request(&hub, "subscribe", topic, &subscriber.callback("anon"), None).await;
    assert_eq!(status, 202);
    assert!(
        hub.wait_for_subscription(topic, &subscriber.callback("anon"), true)
            .await
    );
    let (status, _) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("ivan"),
        Some(&token("ivan")),
    )
    .await;
    assert_eq!(status, 202);
    assert!(
        hub.wait_for_subscription(topic, &subscriber.callback("ivan"), true)
            .await
    );
    let (status, body) = request(
        &hub,
        "subscribe",
        topic,
        &subscriber.callback("bad"),
        Some("not.a.token"),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    let (status, listed) = api(
        &hub,
        reqwest::Method::GET,
        "subscriptions",
        Some(&token("ivan")),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(listed.as_array().map(Vec::len), Some(1));
    let (_, usage) = api(&hub, reqwest::Method::GET, "usage", Some(&token("ivan"))).await;
    assert_eq!(
        usage,
        serde_json::json!({"quota_type": null, "used": 1, "limit": null, "unlimited": true})
    );
    hub.stop().await;
}
