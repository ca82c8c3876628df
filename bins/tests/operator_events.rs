//! Endpoint state changes against the real `websubd`: a callback that goes
//! down (its breaker opens) and comes back shows failing, open and
//! recovered, in order, in the history (operator API and CLI) and on the
//! admin page, and a loopback operator webhook receives each change signed
//! with its secret; an operator's disable and enable are kept and sent the
//! same way; a dead operator webhook slows no delivery; and its secret is
//! replaced through an overlap in which each change carries both
//! signatures.

use crate::common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Websubd, free_port, save_subscriptions, scratch_dir};
use serde_json::Value;
use websub_hub::signature::{sign_standard, standard_key};
use websub_tests::{Answer, INTERNAL_KEY, Received, TestSubscriber, http_client};

/// The operator webhook's secret: `whsec_` and the base64 of its key.
const SECRET: &str = "whsec_b3BlcmF0b3Itd2ViaG9vay10ZXN0LWtleQ==";

fn sqlite_url(dir: &std::path::Path) -> String {
    format!("sqlite:{}", dir.join("hub.db").display())
}

async fn start(database_url: &str, operator_webhook: &str, extra: &[&str]) -> Websubd {
    let dir = scratch_dir("operator-events");
    let mut arguments = vec![
        "--database-url",
        database_url,
        "--allow-private-network",
        "--internal-api-key",
        INTERNAL_KEY,
        "--operator-webhook",
        operator_webhook,
        "--operator-webhook-secret",
        SECRET,
    ];
    arguments.extend_from_slice(extra);
    Websubd::spawn(&dir, free_port(), &arguments).ready().await
}

/// `GET /api/v1/operator/endpoints/changes` with `query`, oldest first.
async fn changes(hub: &Websubd, query: &[(&str, &str)]) -> Vec<Value> {
    let answer = http_client()
        .get(format!(
            "{}api/v1/operator/endpoints/changes?{}",
            hub.url,
            serde_urlencoded::to_string(query).expect("a query")
        ))
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .send()
        .await
        .expect("list the changes");
    assert_eq!(answer.status(), 200);
    let mut listed: Vec<Value> = answer.json().await.expect("JSON");
    listed.reverse();
    listed
}

fn states(changes: &[Value]) -> Vec<String> {
    changes
        .iter()
        .map(|change| change["to"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn wait_for_changes(
    hub: &Websubd,
    query: &[(&str, &str)],
    done: impl Fn(&[String]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = changes(hub, query).await;
        if done(&states(&listed)) {
            return listed;
        }
        assert!(
            Instant::now() < deadline,
            "the history holds {:?}",
            states(&listed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `websub ARGS` against `hub` with the tests' key.
async fn websub(hub: &Websubd, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_websub"));
    command
        .args(args)
        .env_remove("WEBSUB_INTERNAL_API_KEY_HEADER")
        .env("WEBSUB_HUB", &hub.url)
        .env("WEBSUB_INTERNAL_API_KEY", INTERNAL_KEY);
    let output = tokio::task::spawn_blocking(move || command.output().expect("run websub"))
        .await
        .expect("websub ran");
    assert!(
        output.status.success(),
        "websub {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The changes the operator webhook received, each checked against its
/// Standard Webhooks signature, as their bodies.
fn received(operator: &TestSubscriber) -> Vec<Value> {
    let key = standard_key(SECRET).expect("a Standard Webhooks secret");
    operator
        .deliveries_to("ops")
        .iter()
        .filter(|request| request.succeeded())
        .map(|request: &Received| {
            let id = request.header("webhook-id").expect("webhook-id");
            let timestamp: i64 = request
                .header("webhook-timestamp")
                .and_then(|value| value.parse().ok())
                .expect("webhook-timestamp");
            assert!(
                (chrono::Utc::now().timestamp() - timestamp).abs() < 300,
                "signed just now"
            );
            assert_eq!(
                request.header("webhook-signature"),
                Some(sign_standard(&key, id, timestamp, &request.body).as_str()),
                "signed with the secret"
            );
            assert_eq!(request.header("content-type"), Some("application/json"));
            let body: Value = serde_json::from_slice(&request.body).expect("a JSON body");
            assert_eq!(id, format!("endpoint-change-{}", body["id"]));
            body
        })
        .collect()
}

/// A callback down for a while, back, then disabled and enabled by an
/// operator: every change kept in order, shown, and sent signed.
async fn an_outage_is_kept_shown_and_sent(database_url: String) {
    let subscriber = TestSubscriber::start().await;
    subscriber.answer_delivery("flaky", Answer::status(503));
    let operator = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/operator-events/outage";
    let flaky = subscriber.callback("flaky");
    save_subscriptions(
        &database_url,
        topic,
        vec![subscriber.callback("steady"), flaky.clone()],
    )
    .await;
    let hub = start(
        &database_url,
        &operator.callback("ops"),
        &["--delivery-retries", "2", "--delivery-max-backoff", "1s"],
    )
    .await;
    for n in 0..8 {
        assert_eq!(hub.fat_ping(topic, &format!("{{\"n\":{n}}}")).await, 202);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let of_flaky = [("endpoint", flaky.as_str())];
    wait_for_changes(&hub, &of_flaky, |states| states.iter().any(|s| s == "open")).await;
    subscriber.answer_delivery("flaky", Answer::status(204));
    assert_eq!(hub.fat_ping(topic, "{\"n\":8}").await, 202);
    let history = wait_for_changes(&hub, &of_flaky, |states| {
        states.iter().any(|s| s == "recovered")
    })
    .await;
    assert_eq!(
        states(&history),
        ["failing", "open", "recovered"],
        "failing half way to opening (5), then open, then recovered: {history:?}"
    );
    assert_eq!(history[0]["failures"], 3);
    assert_eq!(history[1]["failures"], 5);
    assert_eq!(history[0]["channel"], "websub");
    assert_eq!(history[0]["source"], "breaker");
    assert!(
        history[0]["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("503")),
        "the last error is kept: {history:?}"
    );
    assert!(history[2]["since"].is_string(), "{history:?}");
    assert!(
        changes(&hub, &[("endpoint", &subscriber.callback("steady"))])
            .await
            .is_empty(),
        "a healthy callback has no history"
    );

    // An operator disables it and enables it again.
    websub(
        &hub,
        &["endpoints", "disable", &flaky, "--reason", "maintenance"],
    )
    .await;
    websub(&hub, &["endpoints", "enable", &flaky]).await;
    let history = changes(&hub, &of_flaky).await;
    assert_eq!(
        states(&history),
        ["failing", "open", "recovered", "disabled", "enabled"]
    );
    assert_eq!(history[3]["source"], "operator");
    assert_eq!(history[3]["reason"], "maintenance");

    // The CLI shows the same, newest first.
    let table = websub(&hub, &["endpoints", "history", "--endpoint", &flaky]).await;
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 5, "{table}");
    for (row, state) in rows
        .iter()
        .zip(["enabled", "disabled", "recovered", "open", "failing"])
    {
        assert!(row.contains(state) && row.contains(&flaky), "{table}");
    }
    let json = websub(
        &hub,
        &["endpoints", "history", "--channel", "websub", "--json"],
    )
    .await;
    let json: Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(json.as_array().map(Vec::len), Some(5), "{json}");

    // The operator webhook got every change, signed, in order.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sent = loop {
        let sent = received(&operator);
        let ours: Vec<&Value> = sent
            .iter()
            .filter(|change| change["endpoint"] == flaky.as_str())
            .collect();
        if ours.len() >= 5 || Instant::now() > deadline {
            break sent;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut ours: Vec<&Value> = sent
        .iter()
        .filter(|change| change["endpoint"] == flaky.as_str())
        .collect();
    ours.sort_by_key(|change| change["id"].as_i64());
    ours.dedup_by_key(|change| change["id"].as_i64());
    assert_eq!(
        ours.iter()
            .map(|change| change["to"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["failing", "open", "recovered", "disabled", "enabled"],
        "{sent:?}"
    );
    assert_eq!(ours[0]["type"], "endpoint.changed");
    assert_eq!(ours[0]["hub"], hub.url.as_str());
    // A change is marked sent after the operator webhook's answer: wait
    // for the marks rather than read them at once.
    let deadline = Instant::now() + Duration::from_secs(20);
    let history = loop {
        let history = changes(&hub, &of_flaky).await;
        let all_sent = history
            .iter()
            .all(|change| change["webhook_state"] == "delivered");
        if all_sent || Instant::now() > deadline {
            break history;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        history
            .iter()
            .all(|change| change["webhook_state"] == "delivered"),
        "{history:?}"
    );

    // The admin page lists them.
    // Not following the redirect: the session cookie comes with it.
    let admin = common::no_redirects();
    let login = admin
        .post(format!("{}admin/login", hub.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string([("key", INTERNAL_KEY)]).expect("a form"))
        .send()
        .await
        .expect("log in");
    let cookie = login
        .headers()
        .get("set-cookie")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .expect("a session cookie")
        .to_owned();
    let page = admin
        .get(format!(
            "{}admin/endpoints?{}",
            hub.url,
            serde_urlencoded::to_string([("endpoint", flaky.as_str()), ("channel", "websub")])
                .expect("a query")
        ))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("the endpoints page");
    assert_eq!(page.status(), 200);
    let page = page.text().await.expect("HTML");
    assert!(page.contains("id=\"endpoint-changes\""), "{page}");
    for state in ["failing", "open", "recovered", "disabled", "enabled"] {
        assert!(
            page.contains(&format!("class=\"change {state}\"")),
            "{state}: {page}"
        );
    }
    assert!(page.contains("maintenance"));

    let metrics = hub.metrics_text().await;
    for to in ["failing", "open", "recovered", "disabled", "enabled"] {
        assert!(
            metrics.contains(&format!(
                "websub_endpoint_changes_total{{channel=\"websub\",to=\"{to}\"}}"
            )),
            "{to}: {metrics}"
        );
    }
    assert!(
        metrics.contains("websub_operator_webhook_deliveries_total{outcome=\"delivered\"}"),
        "{metrics}"
    );
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_is_kept_shown_and_sent_on_sqlite() {
    let dir = scratch_dir("operator-events-sqlite");
    an_outage_is_kept_shown_and_sent(sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_is_kept_shown_and_sent_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    an_outage_is_kept_shown_and_sent(url).await;
}

/// An operator webhook that never answers: its attempts wait out their
/// timeouts in a task of their own, and deliveries to the healthy callbacks
/// go on at their pace; what it missed is still recorded, waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_operator_webhook_slows_no_delivery() {
    let subscriber = TestSubscriber::start().await;
    // One callback fails, so that changes keep coming for the webhook.
    subscriber.answer_delivery("down", Answer::status(500));
    let operator = TestSubscriber::start().await;
    operator.answer_delivery("ops", Answer::never());
    let dir = scratch_dir("operator-events-dead");
    let database_url = sqlite_url(&dir);
    let topic = "http://127.0.0.1:9/operator-events/dead-webhook";
    let mut callbacks: Vec<String> = (0..20)
        .map(|i| subscriber.callback(&format!("ok-{i}")))
        .collect();
    callbacks.push(subscriber.callback("down"));
    save_subscriptions(&database_url, topic, callbacks).await;
    let hub = start(
        &database_url,
        &operator.callback("ops"),
        &["--delivery-timeout", "3s", "--visibility-timeout", "10s"],
    )
    .await;
    let healthy = |subscriber: &TestSubscriber| {
        subscriber
            .deliveries()
            .iter()
            .filter(|received| received.path.contains("/ok-") && received.succeeded())
            .count()
    };
    let started = Instant::now();
    let events = 10;
    for n in 0..events {
        assert_eq!(hub.fat_ping(topic, &format!("{{\"n\":{n}}}")).await, 202);
    }
    assert!(
        subscriber
            .wait_until(Duration::from_secs(10), |subscriber| healthy(subscriber)
                >= 20 * events)
            .await,
        "{} of {} deliveries to healthy callbacks",
        healthy(&subscriber),
        20 * events
    );
    let took = started.elapsed();
    eprintln!("every healthy delivery in {took:?} with the operator webhook dead");
    assert!(
        took < Duration::from_secs(5),
        "deliveries waited for the operator webhook: {took:?}"
    );
    // Tried, timed out, and kept for later.
    let down = subscriber.callback("down");
    let deadline = Instant::now() + Duration::from_secs(15);
    let history = loop {
        let history = changes(&hub, &[("endpoint", &down)]).await;
        let tried = history
            .iter()
            .any(|change| change["webhook_error"] == "timed out");
        if tried || Instant::now() > deadline {
            break history;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        history
            .iter()
            .any(|change| change["webhook_error"] == "timed out"),
        "the operator webhook was tried: {history:?}"
    );
    assert!(
        history
            .iter()
            .all(|change| change["webhook_state"] == "pending"),
        "what the dead webhook missed waits for it: {history:?}"
    );
    assert_eq!(states(&history), ["failing", "open"], "{history:?}");
    // The webhook's own breaker is in the history too, once it has timed
    // out half way to opening (three attempts of 3 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    let own = loop {
        let own = changes(&hub, &[("channel", "operator")]).await;
        if !own.is_empty() || Instant::now() > deadline {
            break own;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        states(&own).first().is_some_and(|state| state == "failing"),
        "{own:?}"
    );
    drop(hub);
}

/// The operator webhook's secret replaced through an overlap: while the
/// old one is set as the previous secret, every change carries a signature
/// with each, so the receiver verifies it whichever it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_webhooks_secret_is_replaced_through_an_overlap() {
    const NEW: &str = "whsec_bmV3LW9wZXJhdG9yLXdlYmhvb2sta2V5";
    let operator = TestSubscriber::start().await;
    let dir = scratch_dir("operator-events-rotation");
    let database_url = sqlite_url(&dir);
    let webhook = operator.callback("ops");
    let hub = Websubd::spawn(
        &dir,
        free_port(),
        &[
            "--database-url",
            &database_url,
            "--allow-private-network",
            "--internal-api-key",
            INTERNAL_KEY,
            "--operator-webhook",
            &webhook,
            "--operator-webhook-secret",
            NEW,
            "--operator-webhook-previous-secret",
            SECRET,
        ],
    )
    .ready()
    .await;
    let disabled = http_client()
        .post(format!("{}api/v1/operator/endpoints/disable", hub.url))
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .header("content-type", "application/json")
        .body(r#"{"endpoint": "http://127.0.0.1:9/rotation", "reason": "rotation test"}"#)
        .send()
        .await
        .expect("disable an endpoint");
    assert_eq!(disabled.status(), 200);
    assert!(
        operator
            .wait_until(Duration::from_secs(10), |operator| !operator
                .deliveries_to("ops")
                .is_empty())
            .await,
        "the change never reached the operator webhook"
    );
    let request = operator.deliveries_to("ops")[0].clone();
    let id = request.header("webhook-id").expect("webhook-id");
    let timestamp: i64 = request
        .header("webhook-timestamp")
        .and_then(|value| value.parse().ok())
        .expect("webhook-timestamp");
    let signatures: Vec<&str> = request
        .header("webhook-signature")
        .expect("webhook-signature")
        .split(' ')
        .collect();
    for secret in [NEW, SECRET] {
        let key = standard_key(secret).expect("a Standard Webhooks secret");
        let expected = sign_standard(&key, id, timestamp, &request.body);
        assert!(
            signatures.contains(&expected.as_str()),
            "signed with {secret}: {signatures:?}"
        );
    }
    assert_eq!(
        signatures[0],
        sign_standard(
            &standard_key(NEW).expect("key"),
            id,
            timestamp,
            &request.body
        ),
        "the new secret's first"
    );
}
