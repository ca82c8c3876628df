//! PostgreSQL restarted (`pg_ctl restart -m fast`) under a running `websubd`:
//! during a fan-out and while verifications are pending, nothing the hub
//! acknowledged is lost. One test in its own binary, because the restart
//! cuts every connection to the server, other tests' too.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use common::{Websubd, distinct_callbacks, free_port, scratch_dir};
use websub_store::{Subscription, SubscriptionStore};
use websub_tests::{Answer, INTERNAL_KEY, Route, TestSubscriber, http_client};

/// How to restart the test server, from `.ci/servers`.
struct Restarter {
    pg_ctl: String,
    data: String,
    log: String,
}

impl Restarter {
    fn from_env() -> Option<Self> {
        let var = |name: &str| std::env::var(name).ok();
        match (
            var("WEBSUB_TEST_PG_CTL"),
            var("WEBSUB_TEST_PG_DATA"),
            var("WEBSUB_TEST_PG_LOG"),
        ) {
            (Some(pg_ctl), Some(data), Some(log)) => Some(Self { pg_ctl, data, log }),
            _ if std::env::var_os("CI").is_some() => panic!(
                "CI is set but WEBSUB_TEST_PG_CTL, WEBSUB_TEST_PG_DATA or WEBSUB_TEST_PG_LOG is \
                 not: start the servers with .ci/servers"
            ),
            _ => {
                eprintln!(
                    "skipped: no restartable PostgreSQL (source .ci/servers and run \
                     start_test_servers)"
                );
                None
            }
        }
    }

    /// Restarts the server the fast way (connections are cut, the server
    /// shuts down cleanly) and waits until it accepts connections again.
    fn restart(&self) {
        let status = Command::new("runuser")
            .args([
                "-u",
                "postgres",
                "--",
                &self.pg_ctl,
                "restart",
                "-m",
                "fast",
                "-w",
            ])
            .args(["-D", &self.data, "-l", &self.log])
            .status()
            .expect("run pg_ctl");
        assert!(status.success(), "pg_ctl restart failed: {status}");
    }
}

async fn held(store: &dyn SubscriptionStore, topic: &str) -> usize {
    // The store's pool reconnects by itself; a call during the restart fails.
    store
        .list_by_topic(topic)
        .await
        .map(|held| held.len())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_restart_loses_no_delivery_and_no_pending_verification() {
    const SUBSCRIBERS: usize = 2000;
    const REQUESTS: usize = 40;
    let Some(restarter) = Restarter::from_env() else {
        return;
    };
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    let dir = scratch_dir("pg-restart");
    let subscriber = TestSubscriber::start().await;
    subscriber.answer_every_delivery(Answer::status(200).after(Duration::from_millis(20)));
    subscriber.receiver().answer(
        Route::method(Method::GET),
        Answer::echo().after(Duration::from_millis(1500)),
    );
    let store: Arc<dyn SubscriptionStore> = websub_hub::server::open_store(&url)
        .await
        .expect("open the store websubd uses");
    let fan_out = "http://127.0.0.1:9/topics/restart";
    for index in 0..SUBSCRIBERS {
        store
            .save(
                &Subscription::new(fan_out, subscriber.callback(&format!("d{index}")))
                    .with_lease(chrono::Duration::days(1), chrono::Utc::now()),
            )
            .await
            .expect("save a subscription");
    }
    let hub = Websubd::spawn(
        &dir,
        free_port(),
        &[
            "--database-url",
            &url,
            "--allow-private-network",
            "--internal-api-key",
            INTERNAL_KEY,
            "--delivery-concurrency",
            "16",
            "--delivery-timeout",
            "2s",
            "--visibility-timeout",
            "3s",
            "--verification-timeout",
            "3s",
            "--verification-concurrency",
            "4",
            "--poll-interval",
            "200ms",
        ],
    )
    .ready()
    .await;
    let client = http_client();

    // A fan-out in progress.
    assert_eq!(
        hub.fat_ping("http://127.0.0.1:9/topics/restart", "{\"restart\":true}")
            .await,
        202
    );
    // And verifications waiting, a few in flight.
    let verified = "http://127.0.0.1:9/topics/verified";
    for index in 0..REQUESTS {
        let callback = subscriber.callback(&format!("v{index}"));
        let answer = client
            .post(&hub.url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(
                serde_urlencoded::to_string([
                    ("hub.mode", "subscribe"),
                    ("hub.topic", verified),
                    ("hub.callback", &callback),
                ])
                .expect("form"),
            )
            .send()
            .await
            .expect("subscribe");
        assert_eq!(answer.status().as_u16(), 202);
    }
    assert!(
        subscriber
            .wait_until(Duration::from_secs(60), |s| s.deliveries().len() >= 200)
            .await,
        "the fan-out never got going"
    );
    subscriber
        .wait_for_verifications(4, Duration::from_secs(30))
        .await;

    restarter.restart();
    let delivered_at_restart = distinct_callbacks(&subscriber);
    let verified_at_restart = held(&*store, verified).await;
    assert!(
        delivered_at_restart < SUBSCRIBERS && verified_at_restart < REQUESTS,
        "the work finished before the restart ({delivered_at_restart} delivered, \
         {verified_at_restart} verified); the test proves nothing"
    );

    let all_delivered = subscriber
        .wait_until(Duration::from_secs(120), |s| {
            distinct_callbacks(s) >= SUBSCRIBERS
        })
        .await;
    assert!(
        all_delivered,
        "only {} of {SUBSCRIBERS} subscribers were delivered to after the restart",
        distinct_callbacks(&subscriber)
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut subscribed = held(&*store, verified).await;
    while subscribed < REQUESTS && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        subscribed = held(&*store, verified).await;
    }
    assert_eq!(
        subscribed, REQUESTS,
        "{verified_at_restart} verified at the restart, {subscribed} of {REQUESTS} after it"
    );
    drop(hub);
}
