//! Saying no, against the real `websubd`: the deny list (through the
//! operator API, the CLI and the admin page) denies the subscribe requests
//! whose callback or topic a pattern matches, telling each callback why
//! with `hub.mode=denied` and asking it nothing; and an operator denies a
//! subscription, which is removed and its callback told.

use crate::common;

use std::time::{Duration, Instant};

use common::{Websubd, cookie_set_by, no_redirects, scratch_dir};
use reqwest::header;
use serde_json::{Value, json};
use websub_tests::{INTERNAL_KEY, Received, TestSubscriber, http_client};

const WAIT: Duration = Duration::from_secs(10);
const FORM: &str = "application/x-www-form-urlencoded";

async fn start_hub(dir: &std::path::Path) -> Websubd {
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    Websubd::on_database(&dir.to_path_buf(), &database, &[]).await
}

async fn subscribe(hub: &Websubd, topic: &str, callback: &str) {
    assert_eq!(hub.subscribe(topic, callback).await, 202, "{callback}");
}

/// An operator API request with the key: status and JSON body (`null`
/// when it has none or it is text).
async fn operator(hub: &Websubd, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let url = format!("{}api/v1/operator/{path}", hub.url);
    let client = http_client();
    let mut request = match method {
        "GET" => client.get(url),
        "POST" => client.post(url),
        "DELETE" => client.delete(url),
        other => panic!("no {other}"),
    }
    .header("X-Internal-API-Key", INTERNAL_KEY);
    if let Some(body) = body {
        request = request
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
    }
    let answer = request.send().await.expect("an operator request");
    let status = answer.status().as_u16();
    let text = answer.text().await.expect("a body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn held(hub: &Websubd, topic: &str, callback: &str) -> bool {
    let query =
        serde_urlencoded::to_string([("topic", topic), ("callback", callback)]).expect("a query");
    operator(hub, "GET", &format!("subscription?{query}"), None)
        .await
        .0
        == 200
}

/// Waits for the GETs `subscriber` received at `name`: at least `count`.
async fn requests_to(subscriber: &TestSubscriber, name: &str, count: usize) -> Vec<Received> {
    let path = format!("/cb/{name}");
    let start = Instant::now();
    loop {
        let got: Vec<Received> = subscriber
            .verifications()
            .into_iter()
            .filter(|request| request.path == path)
            .collect();
        if got.len() >= count {
            return got;
        }
        assert!(
            start.elapsed() < WAIT,
            "{name}: {} of {count} requests",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn wait_held(hub: &Websubd, topic: &str, callback: &str) {
    let start = Instant::now();
    while !held(hub, topic, callback).await {
        assert!(start.elapsed() < WAIT, "{callback} never subscribed");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn websub(hub: &Websubd, arguments: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_websub"))
        .args(arguments)
        .env("WEBSUB_HUB", &hub.url)
        .env("WEBSUB_INTERNAL_API_KEY", INTERNAL_KEY)
        .output()
        .expect("run websub")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_list_denies_matching_requests_and_tells_the_callback_why() {
    let dir = scratch_dir("denial-list");
    let hub = start_hub(&dir).await;
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/news";

    let spam = format!("{}*", subscriber.callback("spam"));
    let (status, listed) = operator(
        &hub,
        "POST",
        "denials",
        Some(json!({"field": "callback", "pattern": spam, "reason": "no spam, thanks"})),
    )
    .await;
    assert_eq!(status, 201, "{listed}");
    let (status, _) = operator(
        &hub,
        "POST",
        "denials",
        Some(json!({"field": "topic", "pattern": "http://127.0.0.1:9/banned/*", "reason": "banned topic"})),
    )
    .await;
    assert_eq!(status, 201);
    for (bad, says) in [
        (
            json!({"field": "callback", "pattern": "*", "reason": "all"}),
            "besides *",
        ),
        (
            json!({"field": "host", "pattern": "x*", "reason": "r"}),
            "unknown variant `host`",
        ),
        (
            json!({"field": "topic", "pattern": "x*", "reason": " "}),
            "reason",
        ),
    ] {
        let answer = http_client()
            .post(format!("{}api/v1/operator/denials", hub.url))
            .header("X-Internal-API-Key", INTERNAL_KEY)
            .header(header::CONTENT_TYPE, "application/json")
            .body(bad.to_string())
            .send()
            .await
            .expect("POST a bad denial");
        assert_eq!(answer.status(), 400, "{bad}");
        assert!(
            answer.text().await.expect("a reason").contains(says),
            "{bad}"
        );
    }

    // Matching callbacks and topics are denied, told why, asked nothing.
    subscribe(&hub, topic, &subscriber.callback("spam-1")).await;
    subscribe(
        &hub,
        "http://127.0.0.1:9/banned/x",
        &subscriber.callback("fine"),
    )
    .await;
    subscribe(&hub, topic, &subscriber.callback("good")).await;
    for (name, reason) in [("spam-1", "no spam, thanks"), ("fine", "banned topic")] {
        let got = requests_to(&subscriber, name, 1).await;
        assert_eq!(got[0].param("hub.mode"), Some("denied"), "{name}");
        assert_eq!(got[0].param("hub.reason"), Some(reason), "{name}");
        assert!(
            got[0].param("hub.challenge").is_none(),
            "{name}: no verification"
        );
    }
    wait_held(&hub, topic, &subscriber.callback("good")).await;
    assert!(!held(&hub, topic, &subscriber.callback("spam-1")).await);
    assert!(
        !held(
            &hub,
            "http://127.0.0.1:9/banned/x",
            &subscriber.callback("fine")
        )
        .await
    );

    // The CLI lists the patterns and removes one; then the callback may
    // subscribe.
    let listed = websub(&hub, &["denials", "list"]);
    assert!(listed.status.success(), "{listed:?}");
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        text.contains(&spam) && text.contains("no spam, thanks"),
        "{text}"
    );
    let (_, denials) = operator(&hub, "GET", "denials", None).await;
    let id = denials
        .as_array()
        .and_then(|all| all.iter().find(|denial| denial["pattern"] == spam.as_str()))
        .and_then(|denial| denial["id"].as_str())
        .expect("the callback pattern")
        .to_owned();
    let removed = websub(&hub, &["denials", "remove", &id]);
    assert!(removed.status.success(), "{removed:?}");
    subscribe(&hub, topic, &subscriber.callback("spam-2")).await;
    wait_held(&hub, topic, &subscriber.callback("spam-2")).await;

    let added = websub(
        &hub,
        &[
            "denials",
            "add",
            "--topic",
            "http://127.0.0.1:9/other*",
            "--reason",
            "closed",
        ],
    );
    assert!(added.status.success(), "{added:?}");
    subscribe(
        &hub,
        "http://127.0.0.1:9/other",
        &subscriber.callback("late"),
    )
    .await;
    let got = requests_to(&subscriber, "late", 1).await;
    assert_eq!(got[0].param("hub.reason"), Some("closed"));
    let missing = websub(&hub, &["denials", "remove", "0123"]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
}

/// Logs in with the internal key; the cookie.
async fn log_in(hub: &Websubd) -> String {
    let answer = no_redirects()
        .post(format!("{}admin/login", hub.url))
        .header(header::CONTENT_TYPE, FORM)
        .body(serde_urlencoded::to_string([("key", INTERNAL_KEY)]).expect("a form"))
        .send()
        .await
        .expect("log in");
    assert_eq!(answer.status(), 303);
    cookie_set_by(&answer)
}

/// A page's HTML, and the CSRF token in it.
async fn page(hub: &Websubd, cookie: &str, path: &str) -> (String, String) {
    let answer = no_redirects()
        .get(format!("{}{path}", hub.url))
        .header(header::COOKIE, cookie)
        .send()
        .await
        .expect("GET a page");
    assert_eq!(answer.status(), 200, "{path}");
    let html = answer.text().await.expect("the page");
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token")
        .to_owned();
    (html, csrf)
}

async fn post_form(hub: &Websubd, cookie: &str, path: &str, form: &[(&str, &str)]) -> String {
    let answer = no_redirects()
        .post(format!("{}{path}", hub.url))
        .header(header::COOKIE, cookie)
        .header(header::CONTENT_TYPE, FORM)
        .body(serde_urlencoded::to_string(form).expect("a form"))
        .send()
        .await
        .expect("POST a form");
    assert_eq!(answer.status(), 303, "{path}");
    answer.headers()[header::LOCATION]
        .to_str()
        .expect("a location")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_denies_a_subscription_through_the_api_the_cli_and_the_admin_page() {
    let dir = scratch_dir("denial-one");
    let hub = start_hub(&dir).await;
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/feed";
    for name in ["by-api", "by-cli", "by-page"] {
        subscribe(&hub, topic, &subscriber.callback(name)).await;
        wait_held(&hub, topic, &subscriber.callback(name)).await;
    }

    let (status, answer) = operator(
        &hub,
        "POST",
        "subscriptions/deny",
        Some(json!({"topic": topic, "callback": subscriber.callback("by-api"), "reason": "terms broken"})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["notified"], true);
    let denied = requests_to(&subscriber, "by-api", 2).await;
    let notice = denied.last().expect("the notice");
    assert_eq!(notice.param("hub.mode"), Some("denied"));
    assert_eq!(notice.param("hub.topic"), Some(topic));
    assert_eq!(notice.param("hub.reason"), Some("terms broken"));
    assert!(!held(&hub, topic, &subscriber.callback("by-api")).await);
    let (status, _) = operator(
        &hub,
        "POST",
        "subscriptions/deny",
        Some(json!({"topic": topic, "callback": subscriber.callback("by-api"), "reason": "again"})),
    )
    .await;
    assert_eq!(status, 404, "nothing left to deny");

    let by_cli = subscriber.callback("by-cli");
    let output = websub(
        &hub,
        &[
            "subscriptions",
            "deny",
            "--topic",
            topic,
            "--callback",
            &by_cli,
            "--reason",
            "cli says no",
        ],
    );
    assert!(output.status.success(), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("told it why"),
        "{output:?}"
    );
    let denied = requests_to(&subscriber, "by-cli", 2).await;
    assert_eq!(
        denied.last().and_then(|notice| notice.param("hub.reason")),
        Some("cli says no")
    );
    assert!(!held(&hub, topic, &by_cli).await);

    // The admin page: the subscription's Deny form, then the deny list's
    // add form and remove button.
    let cookie = log_in(&hub).await;
    let (html, csrf) = page(&hub, &cookie, "admin/subscriptions").await;
    assert!(
        html.contains("/admin/subscriptions/deny"),
        "a Deny form per subscription"
    );
    let by_page = subscriber.callback("by-page");
    let location = post_form(
        &hub,
        &cookie,
        "admin/subscriptions/deny",
        &[
            ("csrf", &csrf),
            ("topic", topic),
            ("callback", &by_page),
            ("reason", "page says no"),
        ],
    )
    .await;
    assert!(location.starts_with("/admin/denials?denied="), "{location}");
    let denied = requests_to(&subscriber, "by-page", 2).await;
    assert_eq!(
        denied.last().and_then(|notice| notice.param("hub.reason")),
        Some("page says no")
    );
    assert!(!held(&hub, topic, &by_page).await);

    let pattern = format!("{}*", subscriber.callback("by-page"));
    post_form(
        &hub,
        &cookie,
        "admin/denials/add",
        &[
            ("csrf", &csrf),
            ("field", "callback"),
            ("pattern", &pattern),
            ("reason", "stay away"),
        ],
    )
    .await;
    let (html, _) = page(&hub, &cookie, "admin/denials").await;
    assert!(
        html.contains(&pattern) && html.contains("stay away"),
        "listed on the page"
    );
    subscribe(&hub, topic, &by_page).await;
    let denied = requests_to(&subscriber, "by-page", 3).await;
    assert_eq!(
        denied.last().and_then(|notice| notice.param("hub.reason")),
        Some("stay away")
    );
    let (_, denials) = operator(&hub, "GET", "denials", None).await;
    let id = denials[0]["id"].as_str().expect("an id").to_owned();
    post_form(
        &hub,
        &cookie,
        "admin/denials/remove",
        &[("csrf", &csrf), ("id", &id), ("pattern", &pattern)],
    )
    .await;
    let (_, denials) = operator(&hub, "GET", "denials", None).await;
    assert_eq!(denials, json!([]), "removed from the page");
    subscribe(&hub, topic, &by_page).await;
    wait_held(&hub, topic, &by_page).await;
}
