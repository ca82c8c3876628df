//! Ordered delivery against the real `websubd`, on SQLite and PostgreSQL:
//! a subscription set to ordered (by the operator's CLI) gets its events one
//! at a time, strictly in recording order, and an event that fails holds
//! the ones after it until it is delivered; a subscription beside it on the
//! same host, unordered, gets them at once. The subscriber API sets it on
//! the caller's own subscriptions only.

use crate::common;

use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use common::{Websubd, free_port, save_subscriptions, scratch_dir};
use tokio::process::Command;
use websub_tests::{INTERNAL_KEY, serve_on_loopback};

/// What one callback path saw: every attempt's event number in arrival
/// order, the numbers it accepted, and the most attempts in flight at once.
#[derive(Default)]
struct Seen {
    attempts: Vec<u64>,
    accepted: Vec<u64>,
    in_flight: usize,
    most_in_flight: usize,
    /// Failures still to give event `fail_event`.
    failures_left: usize,
}

#[derive(Clone)]
struct Receiver {
    paths: Arc<Mutex<std::collections::HashMap<String, Seen>>>,
    fail_event: u64,
}

impl Receiver {
    fn seen<T>(&self, path: &str, read: impl FnOnce(&Seen) -> T) -> T {
        let paths = self.paths.lock().expect("receiver state");
        read(paths.get(path).unwrap_or(&Seen::default()))
    }
}

/// A receiver on 127.0.0.1: each path is a callback; `/ordered` fails
/// `fail_event` `failures` times with `503`, every other attempt answers
/// `204` after a few milliseconds (long enough for attempts to overlap if
/// the hub sent them at once).
async fn receiver(fail_event: u64, failures: usize) -> (Receiver, websub_tests::LoopbackServer) {
    let receiver = Receiver {
        paths: Arc::default(),
        fail_event,
    };
    receiver
        .paths
        .lock()
        .expect("receiver state")
        .entry("/ordered".to_owned())
        .or_default()
        .failures_left = failures;
    let app = Router::new()
        .fallback(post(answer))
        .with_state(receiver.clone());
    (receiver, serve_on_loopback(app).await)
}

async fn answer(State(receiver): State<Receiver>, uri: axum::http::Uri, body: Bytes) -> StatusCode {
    let n = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|value| value["n"].as_u64())
        .unwrap_or(u64::MAX);
    let path = uri.path().to_owned();
    let fail = {
        let mut paths = receiver.paths.lock().expect("receiver state");
        let seen = paths.entry(path.clone()).or_default();
        seen.attempts.push(n);
        seen.in_flight += 1;
        seen.most_in_flight = seen.most_in_flight.max(seen.in_flight);
        let fail = n == receiver.fail_event && seen.failures_left > 0;
        if fail {
            seen.failures_left -= 1;
        }
        fail
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut paths = receiver.paths.lock().expect("receiver state");
    let seen = paths.entry(path).or_default();
    seen.in_flight -= 1;
    if fail {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        seen.accepted.push(n);
        StatusCode::NO_CONTENT
    }
}

async fn websub(hub: &str, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_websub"));
    command
        .args(args)
        .env("WEBSUB_HUB", hub)
        .env("WEBSUB_INTERNAL_API_KEY", INTERNAL_KEY)
        .env_remove("DATABASE_URL");
    command.output().await.expect("run websub")
}

async fn a_failing_event_holds_the_ones_after_it(database_url: String) {
    const EVENTS: u64 = 20;
    let (seen, server) = receiver(5, 3).await;
    let ordered = format!("http://{}/ordered", server.address);
    let unordered = format!("http://{}/unordered", server.address);
    let topic = "http://127.0.0.1:9/ordered/topic";
    save_subscriptions(
        &database_url,
        topic,
        vec![ordered.clone(), unordered.clone()],
    )
    .await;
    let dir = scratch_dir("ordered");
    let hub = Websubd::on_database(
        &dir,
        &database_url,
        // Retries a second apart at most: the failing event is delivered
        // on its fourth attempt within a few seconds.
        &["--delivery-max-backoff", "1s"],
    )
    .await;

    let set = websub(
        &hub.url,
        &[
            "subscriptions",
            "delivery",
            "--topic",
            topic,
            "--callback",
            &ordered,
            "ordered",
        ],
    )
    .await;
    assert!(
        set.status.success(),
        "websub subscriptions delivery: {}",
        String::from_utf8_lossy(&set.stderr)
    );
    assert!(
        String::from_utf8_lossy(&set.stdout).contains("one at a time"),
        "{}",
        String::from_utf8_lossy(&set.stdout)
    );
    let shown = websub(
        &hub.url,
        &[
            "subscriptions",
            "show",
            "--topic",
            topic,
            "--callback",
            &ordered,
            "--json",
        ],
    )
    .await;
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("show as JSON");
    assert_eq!(shown["ordered"], true, "{shown}");

    for n in 0..EVENTS {
        assert_eq!(hub.fat_ping(topic, &format!("{{\"n\":{n}}}")).await, 202);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline
        && (seen.seen("/ordered", |seen| seen.accepted.len()) < EVENTS as usize
            || seen.seen("/unordered", |seen| seen.accepted.len()) < EVENTS as usize)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (attempts, accepted, most) = seen.seen("/ordered", |seen| {
        (
            seen.attempts.clone(),
            seen.accepted.clone(),
            seen.most_in_flight,
        )
    });
    assert_eq!(
        accepted,
        (0..EVENTS).collect::<Vec<_>>(),
        "the ordered callback accepted its events in recording order (attempts: {attempts:?})"
    );
    assert_eq!(most, 1, "one in flight at a time: {attempts:?}");
    let failing = attempts.iter().filter(|n| **n == 5).count();
    assert_eq!(
        failing, 4,
        "the failing event was tried until delivered: {attempts:?}"
    );
    assert!(
        attempts.windows(2).all(|pair| pair[0] <= pair[1]),
        "nothing after the failing event was sent before it was delivered: {attempts:?}"
    );
    let mut unordered_got = seen.seen("/unordered", |seen| seen.accepted.clone());
    unordered_got.sort_unstable();
    assert_eq!(unordered_got, (0..EVENTS).collect::<Vec<_>>());

    // Back to unordered: the CLI says so, and the API shows it.
    let unset = websub(
        &hub.url,
        &[
            "subscriptions",
            "delivery",
            "--topic",
            topic,
            "--callback",
            &ordered,
            "unordered",
            "--json",
        ],
    )
    .await;
    let unset: serde_json::Value = serde_json::from_slice(&unset.stdout).expect("set as JSON");
    assert_eq!(unset["ordered"], false, "{unset}");
    let bad = websub(
        &hub.url,
        &[
            "subscriptions",
            "delivery",
            "--topic",
            topic,
            "--callback",
            "http://127.0.0.1:9/nobody",
            "ordered",
        ],
    )
    .await;
    assert!(!bad.status.success(), "an unknown subscription is refused");
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_event_holds_the_ones_after_it_on_sqlite() {
    let dir = scratch_dir("ordered-sqlite");
    a_failing_event_holds_the_ones_after_it(format!("sqlite:{}", dir.join("hub.db").display()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_event_holds_the_ones_after_it_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    a_failing_event_holds_the_ones_after_it(url).await;
}

/// The subscriber API sets ordered delivery on the caller's own
/// subscriptions, and answers someone else's as missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_orders_its_own_subscriptions_only() {
    const TOKEN_KEY: &str = "the key user tokens are signed with";
    let dir = scratch_dir("ordered-subscriber");
    let database_url = format!("sqlite:{}", dir.join("hub.db").display());
    let topic = "http://127.0.0.1:9/ordered/own";
    let store = websub_hub::server::open_store(&database_url)
        .await
        .expect("open the store websubd will use");
    for (callback, owner) in [
        ("http://127.0.0.1:9/alice", "alice"),
        ("http://127.0.0.1:9/bob", "bob"),
    ] {
        let mut subscription = websub_store::Subscription::new(topic, callback);
        subscription.owner = Some(owner.to_owned());
        store.save(&subscription).await.expect("save");
    }
    drop(store);
    let hub = Websubd::spawn(
        &dir,
        free_port(),
        &[
            "--database-url",
            &database_url,
            "--user-token-key",
            TOKEN_KEY,
        ],
    )
    .ready()
    .await;
    let token =
        websub_hub::web::auth::issue_token(TOKEN_KEY, "alice", None, chrono::TimeDelta::hours(1));
    let client = websub_tests::http_client();
    let put = |callback: &str, body: &'static str| {
        let url = reqwest::Url::parse_with_params(
            &format!("{}api/v1/subscriptions/delivery", hub.url),
            [("topic", topic), ("callback", callback)],
        )
        .expect("a URL");
        client
            .put(url)
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let mine = put("http://127.0.0.1:9/alice", r#"{"ordered": true}"#)
        .await
        .expect("answered");
    assert_eq!(mine.status(), 200);
    let view: serde_json::Value = mine.json().await.expect("JSON");
    assert_eq!(view["ordered"], true, "{view}");
    let listed: serde_json::Value = client
        .get(format!("{}api/v1/subscriptions", hub.url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("answered")
        .json()
        .await
        .expect("JSON");
    assert_eq!(listed[0]["ordered"], true, "{listed}");

    let theirs = put("http://127.0.0.1:9/bob", r#"{"ordered": true}"#)
        .await
        .expect("answered");
    assert_eq!(
        theirs.status(),
        404,
        "someone else's is answered as missing"
    );
    let bad = put("http://127.0.0.1:9/alice", r#"{"ordered": "yes"}"#)
        .await
        .expect("answered");
    assert_eq!(bad.status(), 400);
    assert!(
        bad.text().await.expect("reason").contains("ordered"),
        "the reason names the field"
    );
    drop(hub);
}
