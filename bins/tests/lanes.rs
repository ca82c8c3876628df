//! The delivery scheduler against the real `websubd`, on its own defaults
//! unless a case says why not: a host with a hundred thousand records does
//! not hold up small hosts beside it; a host's in-flight limit rises while
//! it answers quickly and falls when it slows down; `Retry-After` is
//! honoured; a callback that is down for a while gets everything once it is
//! back, with no operator; and a restart takes over its predecessor's
//! claims at once.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use common::{Websubd, free_port, save_subscriptions, scratch_dir};
use websub_tests::{Answer, TestSubscriber, serve_on_loopback};

fn sqlite_url(dir: &std::path::Path) -> String {
    format!("sqlite:{}", dir.join("hub.db").display())
}

async fn start(database_url: &str, extra: &[&str]) -> Websubd {
    let dir = scratch_dir("lanes");
    let mut arguments = vec![
        "--database-url",
        database_url,
        "--allow-private-network",
        "--internal-api-key",
        websub_tests::INTERNAL_KEY,
    ];
    arguments.extend_from_slice(extra);
    Websubd::spawn(&dir, free_port(), &arguments).ready().await
}

/// Counts what a receiver gets: requests in all, and the most in flight at
/// once since the count was last reset.
#[derive(Default)]
struct Load {
    received: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// Each answer waits this many milliseconds.
    delay_ms: AtomicUsize,
}

impl Load {
    fn reset_most(&self) -> usize {
        self.most_in_flight.swap(0, Ordering::SeqCst)
    }
}

/// A receiver on 127.0.0.1 that answers every POST 204 after `load`'s
/// delay, counting.
async fn counting_receiver(load: Arc<Load>) -> websub_tests::LoopbackServer {
    let app = Router::new().fallback(post(move || {
        let load = load.clone();
        async move {
            let now = load.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            load.most_in_flight.fetch_max(now, Ordering::SeqCst);
            let delay = load.delay_ms.load(Ordering::SeqCst) as u64;
            tokio::time::sleep(Duration::from_millis(delay)).await;
            load.in_flight.fetch_sub(1, Ordering::SeqCst);
            load.received.fetch_add(1, Ordering::SeqCst);
            StatusCode::NO_CONTENT
        }
    }));
    serve_on_loopback(app).await
}

async fn wait_for(limit: Duration, condition: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    condition()
}

async fn a_big_host_does_not_hold_up_small_ones(database_url: String) {
    let big = Arc::new(Load::default());
    // Slow enough that its hundred thousand records take minutes.
    big.delay_ms.store(50, Ordering::SeqCst);
    let big_server = counting_receiver(big.clone()).await;
    let small = Arc::new(Load::default());
    let topic = "http://127.0.0.1:9/lanes/big-and-small";
    let mut callbacks: Vec<String> = (0..100_000)
        .map(|i| format!("http://{}/cb/{i}", big_server.address))
        .collect();
    // Twenty small hosts, each a server (a port) of its own, five
    // subscriptions each.
    let mut small_servers = Vec::new();
    let mut small_all = Vec::new();
    for _ in 0..20 {
        let server = counting_receiver(small.clone()).await;
        for i in 0..5 {
            small_all.push(format!("http://{}/cb/{i}", server.address));
        }
        small_servers.push(server);
    }
    callbacks.extend(small_all.iter().cloned());
    save_subscriptions(&database_url, topic, callbacks).await;
    let hub = start(&database_url, &[]).await;
    let pinged = Instant::now();
    assert_eq!(hub.fat_ping(topic, "{\"n\":1}").await, 202);
    assert!(
        wait_for(Duration::from_secs(30), || small
            .received
            .load(Ordering::SeqCst)
            >= 100)
        .await,
        "the small hosts got {} of 100 while the big one got {}",
        small.received.load(Ordering::SeqCst),
        big.received.load(Ordering::SeqCst)
    );
    let took = pinged.elapsed();
    let big_done = big.received.load(Ordering::SeqCst);
    eprintln!("small hosts done in {took:?}; the big host had {big_done} of 100 000");
    assert!(
        big_done < 50_000,
        "the big host is meant to be still at work ({big_done})"
    );
    assert!(
        big.most_in_flight.load(Ordering::SeqCst) <= 32,
        "the big host's in-flight stays within the per-host cap"
    );
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_big_host_does_not_hold_up_small_ones_on_sqlite() {
    let dir = scratch_dir("lanes-big");
    a_big_host_does_not_hold_up_small_ones(sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_big_host_does_not_hold_up_small_ones_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    a_big_host_does_not_hold_up_small_ones(url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hosts_limit_rises_while_it_is_quick_and_falls_when_it_slows() {
    let load = Arc::new(Load::default());
    load.delay_ms.store(2, Ordering::SeqCst);
    let server = counting_receiver(load.clone()).await;
    let dir = scratch_dir("lanes-adaptive");
    let database_url = sqlite_url(&dir);
    let topic = "http://127.0.0.1:9/lanes/adaptive";
    let callbacks: Vec<String> = (0..6_000)
        .map(|i| format!("http://{}/cb/{i}", server.address))
        .collect();
    save_subscriptions(&database_url, topic, callbacks).await;
    let hub = start(&database_url, &[]).await;

    assert_eq!(hub.fat_ping(topic, "{\"n\":1}").await, 202);
    assert!(
        wait_for(Duration::from_secs(60), || load
            .received
            .load(Ordering::SeqCst)
            >= 1_500)
        .await
    );
    let quick = load.reset_most();
    eprintln!("quick host: at most {quick} in flight");
    assert!(
        quick > 8,
        "a host answering quickly earns more than the first 8 slots ({quick})"
    );

    // Mid fan-out, the host slows down: from 2 ms to 400 ms an answer.
    load.delay_ms.store(400, Ordering::SeqCst);
    // The first rounds went out at the quick limit; each round of slow
    // answers cuts it. What is in flight a few rounds on is the slowed
    // limit.
    tokio::time::sleep(Duration::from_secs(4)).await;
    load.reset_most();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let slowed = load.reset_most();
    eprintln!("slowed host: at most {slowed} in flight");
    assert!(
        slowed <= 4,
        "a host that slowed down gets fewer at once ({slowed}, was {quick})"
    );
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_is_honoured() {
    let subscriber = TestSubscriber::start().await;
    subscriber.answer_deliveries_in_turn(
        "paced",
        [
            Answer::status(429).with_header("Retry-After", "2"),
            Answer::status(204),
        ],
    );
    let dir = scratch_dir("lanes-retry-after");
    let database_url = sqlite_url(&dir);
    let topic = "http://127.0.0.1:9/lanes/retry-after";
    save_subscriptions(&database_url, topic, vec![subscriber.callback("paced")]).await;
    let hub = start(&database_url, &[]).await;
    assert_eq!(hub.fat_ping(topic, "{\"n\":1}").await, 202);
    assert!(
        subscriber
            .wait_until(Duration::from_secs(15), |subscriber| {
                subscriber.deliveries_to("paced").len() == 1
            })
            .await
    );
    let attempts = subscriber
        .receiver()
        .received_where(|received| received.method == axum::http::Method::POST);
    assert_eq!(attempts.len(), 2, "one 429, then the delivery");
    let waited = attempts[1].at - attempts[0].at;
    assert!(
        waited >= Duration::from_millis(1_900),
        "the retry waited out Retry-After: {waited:?}"
    );
    drop(hub);
}

/// A host's rate limit: with `--delivery-per-host-rate 20`, a fan-out of
/// 60 to one host is spread over some three seconds, never more than about
/// 20 in a second, where without it the host gets them all at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hosts_rate_limit_paces_its_deliveries() {
    let arrivals = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let app = {
        let arrivals = arrivals.clone();
        Router::new().fallback(post(move || {
            let arrivals = arrivals.clone();
            async move {
                arrivals.lock().expect("arrivals").push(Instant::now());
                StatusCode::NO_CONTENT
            }
        }))
    };
    let server = serve_on_loopback(app).await;
    let dir = scratch_dir("lanes-rate");
    let database_url = sqlite_url(&dir);
    let topic = "http://127.0.0.1:9/lanes/rate";
    let callbacks: Vec<String> = (0..60)
        .map(|i| format!("http://{}/cb/{i}", server.address))
        .collect();
    save_subscriptions(&database_url, topic, callbacks).await;
    let hub = start(&database_url, &["--delivery-per-host-rate", "20"]).await;
    assert_eq!(hub.fat_ping(topic, "{\"n\":1}").await, 202);
    assert!(
        wait_for(Duration::from_secs(20), || arrivals
            .lock()
            .expect("arrivals")
            .len()
            >= 60)
        .await,
        "every delivery arrived"
    );
    let arrivals = arrivals.lock().expect("arrivals").clone();
    let spread = arrivals[59] - arrivals[0];
    eprintln!("60 deliveries at 20 a second took {spread:?}");
    assert!(
        spread >= Duration::from_millis(2_700),
        "paced at 20 a second: {spread:?}"
    );
    let most_in_a_second = arrivals
        .iter()
        .map(|start| {
            arrivals
                .iter()
                .filter(|at| **at >= *start && **at < *start + Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        most_in_a_second <= 22,
        "at most about 20 in any second: {most_in_a_second}"
    );
    drop(hub);
}

/// One callback of two is down (answering 503) for longer than its retries
/// last; it gets every event once it is back, without an operator, and the
/// other one is not held up.
async fn an_outage_heals_without_an_operator(database_url: String) {
    let subscriber = TestSubscriber::start().await;
    subscriber.answer_delivery("flaky", Answer::status(503));
    let topic = "http://127.0.0.1:9/lanes/outage";
    save_subscriptions(
        &database_url,
        topic,
        vec![subscriber.callback("steady"), subscriber.callback("flaky")],
    )
    .await;
    // Two retries a second apart: without the breaker the first events
    // would run out of retries within seconds of the outage.
    let hub = start(
        &database_url,
        &["--delivery-retries", "2", "--delivery-max-backoff", "1s"],
    )
    .await;
    let mut published = 0;
    for n in 0..10 {
        assert_eq!(hub.fat_ping(topic, &format!("{{\"n\":{n}}}")).await, 202);
        published += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Back after about five seconds down, and two more events.
    subscriber.answer_delivery("flaky", Answer::status(204));
    let back = Instant::now();
    for n in 10..12 {
        assert_eq!(hub.fat_ping(topic, &format!("{{\"n\":{n}}}")).await, 202);
        published += 1;
    }
    let all = |name: &str, subscriber: &TestSubscriber| {
        let mut events: Vec<_> = subscriber
            .deliveries_to(name)
            .iter()
            .filter_map(|received| received.header("x-websub-event-id").map(str::to_owned))
            .collect();
        events.sort();
        events.dedup();
        events.len()
    };
    assert!(
        subscriber
            .wait_until(Duration::from_secs(40), |subscriber| all(
                "flaky", subscriber
            ) == published)
            .await,
        "the callback that was down got {} of {published} events",
        all("flaky", &subscriber)
    );
    eprintln!(
        "everything reached the callback {:?} after it was back",
        back.elapsed()
    );
    assert_eq!(all("steady", &subscriber), published);
    let metrics = hub.metrics_text().await;
    assert!(
        metrics.contains("websub_endpoint_changes_total{channel=\"websub\",to=\"open\"}"),
        "the breaker opened: {metrics}"
    );
    assert!(metrics.contains("websub_endpoint_changes_total{channel=\"websub\",to=\"recovered\"}"));
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_heals_without_an_operator_on_sqlite() {
    let dir = scratch_dir("lanes-outage");
    an_outage_heals_without_an_operator(sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_heals_without_an_operator_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    an_outage_heals_without_an_operator(url).await;
}

/// `kill -9` during a fan-out, and a restart on the same database and
/// address: the records the dead process had claimed go out within
/// seconds, not after the visibility timeout (60 s). On PostgreSQL the
/// restarted process takes its predecessor's seat and hands its claims
/// back before serving, rather than after its heartbeat is five seconds
/// old.
async fn a_restart_takes_over_its_predecessors_claims_at_once(
    dir: &std::path::PathBuf,
    database_url: String,
) {
    let load = Arc::new(Load::default());
    load.delay_ms.store(20, Ordering::SeqCst);
    let server = counting_receiver(load.clone()).await;
    let topic = "http://127.0.0.1:9/lanes/restart";
    let callbacks: Vec<String> = (0..2_000)
        .map(|i| format!("http://{}/cb/{i}", server.address))
        .collect();
    save_subscriptions(&database_url, topic, callbacks).await;
    let port = free_port();
    let arguments = [
        "--database-url",
        database_url.as_str(),
        "--allow-private-network",
        "--internal-api-key",
        websub_tests::INTERNAL_KEY,
    ];
    let hub = Websubd::spawn(dir, port, &arguments).ready().await;
    assert_eq!(hub.fat_ping(topic, "{\"n\":1}").await, 202);
    assert!(
        wait_for(Duration::from_secs(20), || load
            .received
            .load(Ordering::SeqCst)
            >= 200)
        .await
    );
    hub.kill_9();
    let before = load.received.load(Ordering::SeqCst);
    assert!(before < 2_000, "the kill came mid fan-out ({before})");
    // Records the dead process held in memory left no claim behind: its
    // successor expands the event again. Those it had written claimed are
    // handed back.
    let claimed = claimed_deliveries(&database_url).await;
    let restarted = Instant::now();
    let hub = Websubd::spawn(dir, port, &arguments).ready().await;
    let metrics = hub.metrics_text().await;
    let taken_over = "websub_claims_taken_over_total{kind=\"delivery\"}";
    eprintln!("{claimed} records claimed by the dead process");
    if database_url.starts_with("postgres") && claimed > 0 {
        assert!(
            metrics.contains(taken_over),
            "the predecessor's claims were handed back before serving: {metrics}"
        );
    }
    let everything = wait_for(Duration::from_secs(20), || {
        load.received.load(Ordering::SeqCst) >= 2_000
    })
    .await;
    let took = restarted.elapsed();
    eprintln!("all delivered {took:?} after the restart");
    assert!(
        everything,
        "{} of 2000",
        load.received.load(Ordering::SeqCst)
    );
    assert!(
        took < Duration::from_secs(15),
        "took over at once: {took:?}"
    );
    drop(hub);
}

/// The delivery records claimed in the PostgreSQL database `database_url`
/// (none counted on SQLite, where a restart takes every claim back).
async fn claimed_deliveries(database_url: &str) -> i64 {
    use sqlx::Connection;
    if !database_url.starts_with("postgres") {
        return 0;
    }
    let mut connection = sqlx::PgConnection::connect(database_url)
        .await
        .expect("connect to the hub's database");
    sqlx::query_scalar(
        "SELECT count(*) FROM websub_deliveries \
         WHERE processed_at IS NULL AND processing_since IS NOT NULL",
    )
    .fetch_one(&mut connection)
    .await
    .expect("count the claimed records")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_takes_over_its_predecessors_claims_at_once_on_sqlite() {
    let dir = scratch_dir("lanes-restart");
    a_restart_takes_over_its_predecessors_claims_at_once(&dir, sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_takes_over_its_predecessors_claims_at_once_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    let dir = scratch_dir("lanes-restart-postgres");
    a_restart_takes_over_its_predecessors_claims_at_once(&dir, url).await;
}
