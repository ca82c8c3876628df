//! Outbox webhook subscribers' delivery settings through the real
//! `websubd` on a real producer database: an ordered subscriber gets its
//! events one at a time, strictly in recording order, even with two
//! processes on the feed, a failing event holding the ones behind it while
//! an unordered subscriber beside it goes on; an event that runs out of
//! retries is left failed and the next goes; `max_in_flight` caps a
//! subscriber's attempts in flight.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use common::{Websubd, free_port, scratch_dir};
use sqlx::postgres::PgPool;
use websub_hub::delivery::outbox::{Event, Outbox, OutboxTables, ddl};
use websub_tests::serve_on_loopback;

const EVENT_NAME: &str = "ledger.entry.posted";
const WAIT: Duration = Duration::from_secs(60);

/// Entry `n` of a ledger: its number travels in the payload.
struct Posted(u64);

impl Event for Posted {
    fn name(&self) -> &str {
        EVENT_NAME
    }
    fn resource_type(&self) -> &str {
        "entry"
    }
    fn resource_id(&self) -> String {
        self.0.to_string()
    }
    fn event_type(&self) -> &str {
        "posted"
    }
    fn payload(&self) -> Result<serde_json::Value, serde_json::Error> {
        Ok(serde_json::json!({ "n": self.0 }))
    }
}

/// The producer's database, with its outbox tables in schema `ledger`.
struct Producer {
    url: String,
    pool: PgPool,
    outbox: Outbox,
}

impl Producer {
    async fn open() -> Option<Self> {
        websub_hub::delivery::net::install_crypto_provider();
        let url = websub_storetest::servers::fresh_postgres_url().await?;
        let pool = PgPool::connect(&url)
            .await
            .expect("connect to the producer");
        let tables = OutboxTables::in_schema("ledger").expect("valid names");
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl(&tables)))
            .execute(&pool)
            .await
            .expect("create the outbox tables");
        Some(Self {
            url,
            pool,
            outbox: Outbox::new(tables),
        })
    }

    /// Commits entries `range` one after the other, one transaction each,
    /// so that their recording order is their numbers' order.
    async fn produce(&self, range: std::ops::Range<u64>) {
        for n in range {
            let mut tx = self.pool.begin().await.expect("begin");
            self.outbox
                .message(&Posted(n))
                .notify()
                .send(&mut tx)
                .await
                .expect("send");
            tx.commit().await.expect("commit");
        }
    }

    /// websubd's configuration file for a feed of this producer, with
    /// `extra` settings of the feed.
    fn config_file(&self, dir: &Path, webhooks: &Path, extra: &str) -> PathBuf {
        let path = dir.join("websubd.toml");
        let text = format!(
            r#"allow_private_network = true

[[feed]]
database_url = "{url}"
outbox_table = "ledger.outbox"
deliveries_table = "ledger.outbox_deliveries"
webhooks_file = "{webhooks}"
poll_interval = "200ms"
delivery_timeout = "2s"
visibility_timeout = "5s"
{extra}
"#,
            url = self.url,
            webhooks = webhooks.display(),
        );
        std::fs::write(&path, text).expect("write the config");
        path
    }
}

/// What one webhook path saw.
#[derive(Default, Debug)]
struct Seen {
    /// Every attempt's entry number, in arrival order.
    attempts: Vec<u64>,
    /// The entries it accepted, in order.
    accepted: Vec<u64>,
    in_flight: usize,
    most_in_flight: usize,
}

#[derive(Default)]
struct Log {
    paths: HashMap<String, Seen>,
    /// Every acceptance, (path, entry), in order, over all paths.
    accepted: Vec<(String, u64)>,
    /// (path, entry) → failures still to give it (`usize::MAX`: always).
    failures: HashMap<(String, u64), usize>,
}

/// A receiver on 127.0.0.1: every path is a webhook; each attempt takes
/// `delay` (long enough for attempts to overlap if they were sent at once)
/// and is answered `204`, or `503` while its (path, entry) has failures
/// left.
#[derive(Clone)]
struct Receiver {
    log: Arc<Mutex<Log>>,
    changed: Arc<tokio::sync::Notify>,
    delay: Duration,
}

impl Receiver {
    async fn start(
        delay: Duration,
        failures: &[(&str, u64, usize)],
    ) -> (Self, websub_tests::LoopbackServer) {
        let receiver = Self {
            log: Arc::default(),
            changed: Arc::default(),
            delay,
        };
        receiver.lock().failures = failures
            .iter()
            .map(|(path, n, times)| (((*path).to_owned(), *n), *times))
            .collect();
        let app = Router::new()
            .fallback(post(answer))
            .with_state(receiver.clone());
        (receiver, serve_on_loopback(app).await)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn seen<T>(&self, path: &str, read: impl FnOnce(&Seen) -> T) -> T {
        read(self.lock().paths.get(path).unwrap_or(&Seen::default()))
    }

    /// Waits until `path` has accepted `count` entries.
    async fn wait_for(&self, path: &str, count: usize) -> bool {
        let deadline = Instant::now() + WAIT;
        loop {
            let changed = self.changed.notified();
            if self.seen(path, |seen| seen.accepted.len()) >= count {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, changed).await.is_err() {
                return false;
            }
        }
    }
}

async fn answer(State(receiver): State<Receiver>, uri: axum::http::Uri, body: Bytes) -> StatusCode {
    let n = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|value| value["data"]["n"].as_u64())
        .unwrap_or(u64::MAX);
    let path = uri.path().to_owned();
    let fail = {
        let mut log = receiver.lock();
        let seen = log.paths.entry(path.clone()).or_default();
        seen.attempts.push(n);
        seen.in_flight += 1;
        seen.most_in_flight = seen.most_in_flight.max(seen.in_flight);
        match log.failures.get_mut(&(path.clone(), n)) {
            Some(left) if *left > 0 => {
                if *left != usize::MAX {
                    *left -= 1;
                }
                true
            }
            _ => false,
        }
    };
    tokio::time::sleep(receiver.delay).await;
    {
        let mut log = receiver.lock();
        let seen = log.paths.entry(path.clone()).or_default();
        seen.in_flight -= 1;
        if !fail {
            seen.accepted.push(n);
            log.accepted.push((path, n));
        }
    }
    receiver.changed.notify_waiters();
    if fail {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::NO_CONTENT
    }
}

/// A webhooks file entry of [`EVENT_NAME`].
fn entry(subscriber: &str, url: &str, extra: &str) -> String {
    format!(
        "[[webhook]]\nevent = \"{EVENT_NAME}\"\nsubscriber = \"{subscriber}\"\nurl = \"{url}\"\n{extra}\n"
    )
}

/// Two `websubd` processes on one feed: `ledger` (ordered) has entry 10
/// fail three times, `audit` (ordered) has entry 5 fail every time until
/// it runs out of retries, `search` (unordered) gets everything at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ordered_webhook_gets_its_events_in_recording_order_one_at_a_time() {
    const EVENTS: u64 = 30;
    let Some(producer) = Producer::open().await else {
        return;
    };
    let (receiver, server) = Receiver::start(
        Duration::from_millis(5),
        &[("/ledger", 10, 3), ("/audit", 5, usize::MAX)],
    )
    .await;
    let url = |path: &str| format!("http://{}/{path}", server.address);
    let mut hubs = Vec::new();
    for name in ["first", "second"] {
        let dir = scratch_dir(&format!("ordered-webhooks-{name}"));
        let webhooks = dir.join("webhooks.toml");
        let text = [
            entry("ledger", &url("ledger"), "ordered = true"),
            entry("audit", &url("audit"), "ordered = true"),
            entry("search", &url("search"), ""),
        ]
        .concat();
        std::fs::write(&webhooks, text).expect("write the webhooks file");
        // Retries wait 0, 250 ms, 500 ms, then 1 s: entry 10's three
        // failures hold the ledger's line for about 750 ms.
        let config = producer.config_file(
            &dir,
            &webhooks,
            "delivery_retries = 4\ndelivery_max_backoff = \"1s\"",
        );
        let config = config.display().to_string();
        hubs.push(
            Websubd::spawn(&dir, free_port(), &["--config", &config])
                .ready()
                .await,
        );
    }
    producer.produce(0..EVENTS).await;

    assert!(
        receiver.wait_for("/ledger", EVENTS as usize).await,
        "the ledger gets every entry: {:?}",
        receiver.seen("/ledger", |seen| seen.accepted.clone())
    );
    assert!(receiver.wait_for("/search", EVENTS as usize).await);
    assert!(receiver.wait_for("/audit", EVENTS as usize - 1).await);

    let all: Vec<u64> = (0..EVENTS).collect();
    receiver.seen("/ledger", |seen| {
        assert_eq!(seen.accepted, all, "in recording order");
        assert_eq!(seen.most_in_flight, 1, "one at a time");
        // Entry 10 was tried four times in a row, and nothing after it
        // before it was delivered.
        let mut expected: Vec<u64> = (0..10).collect();
        expected.extend([10, 10, 10]);
        expected.extend(10..EVENTS);
        assert_eq!(seen.attempts, expected, "the failing entry holds the rest");
    });
    // The unordered subscriber went on meanwhile: it had every entry
    // before the ledger's entry 10 went through.
    {
        let log = receiver.lock();
        let position = |path: &str, n: u64| {
            log.accepted
                .iter()
                .position(|(at, entry)| at == path && *entry == n)
        };
        let search_done = (0..EVENTS)
            .filter_map(|n| position("/search", n))
            .max()
            .expect("search got entries");
        let ledger_10 = position("/ledger", 10).expect("the ledger got entry 10");
        assert!(
            search_done < ledger_10,
            "the unordered subscriber is not held by the ordered one's failure"
        );
        assert!(
            log.paths["/search"].most_in_flight > 1,
            "search is unordered"
        );
    }
    // Entry 5 ran out of retries (the breaker is off): it is left failed,
    // as the messaging contract has it, and the audit's line went on.
    receiver.seen("/audit", |seen| {
        let expected: Vec<u64> = (0..EVENTS).filter(|n| *n != 5).collect();
        assert_eq!(seen.accepted, expected);
        assert_eq!(seen.most_in_flight, 1);
        assert_eq!(seen.attempts.iter().filter(|n| **n == 5).count(), 5);
        let first_6 = seen.attempts.iter().position(|n| *n == 6);
        let last_5 = seen.attempts.iter().rposition(|n| *n == 5);
        assert!(last_5 < first_6, "entry 6 waited for entry 5 to run out");
    });
    let (retries, error): (i32, Option<String>) = sqlx::query_as(
        "SELECT d.retry_count, d.last_error FROM ledger.outbox_deliveries AS d \
         JOIN ledger.outbox AS o ON o.id = d.event_id \
         WHERE d.subscriber = 'audit' AND o.resource_id = '5'",
    )
    .fetch_one(&producer.pool)
    .await
    .expect("audit's row of entry 5");
    assert_eq!(retries, 5, "every attempt counted");
    assert!(
        error.as_deref().is_some_and(|error| error.contains("503")),
        "{error:?}"
    );
    drop(hubs);
}

/// `max_in_flight = 2` keeps a subscriber to two attempts at once while
/// one beside it, on the feed's default, has more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_in_flight_caps_a_webhook_subscribers_concurrency() {
    const EVENTS: u64 = 24;
    let Some(producer) = Producer::open().await else {
        return;
    };
    let (receiver, server) = Receiver::start(Duration::from_millis(100), &[]).await;
    let url = |path: &str| format!("http://{}/{path}", server.address);
    let dir = scratch_dir("webhooks-max-in-flight");
    let webhooks = dir.join("webhooks.toml");
    let text = [
        entry("capped", &url("capped"), "max_in_flight = 2"),
        entry("free", &url("free"), ""),
    ]
    .concat();
    std::fs::write(&webhooks, text).expect("write the webhooks file");
    let config = producer.config_file(&dir, &webhooks, "");
    let config = config.display().to_string();
    let hub = Websubd::spawn(&dir, free_port(), &["--config", &config])
        .ready()
        .await;
    producer.produce(0..EVENTS).await;
    assert!(receiver.wait_for("/capped", EVENTS as usize).await);
    assert!(receiver.wait_for("/free", EVENTS as usize).await);
    assert_eq!(
        receiver.seen("/capped", |seen| seen.most_in_flight),
        2,
        "capped at two, and using both"
    );
    assert!(receiver.seen("/free", |seen| seen.most_in_flight) > 2);
    drop(hub);
}

/// With the feed's breaker on, an ordered subscriber whose first entry
/// keeps failing past its retries is not given up on: the breaker opens,
/// the line waits without spending retries, and once the webhook answers
/// every entry arrives, in order. (With the breaker off, two retries would
/// have exhausted entry 0 on its third failure.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ordered_webhook_waits_in_order_while_its_breaker_is_open() {
    const EVENTS: u64 = 6;
    let Some(producer) = Producer::open().await else {
        return;
    };
    let (receiver, server) = Receiver::start(Duration::from_millis(5), &[("/ledger", 0, 3)]).await;
    let dir = scratch_dir("ordered-webhooks-breaker");
    let webhooks = dir.join("webhooks.toml");
    let ledger = format!("http://{}/ledger", server.address);
    std::fs::write(&webhooks, entry("ledger", &ledger, "ordered = true"))
        .expect("write the webhooks file");
    let config = producer.config_file(
        &dir,
        &webhooks,
        "delivery_retries = 2\ndelivery_max_backoff = \"200ms\"\nbreaker_open_after = 2",
    );
    let config = config.display().to_string();
    let hub = Websubd::spawn(&dir, free_port(), &["--config", &config])
        .ready()
        .await;
    producer.produce(0..EVENTS).await;
    assert!(
        receiver.wait_for("/ledger", EVENTS as usize).await,
        "every entry arrives: {:?}",
        receiver.seen("/ledger", |seen| seen.attempts.clone())
    );
    receiver.seen("/ledger", |seen| {
        assert_eq!(seen.accepted, (0..EVENTS).collect::<Vec<_>>());
        assert_eq!(seen.most_in_flight, 1);
        let mut expected = vec![0, 0, 0];
        expected.extend(0..EVENTS);
        assert_eq!(seen.attempts, expected, "nothing passed entry 0");
    });
    drop(hub);
}
