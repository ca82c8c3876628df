//! The subscriber portal of the real `websubd`, in a real browser (headless
//! Chromium through chromedriver): a subscriber comes in with the link an
//! operator issued (`websub portal-link`), sees its own subscription and not
//! another's, a delivery and its attempts; sends it again, pauses and
//! resumes (what came meanwhile is sent), replays, and rotates its secret;
//! and, over plain HTTP, one subscriber's link cannot read another's
//! subscription, a forged link lets nobody in, and a user token signs in.

use crate::common;

use std::time::Duration;

use chrono::TimeDelta;
use common::browser::Browser;
use common::{Websubd, cookie_set_by, no_redirects, scratch_dir};
use reqwest::header;
use websub_hub::web::auth::issue_token;
use websub_tests::{INTERNAL_KEY, TestSubscriber};

const TOKEN_KEY: &str = "the key user tokens are signed with";
const TOPIC: &str = "http://127.0.0.1:9/portal";
const WAIT: Duration = Duration::from_secs(20);

async fn start_hub(dir: &std::path::Path) -> Websubd {
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    Websubd::on_database(
        &dir.to_path_buf(),
        &database,
        &["--user-token-key", TOKEN_KEY],
    )
    .await
}

/// Subscribes `callback` as `user` and waits until it is held.
async fn subscribe_as(hub: &Websubd, user: &str, callback: &str) {
    let token = issue_token(TOKEN_KEY, user, None, TimeDelta::minutes(10));
    let extra = [("hub.secret", "a-first-secret")];
    assert_eq!(
        hub.subscribe_with(TOPIC, callback, &extra, Some(&token))
            .await,
        202
    );
    hub.wait_until_held(TOPIC, callback, WAIT).await;
}

/// A portal link for `subscriber`, through the CLI.
fn portal_link(hub: &Websubd, subscriber: &str) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_websub"))
        .args(["portal-link", subscriber, "--ttl", "10m"])
        .env("WEBSUB_HUB", &hub.url)
        .env("WEBSUB_INTERNAL_API_KEY", INTERNAL_KEY)
        .output()
        .expect("run websub");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .expect("the link")
        .to_owned()
}

/// The session cookie a link sets.
async fn enter(link: &str) -> String {
    let answer = no_redirects().get(link).send().await.expect("enter");
    assert_eq!(answer.status(), 303, "{link}");
    cookie_set_by(&answer)
}

async fn get_with(hub: &Websubd, cookie: &str, path: &str) -> (u16, String) {
    let answer = no_redirects()
        .get(format!("{}{path}", hub.url))
        .header(header::COOKIE, cookie)
        .send()
        .await
        .expect("GET a portal page");
    (
        answer.status().as_u16(),
        answer.text().await.expect("a body"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_and_steers_only_its_own_subscriptions_in_the_browser() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = scratch_dir("portal-browser");
    let hub = start_hub(&dir).await;
    let subscriber = TestSubscriber::start().await;
    let alice_callback = subscriber.callback("alice");
    let bob_callback = subscriber.callback("bob");
    subscribe_as(&hub, "alice", &alice_callback).await;
    subscribe_as(&hub, "bob", &bob_callback).await;
    assert_eq!(hub.fat_ping(TOPIC, "{\"n\":1}").await, 202);
    subscriber.wait_for_deliveries("alice", 1, WAIT).await;

    browser.goto(&portal_link(&hub, "alice")).await;
    browser.find("#subscriptions").await;
    assert_eq!(browser.path().await, "/portal");
    let listed = browser.text("#subscriptions").await;
    assert!(listed.contains(&alice_callback), "{listed}");
    assert!(!listed.contains(&bob_callback), "never another's: {listed}");

    browser.click("#subscriptions a").await;
    browser.find("#deliveries").await;
    assert_eq!(browser.text("#state").await, "active");
    assert!(browser.text("#deliveries").await.contains("delivered"));
    browser.click("#deliveries td a").await;
    browser.find("#attempts").await;
    assert!(
        browser.text("#attempts").await.contains("204"),
        "the attempt's status"
    );

    // Send it again.
    browser.goto(&format!("{}portal", hub.url)).await;
    browser.click("#subscriptions a").await;
    browser.click("form.resend button").await;
    assert!(browser.text(".notice").await.contains("again"));
    subscriber.wait_for_deliveries("alice", 2, WAIT).await;

    // Pause; what is published meanwhile comes on resuming.
    browser.click("#pause button").await;
    assert_eq!(browser.text("#state").await, "paused");
    assert_eq!(hub.fat_ping(TOPIC, "{\"n\":2}").await, 202);
    subscriber.wait_for_deliveries("bob", 2, WAIT).await;
    browser.click("#resume button").await;
    assert_eq!(browser.text("#state").await, "active");
    assert!(browser.text(".notice").await.contains("Resumed"));
    subscriber.wait_for_deliveries("alice", 3, WAIT).await;

    // Replay since an hour ago: every event of the topic again.
    browser
        .type_into(
            "#since",
            &(chrono::Utc::now() - TimeDelta::hours(1)).to_rfc3339(),
        )
        .await;
    browser.click("#replay button").await;
    assert!(
        browser
            .text(".notice")
            .await
            .contains("Sending 2 events again")
    );
    subscriber.wait_for_deliveries("alice", 5, WAIT).await;

    // Rotate the secret, with an overlap.
    browser.type_into("#new-secret", "a-second-secret").await;
    browser.click("#secret button").await;
    assert!(
        browser
            .text(".notice")
            .await
            .contains("The secret is replaced")
    );
    assert!(browser.text("#signing").await.contains("signs too until"));
    assert_eq!(hub.fat_ping(TOPIC, "{\"n\":3}").await, 202);
    let latest = subscriber.wait_for_deliveries("alice", 6, WAIT).await;
    let signature = latest
        .last()
        .and_then(|delivery| delivery.header("x-hub-signature"))
        .expect("signed")
        .to_owned();
    let body = latest.last().expect("a delivery").body.clone();
    assert!(
        websub_hub::signature::verify(b"a-second-secret", &body, Some(&signature)),
        "signed with the new secret"
    );
    if let Ok(path) = std::env::var("WEBSUB_PORTAL_SCREENSHOT") {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        std::fs::write(root.join(path), browser.screenshot().await).expect("write the screenshot");
    }
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subscribers_link_cannot_read_anothers_and_a_forged_one_lets_nobody_in() {
    let dir = scratch_dir("portal-http");
    let hub = start_hub(&dir).await;
    let subscriber = TestSubscriber::start().await;
    let alice_callback = subscriber.callback("alice");
    let bob_callback = subscriber.callback("bob");
    subscribe_as(&hub, "alice", &alice_callback).await;
    subscribe_as(&hub, "bob", &bob_callback).await;

    let alice = enter(&portal_link(&hub, "alice")).await;
    let bobs = |path: &str| {
        let query =
            serde_urlencoded::to_string([("topic", TOPIC), ("callback", bob_callback.as_str())])
                .expect("a query");
        format!("{path}?{query}")
    };
    let (status, page) = get_with(&hub, &alice, "portal").await;
    assert_eq!(status, 200);
    assert!(page.contains(&alice_callback) && !page.contains(&bob_callback));
    let (status, _) = get_with(&hub, &alice, &bobs("portal/subscription")).await;
    assert_eq!(status, 404, "bob's subscription is not alice's to read");
    let (_, page) = get_with(&hub, &alice, "portal").await;
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token")
        .to_owned();
    let paused = no_redirects()
        .post(format!("{}portal/pause", hub.url))
        .header(header::COOKIE, &alice)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(
            serde_urlencoded::to_string([
                ("csrf", csrf.as_str()),
                ("topic", TOPIC),
                ("callback", bob_callback.as_str()),
            ])
            .expect("a form"),
        )
        .send()
        .await
        .expect("POST a pause");
    assert_eq!(paused.status(), 404, "nor hers to pause");

    // A link whose subject was changed, or signed with another key, or
    // none at all: no session.
    let link = portal_link(&hub, "alice");
    let forged = link.replace("link=", "link=x");
    let answer = no_redirects().get(&forged).send().await.expect("enter");
    assert_eq!(answer.status(), 403);
    assert!(answer.headers().get(header::SET_COOKIE).is_none());
    let (status, _) = get_with(&hub, "websub_portal=garbage", "portal").await;
    assert_eq!(status, 303, "to the login");

    // A user token signs in for an hour.
    let token = issue_token(TOKEN_KEY, "bob", None, TimeDelta::minutes(10));
    let answer = no_redirects()
        .post(format!("{}portal/login", hub.url))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string([("token", token.as_str())]).expect("a form"))
        .send()
        .await
        .expect("sign in");
    assert_eq!(answer.status(), 303);
    let bob = cookie_set_by(&answer);
    let (_, page) = get_with(&hub, &bob, "portal").await;
    assert!(page.contains(&bob_callback) && !page.contains(&alice_callback));
    let refused = no_redirects()
        .post(format!("{}portal/login", hub.url))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body("token=not-a-token")
        .send()
        .await
        .expect("sign in");
    assert_eq!(refused.status(), 401);
}
