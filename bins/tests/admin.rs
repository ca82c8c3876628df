//! The admin page of the real `websubd` binary: in a real browser (headless
//! Chromium through chromedriver), an operator logs in with the internal
//! key, finds a subscription, sees a delivery that failed, retries it once
//! the subscriber is fixed, and sees it delivered with its attempts; sees a
//! failing callback disabled and its new delivery skipped, enables it,
//! replays what it missed and sees it delivered, and disables and enables a
//! callback by hand; and, over plain HTTP, the page's locks: the session
//! cookie's attributes, the way to the login without one, a wrong key, a
//! forged cookie, a form without its CSRF token, and a hub without a key.
//!
//! `WEBSUB_ADMIN_SCREENSHOT=docs/admin-overview.png` makes the endpoint
//! test write the overview it sees, with a callback disabled, there
//! (relative to the workspace root), which is how the README's screenshot
//! is made.

use crate::common;

use std::time::Duration;

use common::browser::Browser;
use common::{Websubd, free_port, scratch_dir};
use reqwest::header;
use websub_store::Subscription;
use websub_tests::{Answer, INTERNAL_KEY, TestSubscriber, http_client};

pub(crate) const TOPIC: &str = "https://publisher.example/news";

/// A hub on SQLite in `dir` with the tests' internal key, whose deliveries
/// give up after one quick retry.
pub(crate) async fn start_hub(dir: &std::path::Path, extra: &[&str]) -> Websubd {
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let mut arguments = vec![
        "--database-url",
        &database,
        "--allow-private-network",
        "--delivery-retries",
        "1",
        "--delivery-max-backoff",
        "100ms",
        "--poll-interval",
        "100ms",
        // No breaker: these pages show deliveries that ran out of
        // retries, which a breaker would hold instead.
        "--endpoint-open-after",
        "0",
    ];
    arguments.extend_from_slice(extra);
    Websubd::spawn(&dir.to_path_buf(), free_port(), &arguments)
        .ready()
        .await
}

/// Saves subscriptions of [`TOPIC`] where `hub` keeps them.
pub(crate) async fn subscribe(dir: &std::path::Path, callbacks: &[String]) {
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let store = websub_hub::server::open_store(&database)
        .await
        .expect("open the hub's store");
    for callback in callbacks {
        store
            .save(
                &Subscription::new(TOPIC, callback)
                    .with_lease(chrono::Duration::days(1), chrono::Utc::now()),
            )
            .await
            .expect("save a subscription");
    }
}

/// The failed deliveries to `callback`, by the operator API.
pub(crate) async fn failed_to(hub: &Websubd, callback: &str) -> Vec<serde_json::Value> {
    http_client()
        .get(format!(
            "{}api/v1/operator/deliveries/failed?{}",
            hub.url,
            serde_urlencoded::to_string([("subscriber", callback)]).expect("a query")
        ))
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .send()
        .await
        .expect("list failed deliveries")
        .json()
        .await
        .expect("failed deliveries as JSON")
}

/// A client that shows redirects instead of following them.
pub(crate) fn client() -> reqwest::Client {
    websub_tests::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

/// A form POST to `url`, with the session `cookie` when given.
pub(crate) async fn post_form(
    url: String,
    cookie: Option<&str>,
    form: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client()
        .post(url)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(form).expect("a form"));
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    request.send().await.expect("POST a form")
}

/// Logs in with `key`; the answer.
pub(crate) async fn log_in(hub: &Websubd, key: &str) -> reqwest::Response {
    post_form(format!("{}admin/login", hub.url), None, &[("key", key)]).await
}

/// A hub on SQLite in `dir` (with the tests' internal key) whose topic has
/// two subscriptions of `subscriber`: `steady`, which takes the three
/// events published, and `broken`, which answers `broken_answer` until
/// each of its three deliveries has failed. Returns the hub and the two
/// callbacks, broken first.
pub(crate) async fn three_events_one_broken(
    dir: &std::path::Path,
    subscriber: &TestSubscriber,
    broken_answer: Answer,
) -> (Websubd, String, String) {
    let broken = subscriber.callback("broken");
    let steady = subscriber.callback("steady");
    subscriber.answer_delivery("broken", broken_answer);
    subscribe(dir, &[broken.clone(), steady.clone()]).await;
    let hub = start_hub(dir, &["--internal-api-key", INTERNAL_KEY]).await;
    for number in 0..3 {
        let status = hub
            .fat_ping(TOPIC, &format!("{{\"number\":{number}}}"))
            .await;
        assert_eq!(status, 202, "fat ping {number}");
    }
    subscriber
        .wait_for_deliveries("steady", 3, Duration::from_secs(30))
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while failed_to(&hub, &broken).await.len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the broken callback's deliveries did not fail"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (hub, broken, steady)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_a_failed_delivery_in_the_browser() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = scratch_dir("admin-browser");
    let subscriber = TestSubscriber::start().await;
    let (hub, broken, steady) = three_events_one_broken(
        &dir,
        &subscriber,
        Answer::status(500).with_body("<b>down</b> for now"),
    )
    .await;

    // Without a session the page leads to the login; a wrong key is
    // refused there.
    browser.goto(&format!("{}admin", hub.url)).await;
    assert_eq!(browser.path().await, "/admin/login");
    browser
        .type_into("#key", "not-the-key-but-just-as-long-as-it")
        .await;
    browser.click("form button[type=submit]").await;
    assert!(
        browser
            .text(".error")
            .await
            .contains("not an operator key of this hub"),
        "a wrong key is refused"
    );
    browser.type_into("#key", INTERNAL_KEY).await;
    browser.click("form button[type=submit]").await;
    browser.find("#deliveries").await;
    // The Secure cookie was kept on http://127.0.0.1: the overview came.
    assert_eq!(browser.path().await, "/admin");
    assert_eq!(browser.text("#failed").await, "3");
    assert_eq!(browser.text("#subscriptions").await, "2");

    // The subscription, found by its callback, shows its failures.
    browser.click("nav a[href='/admin/subscriptions']").await;
    browser.type_into("#callback", "/cb/broken").await;
    browser
        .click("form[action='/admin/subscriptions'] button")
        .await;
    browser.wait_for_query("callback=").await;
    let row = browser.text("tr.subscription").await;
    assert!(row.contains(&broken), "{row}");
    assert!(
        !browser.source().await.contains(&steady),
        "filtered by callback"
    );
    browser.click("tr.subscription td.number a").await;

    // Fixed, the subscriber takes the retried delivery.
    browser.find("table#failed").await;
    assert_eq!(browser.path().await, "/admin/failed");
    assert!(browser.text("td.error").await.contains("500"));
    subscriber.answer_delivery("broken", Answer::status(204));
    browser.click("#failed tr.failed form.retry button").await;
    browser.find("#state").await;
    assert_eq!(browser.path().await, "/admin/delivery");
    assert_eq!(
        browser.reload_until("#state", "delivered").await,
        "delivered"
    );
    let attempts = browser.text("#attempts tbody").await;
    assert!(
        attempts.contains("500"),
        "the failed attempts are listed: {attempts}"
    );
    assert!(
        attempts.contains("204"),
        "the delivering attempt is listed: {attempts}"
    );
    // The subscriber's answer is shown as text, not as markup.
    assert!(
        browser
            .source()
            .await
            .contains("&lt;b&gt;down&lt;/b&gt; for now")
    );

    // The rest of the subscriber's failures, all at once.
    browser.goto(&format!("{}admin/failed", hub.url)).await;
    browser.click("#failed-subscribers form.retry button").await;
    browser.find(".notice").await;
    assert!(
        browser
            .text(".notice")
            .await
            .contains("2 failed deliveries re-opened")
    );
    subscriber
        .wait_for_deliveries("broken", 3, Duration::from_secs(30))
        .await;
    assert_eq!(subscriber.deliveries_to("broken").len(), 3);

    browser.click("nav form button").await;
    browser.find("#key").await;
    browser.goto(&format!("{}admin", hub.url)).await;
    assert_eq!(browser.path().await, "/admin/login", "logged out");
    browser.close().await;
}

/// The troubled endpoints' names, disabled ones only, by the operator API.
async fn disabled_endpoints(hub: &Websubd) -> Vec<String> {
    let listed: Vec<serde_json::Value> = http_client()
        .get(format!("{}api/v1/operator/endpoints", hub.url))
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .send()
        .await
        .expect("list endpoints")
        .json()
        .await
        .expect("endpoints as JSON");
    listed
        .into_iter()
        .filter(|record| !record["disabled_at"].is_null())
        .filter_map(|record| record["endpoint"].as_str().map(str::to_owned))
        .collect()
}

/// Logs the browser in with the tests' key; it lands on the overview.
pub(crate) async fn log_in_browser(browser: &Browser, hub: &Websubd) {
    browser.goto(&format!("{}admin/login", hub.url)).await;
    browser.type_into("#key", INTERNAL_KEY).await;
    browser.click("form button[type=submit]").await;
    browser.find("#deliveries").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_enables_a_disabled_callback_and_replays_it_in_the_browser() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = scratch_dir("admin-endpoints");
    let subscriber = TestSubscriber::start().await;
    let flaky = subscriber.callback("flaky");
    let steady = subscriber.callback("steady");
    subscriber.answer_delivery("flaky", Answer::status(503));
    subscribe(&dir, &[flaky.clone(), steady.clone()]).await;
    let start = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let hub = start_hub(
        &dir,
        &[
            "--internal-api-key",
            INTERNAL_KEY,
            "--disable-endpoint-after",
            "2",
        ],
    )
    .await;
    for number in 0..2 {
        assert_eq!(
            hub.fat_ping(TOPIC, &format!("{{\"number\":{number}}}"))
                .await,
            202
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !disabled_endpoints(&hub).await.contains(&flaky) {
        assert!(
            std::time::Instant::now() < deadline,
            "the failing callback was not disabled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Disabled after two deliveries in a row ran out of retries: on the
    // endpoints page and on the overview.
    log_in_browser(&browser, &hub).await;
    assert_eq!(browser.text("#endpoints-disabled").await, "1");
    assert!(browser.text("#disabled-endpoints").await.contains(&flaky));
    assert_eq!(browser.text("#feeds p").await, "No outbox feeds.");
    if let Some(path) = std::env::var_os("WEBSUB_ADMIN_SCREENSHOT") {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path);
        std::fs::write(&path, browser.screenshot().await)
            .unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
    }
    browser.click("nav a[href='/admin/endpoints']").await;
    let row = browser.text("#endpoints tr.disabled").await;
    assert!(row.contains(&flaky), "{row}");
    assert!(row.contains("2 deliveries in a row"), "{row}");
    assert!(row.contains("503"), "the last error is shown: {row}");

    // A new event is not sent to it: its delivery is skipped, and sending
    // it again is refused while the endpoint is disabled.
    assert_eq!(hub.fat_ping(TOPIC, "{\"number\":2}").await, 202);
    subscriber
        .wait_for_deliveries("steady", 3, Duration::from_secs(30))
        .await;
    browser
        .click("nav a[href='/admin/deliveries?state=skipped']")
        .await;
    assert_eq!(browser.reload_until("#count", "1").await, "1");
    assert!(browser.text("#records tr.record").await.contains(&flaky));
    browser.click("#records tr.record td a").await;
    assert_eq!(browser.text("#state").await, "skipped");
    browser.click("form.redeliver button").await;
    let refusal = browser.text(".error[role=alert]").await;
    assert!(refusal.contains("is disabled"), "{refusal}");
    assert_eq!(
        subscriber.attempts("flaky"),
        4,
        "two events, two attempts each"
    );

    // Enabled, fixed, and everything since the start replayed.
    browser.click("nav a[href='/admin/endpoints']").await;
    browser
        .click("#endpoints tr.disabled form.enable button")
        .await;
    assert!(
        browser
            .text(".notice")
            .await
            .contains(&format!("Enabled {flaky}"))
    );
    assert!(
        browser
            .source()
            .await
            .contains("No endpoint is failing or disabled.")
    );
    subscriber.answer_delivery("flaky", Answer::status(204));
    browser
        .goto(&format!(
            "{}admin/subscriptions?callback=/cb/flaky",
            hub.url
        ))
        .await;
    browser
        .type_into(
            "tr.subscription form.replay input[name=since]",
            &start.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )
        .await;
    browser.click("tr.subscription form.replay button").await;
    assert!(
        browser
            .text(".notice")
            .await
            .contains("3 events sent again"),
        "the two failed and the skipped one"
    );
    assert_eq!(browser.path().await, "/admin/deliveries");
    let delivered = subscriber
        .wait_for_deliveries("flaky", 3, Duration::from_secs(30))
        .await;
    assert_eq!(delivered.len(), 3);
    browser
        .goto(&format!(
            "{}admin/deliveries?{}",
            hub.url,
            serde_urlencoded::to_string([("subscriber", flaky.as_str()), ("state", "delivered")])
                .expect("a query")
        ))
        .await;
    assert_eq!(browser.reload_until("#count", "3").await, "3");

    // Disabled by hand from the subscriptions page, and enabled again.
    browser
        .goto(&format!(
            "{}admin/subscriptions?callback=/cb/flaky",
            hub.url
        ))
        .await;
    browser.click("tr.subscription form.disable button").await;
    assert_eq!(browser.path().await, "/admin/endpoints");
    assert!(
        browser
            .text(".notice")
            .await
            .contains(&format!("Disabled {flaky}"))
    );
    let row = browser.text("#endpoints tr.disabled").await;
    assert!(
        row.contains(&flaky) && row.contains("disabled by an operator"),
        "{row}"
    );
    assert_eq!(disabled_endpoints(&hub).await, vec![flaky.clone()]);
    browser
        .goto(&format!(
            "{}admin/subscriptions?callback=/cb/flaky",
            hub.url
        ))
        .await;
    assert_eq!(
        browser.text("tr.subscription td.endpoint a.disabled").await,
        "disabled"
    );
    browser
        .click("tr.subscription td.endpoint a.disabled")
        .await;
    browser
        .click("#endpoints tr.disabled form.enable button")
        .await;
    assert!(disabled_endpoints(&hub).await.is_empty());
    browser
        .goto(&format!(
            "{}admin/subscriptions?callback=/cb/flaky",
            hub.url
        ))
        .await;
    browser.find("tr.subscription form.disable button").await;
    browser.close().await;
}

#[tokio::test]
async fn the_session_cookie_and_the_forms_are_locked_down() {
    let dir = scratch_dir("admin-locks");
    let hub = start_hub(&dir, &["--internal-api-key", INTERNAL_KEY]).await;
    let client = client();

    for page in [
        "admin",
        "admin/topics",
        "admin/subscriptions",
        "admin/failed",
        "admin/deliveries",
        "admin/endpoints",
    ] {
        let answer = client
            .get(format!("{}{page}", hub.url))
            .send()
            .await
            .expect("GET a page");
        assert_eq!(answer.status(), 303, "{page} without a session");
        assert_eq!(answer.headers()[header::LOCATION], "/admin/login");
    }

    let refused = log_in(&hub, "a-wrong-key-of-more-than-32-characters").await;
    assert_eq!(refused.status(), 401);
    assert!(refused.headers().get(header::SET_COOKIE).is_none());
    assert!(
        refused
            .text()
            .await
            .expect("the form again")
            .contains("not an operator key of this hub")
    );

    let accepted = log_in(&hub, INTERNAL_KEY).await;
    assert_eq!(accepted.status(), 303);
    assert_eq!(accepted.headers()[header::LOCATION], "/admin");
    let set_cookie = accepted.headers()[header::SET_COOKIE]
        .to_str()
        .expect("a text cookie")
        .to_owned();
    let attributes: Vec<&str> = set_cookie.split("; ").collect();
    for attribute in [
        "Secure",
        "HttpOnly",
        "SameSite=Strict",
        "Path=/admin",
        "Max-Age=43200",
    ] {
        assert!(
            attributes.contains(&attribute),
            "{attribute} in {set_cookie}"
        );
    }
    let cookie = attributes[0];
    assert!(cookie.starts_with("websub_admin="), "{cookie}");

    let overview = client
        .get(format!("{}admin", hub.url))
        .header(header::COOKIE, cookie)
        .send()
        .await
        .expect("GET the overview");
    assert_eq!(overview.status(), 200);
    assert_eq!(overview.headers()[header::CACHE_CONTROL], "no-store");
    let page = overview.text().await.expect("the overview");
    let token = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token in the page")
        .to_owned();

    let flipped = if cookie.ends_with('0') { '1' } else { '0' };
    let tampered = format!("{}{flipped}", &cookie[..cookie.len() - 1]);
    let answer = client
        .get(format!("{}admin", hub.url))
        .header(header::COOKIE, tampered)
        .send()
        .await
        .expect("GET with a forged cookie");
    assert_eq!(answer.status(), 303, "a forged cookie is no session");

    let retry = |form: Vec<(&'static str, String)>| {
        let url = format!("{}admin/retry", hub.url);
        async move {
            let form: Vec<(&str, &str)> = form
                .iter()
                .map(|(name, value)| (*name, value.as_str()))
                .collect();
            post_form(url, Some(cookie), &form).await
        }
    };
    let subscriber = ("subscriber", "http://127.0.0.1:1/cb".to_owned());
    let without = retry(vec![subscriber.clone()]).await;
    assert_eq!(without.status(), 403, "no CSRF token");
    let wrong = retry(vec![subscriber.clone(), ("csrf", "0".repeat(64))]).await;
    assert_eq!(wrong.status(), 403, "another CSRF token");
    assert!(
        wrong
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|value| value.to_str().is_ok_and(|v| v.starts_with("text/plain")))
    );
    let with = retry(vec![subscriber.clone(), ("csrf", token.clone())]).await;
    assert_eq!(with.status(), 303, "the session's token");
    let bad_id = retry(vec![
        subscriber,
        ("csrf", token.clone()),
        ("event_id", "not-a-uuid".to_owned()),
    ])
    .await;
    assert_eq!(bad_id.status(), 400);
    assert!(
        bad_id
            .text()
            .await
            .expect("a reason")
            .contains("not-a-uuid")
    );

    let action = |path: &'static str, form: Vec<(&'static str, &'static str)>| {
        let url = format!("{}admin/{path}", hub.url);
        let token = token.clone();
        async move {
            let mut form: Vec<(&str, &str)> = form;
            form.push(("csrf", &token));
            post_form(url, Some(cookie), &form).await
        }
    };
    let without = post_form(
        format!("{}admin/endpoints/disable", hub.url),
        Some(cookie),
        &[("endpoint", "http://127.0.0.1:1/cb")],
    )
    .await;
    assert_eq!(without.status(), 403, "disabling needs the token");
    for (path, form, reason) in [
        (
            "endpoints/disable",
            vec![("channel", "websub")],
            "endpoint is required",
        ),
        (
            "endpoints/enable",
            vec![("endpoint", "x"), ("channel", "smtp")],
            "channel must be websub or webhook",
        ),
        (
            "replay",
            vec![
                ("topic", TOPIC),
                ("subscriber", "http://127.0.0.1:1/cb"),
                ("since", "yesterday"),
            ],
            "since must be an RFC 3339 time",
        ),
        (
            "redeliver",
            vec![
                ("event_id", "not-a-uuid"),
                ("subscriber", "http://127.0.0.1:1/cb"),
            ],
            "not-a-uuid",
        ),
    ] {
        let answer = action(path, form).await;
        assert_eq!(answer.status(), 400, "{path}");
        let text = answer.text().await.expect("a reason");
        assert!(text.contains(reason), "{path}: {text}");
    }

    let logout = post_form(format!("{}admin/logout", hub.url), Some(cookie), &[]).await;
    assert_eq!(logout.status(), 403, "logging out needs the token too");
}

#[tokio::test]
async fn a_hub_without_an_internal_key_closes_the_admin_page() {
    let dir = scratch_dir("admin-closed");
    let hub = start_hub(&dir, &[]).await;
    for answer in [
        client()
            .get(format!("{}admin", hub.url))
            .send()
            .await
            .expect("GET"),
        client()
            .get(format!("{}admin/login", hub.url))
            .send()
            .await
            .expect("GET"),
        log_in(&hub, INTERNAL_KEY).await,
    ] {
        assert_eq!(answer.status(), 403);
        assert!(
            answer
                .text()
                .await
                .expect("a reason")
                .contains("no operator key configured")
        );
    }
}
