//! Two real `websubd` processes on one PostgreSQL database share a fan-out:
//! one publish of a 10 000-subscriber topic, sent to one of them, reaches
//! every callback exactly once, and both processes deliver a part of it —
//! counted on each process's own `/metrics` and, independently, by the
//! `rel="hub"` link each delivery carries.
//!
//! The process that takes the publish expands the event at once; the other
//! learns of it at its next poll (`--poll-interval`, 1 s by default), finds
//! it still being expanded, and writes the parts not yet written as its own
//! claimed records. Callbacks answer after 25 ms, as a subscriber that
//! writes what it receives does, so the fan-out lasts seconds, not the half
//! second a loopback callback answering at once allows: a fan-out over
//! before the other replica's poll is fairly done by one replica, and
//! proves nothing about sharing.
//!
//! A replica killed with `kill -9` while it holds claims: the other takes
//! them over once the dead one's heartbeat is a few seconds old, and
//! delivers them well inside the visibility timeout.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::routing::post;
use common::prometheus::{scrape, value};
use common::{Websubd, free_port, save_subscriptions, scratch_dir};
use websub_tests::{Answer, INTERNAL_KEY, Received, TestSubscriber, serve_on_loopback};

const SUBSCRIBERS: usize = 10_000;
const TOPIC: &str = "http://127.0.0.1:9/topics/replicas";
const BODY: &str = "{\"shared\":true}";

/// How long a callback takes to answer.
const ANSWER_AFTER: Duration = Duration::from_millis(25);

fn callback_name(index: usize) -> String {
    format!("r{index}")
}

/// What `hub` counts as delivered and as retried on the WebSub channel.
async fn delivered_and_retried(hub: &Websubd) -> (f64, f64) {
    let families = scrape(hub).await;
    let count = |outcome: &str| {
        families.get("websub_deliveries_total").map_or(0.0, |_| {
            value(
                &families,
                "websub_deliveries_total",
                "websub_deliveries_total",
                &["channel=\"websub\"", &format!("outcome=\"{outcome}\"")],
            )
        })
    };
    (count("delivered"), count("retried"))
}

fn is_attempt(received: &Received) -> bool {
    received.method == Method::POST
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_a_fan_out_and_each_callback_gets_the_event_once() {
    let Some(database_url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    subscriber.answer_every_delivery(Answer::status(204).after(ANSWER_AFTER));
    let started = Instant::now();
    save_subscriptions(
        &database_url,
        TOPIC,
        (0..SUBSCRIBERS)
            .map(|index| subscriber.callback(&callback_name(index)))
            .collect(),
    )
    .await;
    eprintln!(
        "saved {SUBSCRIBERS} subscriptions in {:?}",
        started.elapsed()
    );

    // The operator's defaults for everything that decides who delivers
    // what: concurrency, per-host limit, batch size, poll interval.
    let args = [
        "--database-url",
        &database_url,
        "--allow-private-network",
        "--internal-api-key",
        INTERNAL_KEY,
    ];
    // Started together, as replicas are deployed: both migrate the same
    // database at once.
    let first = Websubd::spawn(&scratch_dir("replica-a"), free_port(), &args);
    let second = Websubd::spawn(&scratch_dir("replica-b"), free_port(), &args);
    let (first, second) = (first.ready().await, second.ready().await);

    let published = Instant::now();
    assert_eq!(first.fat_ping(TOPIC, BODY).await, 202);
    let attempts = |s: &TestSubscriber| s.receiver().count_where(is_attempt);
    let all = subscriber
        .wait_until(Duration::from_secs(60), |s| attempts(s) >= SUBSCRIBERS)
        .await;
    let took = published.elapsed();
    assert!(
        all,
        "{} of {SUBSCRIBERS} deliveries within 60 s",
        attempts(&subscriber)
    );
    eprintln!("{SUBSCRIBERS} deliveries {took:?} after the publish");

    // An outcome is counted when its attempt ends, a moment after the
    // callback has the body: wait until both processes have counted all.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (shares, retried) = loop {
        let (a, b) = (
            delivered_and_retried(&first).await,
            delivered_and_retried(&second).await,
        );
        if a.0 + b.0 >= SUBSCRIBERS as f64 || Instant::now() >= deadline {
            break ([a.0, b.0], [a.1, b.1]);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // A duplicate would come late: a retry of an attempt judged failed, or
    // a record claimed again. Two poll intervals give each process's claim
    // loop time to look twice; the wait ends at once if one arrives.
    let duplicated = subscriber
        .wait_until(Duration::from_secs(2), |s| attempts(s) > SUBSCRIBERS)
        .await;

    let received = subscriber.receiver().received_where(is_attempt);
    let mut per_callback: HashMap<&str, usize> = HashMap::new();
    for request in &received {
        *per_callback.entry(request.path.as_str()).or_default() += 1;
    }
    let paths: Vec<String> = (0..SUBSCRIBERS)
        .map(|index| format!("/cb/{}", callback_name(index)))
        .collect();
    let missing: Vec<&String> = paths
        .iter()
        .filter(|path| !per_callback.contains_key(path.as_str()))
        .collect();
    let repeated: Vec<(&str, usize)> = per_callback
        .iter()
        .filter(|(_, count)| **count > 1)
        .map(|(path, count)| (*path, *count))
        .collect();
    assert!(
        !duplicated && missing.is_empty() && repeated.is_empty(),
        "{} attempts: {} callbacks never got the event (first: {:?}), {} got it more than \
         once (first: {:?})",
        received.len(),
        missing.len(),
        missing.first(),
        repeated.len(),
        repeated.first()
    );
    assert_eq!(
        per_callback.len(),
        SUBSCRIBERS,
        "an attempt to an unknown path"
    );
    let event_ids: HashSet<Option<&str>> = received
        .iter()
        .map(|request| request.header("x-websub-event-id"))
        .collect();
    assert_eq!(event_ids.len(), 1, "one event, one id: {event_ids:?}");
    assert!(
        received
            .iter()
            .all(|request| request.succeeded() && &request.body[..] == BODY.as_bytes()),
        "every callback got the published body and answered 2xx"
    );

    // Who sent each delivery, as the subscriber sees it: each process
    // announces its own URL as the hub.
    let sent_by = |hub: &Websubd| {
        let link = format!("<{}>; rel=\"hub\"", hub.url);
        received
            .iter()
            .filter(|request| request.header("link").is_some_and(|l| l.starts_with(&link)))
            .count()
    };
    let seen = [sent_by(&first), sent_by(&second)];
    eprintln!(
        "shares: the publish's process {} ({} seen), the other {} ({} seen); retried {retried:?}",
        shares[0], seen[0], shares[1], seen[1]
    );
    assert_eq!(
        retried,
        [0.0, 0.0],
        "every callback answered 2xx, so nothing is retried"
    );
    assert_eq!(
        shares[0] + shares[1],
        SUBSCRIBERS as f64,
        "the processes' delivered counters add up to the fan-out"
    );
    assert_eq!(
        seen.map(|count| count as f64),
        shares,
        "each process's counter matches the deliveries carrying its hub link"
    );
    assert!(
        shares[0] > 0.0,
        "the process that took the publish delivered none of it"
    );
    assert!(
        shares[1] > 0.0,
        "the other process delivered none of a fan-out that lasted {took:?}: it never joined"
    );
}

/// A callback host that holds every request while `holding`, as a
/// subscriber that hangs does, and otherwise answers 204 at once, keeping
/// which paths it answered and which hub (the `rel="hub"` link) sent each.
#[derive(Default)]
struct Hanging {
    holding: AtomicBool,
    held: AtomicUsize,
    answered: Mutex<Vec<(String, String)>>,
}

async fn hanging_host(host: Arc<Hanging>) -> websub_tests::LoopbackServer {
    let app = Router::new().fallback(post(move |uri: Uri, headers: HeaderMap| {
        let host = host.clone();
        async move {
            if host.holding.load(Ordering::SeqCst) {
                host.held.fetch_add(1, Ordering::SeqCst);
                // Longer than the test: the request never gets its answer.
                tokio::time::sleep(Duration::from_secs(300)).await;
                return StatusCode::SERVICE_UNAVAILABLE;
            }
            let link = headers
                .get("link")
                .and_then(|link| link.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            host.answered
                .lock()
                .expect("answers")
                .push((uri.path().to_owned(), link));
            StatusCode::NO_CONTENT
        }
    }));
    serve_on_loopback(app).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_fan_out_is_delivered_by_the_other_within_seconds() {
    const FAN_OUT: usize = 20;
    let Some(database_url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    let host = Arc::new(Hanging::default());
    host.holding.store(true, Ordering::SeqCst);
    let server = hanging_host(host.clone()).await;
    let topic = "http://127.0.0.1:9/topics/replica-dies";
    let paths: Vec<String> = (0..FAN_OUT).map(|i| format!("/cb/{i}")).collect();
    save_subscriptions(
        &database_url,
        topic,
        paths
            .iter()
            .map(|path| format!("http://{}{path}", server.address))
            .collect(),
    )
    .await;
    // The defaults: the visibility timeout is 60 s.
    let args = [
        "--database-url",
        &database_url,
        "--allow-private-network",
        "--internal-api-key",
        INTERNAL_KEY,
    ];
    let doomed = Websubd::spawn(&scratch_dir("replica-doomed"), free_port(), &args)
        .ready()
        .await;
    assert_eq!(doomed.fat_ping(topic, BODY).await, 202);
    // The replica that took the publish takes its expansion, holding the
    // records in memory until their first outcome, and sends as many as
    // the host's first in-flight limit allows; they hang.
    let in_flight = websub_hub::delivery::websub::INITIAL_LIMIT.min(FAN_OUT);
    let deadline = Instant::now() + Duration::from_secs(20);
    while host.held.load(Ordering::SeqCst) < in_flight {
        assert!(
            Instant::now() < deadline,
            "the doomed replica sent {} of {in_flight}",
            host.held.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The survivor joins while the records are held: the expansion is not
    // its to take while its holder beats.
    let survivor = Websubd::spawn(&scratch_dir("replica-survivor"), free_port(), &args)
        .ready()
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        host.answered.lock().expect("answers").is_empty(),
        "nothing is delivered while the holder lives"
    );
    assert_eq!(host.held.load(Ordering::SeqCst), in_flight);

    host.holding.store(false, Ordering::SeqCst);
    doomed.kill_9();
    let killed = Instant::now();
    let delivered = |host: &Hanging| {
        host.answered
            .lock()
            .expect("answers")
            .iter()
            .map(|(path, _)| path.clone())
            .collect::<HashSet<String>>()
            .len()
    };
    while delivered(&host) < FAN_OUT && killed.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = killed.elapsed();
    eprintln!("the survivor delivered the dead replica's fan-out {took:?} after the kill");
    assert_eq!(
        delivered(&host),
        FAN_OUT,
        "every record of the fan-out delivered: nothing lost"
    );
    assert!(
        took < Duration::from_secs(10),
        "taken over within seconds, not after the 60 s visibility timeout: {took:?}"
    );
    let answered = host.answered.lock().expect("answers").clone();
    let survivor_link = format!("<{}>; rel=\"hub\"", survivor.url);
    assert!(
        answered
            .iter()
            .all(|(_, link)| link.starts_with(&survivor_link)),
        "the survivor sent them: {answered:?}"
    );
    let families = scrape(&survivor).await;
    let taken_over = value(
        &families,
        "websub_claims_taken_over_total",
        "websub_claims_taken_over_total",
        &["kind=\"expansion\""],
    );
    assert_eq!(
        taken_over, 1.0,
        "the survivor counted the expansion it took over"
    );

    // A clean stop leaves the registry: the dead one was removed by the
    // takeover, the survivor removes itself.
    let mut survivor = survivor;
    let status = survivor.terminate();
    assert!(status.success(), "websubd exited with {status}");
    let pool = sqlx::PgPool::connect(&database_url)
        .await
        .expect("connect to the hub's database");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM websub_replicas")
        .fetch_one(&pool)
        .await
        .expect("count the replicas");
    assert_eq!(left, 0, "no replica left registered");
}
