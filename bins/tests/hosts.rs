//! Concurrency per callback host, against the real binary: a host that
//! answers slowly, or not at all, holds only its own share of the hub, and
//! the connections kept open to callback hosts are bounded as a whole.
//! Each test subscriber listens on its own loopback port, and a host is a
//! `host:port`, so each is a host of its own to the hub.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::prometheus::{scrape, value};
use common::{Websubd, free_port, save_subscriptions, scratch_dir};
use websub_tests::{Answer, INTERNAL_KEY, TestSubscriber};

const TOPIC: &str = "http://127.0.0.1:9/topics/hosts";

/// websubd on SQLite in a scratch directory named after `name`, callbacks
/// on loopback allowed, with `settings` besides; and its database URL.
async fn start_hub(name: &str, settings: &[&str]) -> (Websubd, String) {
    let dir = scratch_dir(name);
    let database = format!("sqlite://{}?mode=rwc", dir.join("hub.db").display());
    let mut args = vec![
        "--database-url",
        &database,
        "--allow-private-network",
        "--internal-api-key",
        INTERNAL_KEY,
    ];
    args.extend_from_slice(settings);
    let hub = Websubd::spawn(&dir, free_port(), &args).ready().await;
    (hub, database)
}

/// Two subscribers, the one whose callbacks sort first (the order the
/// store lists them, and so the order a fan-out reaches them) first.
async fn two_subscribers() -> (TestSubscriber, TestSubscriber) {
    let (a, b) = (TestSubscriber::start().await, TestSubscriber::start().await);
    if a.callback("x") < b.callback("x") {
        (a, b)
    } else {
        (b, a)
    }
}

/// What the hub counts on the WebSub channel as `outcome`.
async fn counted(hub: &Websubd, outcome: &str) -> f64 {
    let families = scrape(hub).await;
    if !families.contains_key("websub_deliveries_total") {
        return 0.0;
    }
    value(
        &families,
        "websub_deliveries_total",
        "websub_deliveries_total",
        &["channel=\"websub\"", &format!("outcome=\"{outcome}\"")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_host_with_many_records_does_not_hold_up_the_hosts_after_it() {
    let (slow, fast) = two_subscribers().await;
    slow.answer_every_delivery(Answer::status(204).after(Duration::from_millis(300)));
    fast.answer_every_delivery(Answer::status(204));
    // The slow host's 200 records come first. Two at a time, 300 ms each,
    // it needs 30 s; a scheduler whose claimed records queue behind it in
    // one line would reach the fast host's only after most of that.
    let mut callbacks: Vec<String> = (0..200)
        .map(|index| slow.callback(&format!("s{index:03}")))
        .collect();
    callbacks.extend((0..20).map(|index| fast.callback(&format!("f{index:02}"))));
    let (hub, database) = start_hub(
        "slow-host",
        &[
            "--delivery-concurrency",
            "64",
            "--delivery-per-host",
            "2",
            "--delivery-batch-size",
            "10",
        ],
    )
    .await;
    save_subscriptions(&database, TOPIC, callbacks).await;

    let published = Instant::now();
    assert_eq!(hub.fat_ping(TOPIC, "{\"n\":1}").await, 202);
    let fast_done = fast
        .wait_until(Duration::from_secs(10), |s| s.deliveries().len() >= 20)
        .await;
    let took = published.elapsed();
    let slow_so_far = slow.deliveries().len();
    assert!(
        fast_done,
        "the fast host had {} of 20 deliveries after 10 s",
        fast.deliveries().len()
    );
    assert!(
        took < Duration::from_secs(5),
        "the fast host's 20 deliveries took {took:?}, behind the slow host's"
    );
    assert!(
        slow_so_far < 100,
        "the slow host had {slow_so_far} of 200 when the fast one was done: not a fair test"
    );
    eprintln!("fast host done {took:?} after the publish; slow host at {slow_so_far}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_a_dead_host_cannot_take_in_time_are_postponed_not_failed() {
    let (dead, healthy) = two_subscribers().await;
    dead.answer_every_delivery(Answer::never());
    healthy.answer_every_delivery(Answer::status(204));
    let dead_names: Vec<String> = (0..4).map(|index| format!("d{index}")).collect();
    let mut callbacks: Vec<String> = dead_names.iter().map(|name| dead.callback(name)).collect();
    callbacks.extend((0..4).map(|index| healthy.callback(&format!("h{index}"))));
    // One slot per host and a 2 s timeout: the dead host's first record
    // holds its slot for 2 s while the other three wait; with a 6 s
    // visibility timeout they may wait 2 s, so they go back to the log.
    // No retries: a record counted as failed without its own attempt
    // would be exhausted with no request to show for it.
    let (hub, database) = start_hub(
        "dead-host",
        &[
            "--delivery-per-host",
            "1",
            "--delivery-timeout",
            "2s",
            "--visibility-timeout",
            "6s",
            "--delivery-retries",
            "0",
            "--poll-interval",
            "200ms",
        ],
    )
    .await;
    save_subscriptions(&database, TOPIC, callbacks).await;

    assert_eq!(hub.fat_ping(TOPIC, "{\"n\":1}").await, 202);
    assert!(
        healthy
            .wait_until(Duration::from_secs(5), |s| s.deliveries().len() >= 4)
            .await,
        "the healthy host's deliveries waited for the dead host"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while counted(&hub, "exhausted").await < 4.0 {
        assert!(
            Instant::now() < deadline,
            "{} of the dead host's 4 records exhausted after 60 s",
            counted(&hub, "exhausted").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for name in &dead_names {
        assert_eq!(
            dead.attempts(name),
            1,
            "{name}: exhausted after {} attempts; one was allowed",
            dead.attempts(name)
        );
    }
    let postponed = counted(&hub, "postponed").await;
    assert!(
        postponed >= 1.0,
        "no record was postponed while waiting for the dead host"
    );
    assert_eq!(counted(&hub, "retried").await, 0.0);
    eprintln!("dead host: 4 exhausted after one attempt each, {postponed} postponements");
}

/// A callback host that counts the connections open to it.
struct CountingHost {
    address: SocketAddr,
    open: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
}

/// Decrements the open count when a connection ends.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl CountingHost {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let address = listener.local_addr().expect("its address");
        let open = Arc::new(AtomicUsize::new(0));
        let served = Arc::new(AtomicUsize::new(0));
        let (counter, answered) = (open.clone(), served.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let open = Open(counter.clone());
                let answered = answered.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_request| {
                        answered.fetch_add(1, Ordering::SeqCst);
                        async {
                            Ok::<_, Infallible>(
                                hyper::Response::builder()
                                    .status(204)
                                    .body(String::new())
                                    .expect("a response"),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                    drop(open);
                });
            }
        });
        Self {
            address,
            open,
            served,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_callback_hosts_are_bounded_as_a_whole() {
    let mut hosts = Vec::new();
    for _ in 0..6 {
        hosts.push(CountingHost::start().await);
    }
    // Room for two idle connections in all, one per host: after a fan-out
    // to six hosts, four hosts' connections are closed although each is
    // well within the 90 s a connection may stay idle.
    let (hub, database) = start_hub(
        "idle-bound",
        &[
            "--delivery-per-host",
            "1",
            "--delivery-idle-connections",
            "2",
        ],
    )
    .await;
    let callbacks = hosts
        .iter()
        .map(|host| format!("http://{}/cb", host.address))
        .collect();
    save_subscriptions(&database, TOPIC, callbacks).await;

    let open = |hosts: &[CountingHost]| {
        hosts
            .iter()
            .map(|host| host.open.load(Ordering::SeqCst))
            .sum::<usize>()
    };
    for round in 1..=3 {
        assert_eq!(hub.fat_ping(TOPIC, "{\"n\":1}").await, 202);
        let deadline = Instant::now() + Duration::from_secs(10);
        while hosts
            .iter()
            .any(|host| host.served.load(Ordering::SeqCst) < round)
        {
            assert!(Instant::now() < deadline, "round {round} not delivered");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while open(&hosts) > 2 {
            assert!(
                Instant::now() < deadline,
                "{} connections still open after round {round}; 2 may stay idle",
                open(&hosts)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Kept alive within the budget: the last two hosts' connections.
    assert_eq!(open(&hosts), 2, "the idle budget was not used");
}
