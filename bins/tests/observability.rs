//! What an operator reads off the real `websubd`: `/metrics` in the
//! Prometheus text format with `# HELP` and `# TYPE` for every family and
//! the delivery, latency and request metrics after a delivery; `/readyz`
//! answering 200 only while the database answers and is migrated, naming
//! the failed check otherwise; and `--log-format json`.

use crate::common;

use std::collections::BTreeSet;
use std::io::BufRead;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::prometheus::{scrape, value};
use common::{DatabaseOutage, Websubd, free_port, scratch_dir};
use sqlx::{AssertSqlSafe, Connection};
use websub_store::{Subscription, SubscriptionStore};
use websub_tests::{Answer, INTERNAL_KEY, TestSubscriber, http_client};

const TOPIC: &str = "http://127.0.0.1:9/topics/observed";

async fn readiness(hub: &Websubd) -> (u16, serde_json::Value) {
    let response = http_client()
        .get(format!("{}readyz", hub.url))
        .send()
        .await
        .expect("readyz");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON readiness"))
}

/// A subscription saved straight into the store websubd opens, and a fat
/// ping for its topic.
async fn deliver_one(hub: &Websubd, database_url: &str, subscriber: &TestSubscriber) {
    let store: Arc<dyn SubscriptionStore> = websub_hub::server::open_store(database_url)
        .await
        .expect("the store websubd uses");
    store
        .save(
            &Subscription::new(TOPIC, subscriber.callback("observed"))
                .with_lease(chrono::Duration::days(1), chrono::Utc::now()),
        )
        .await
        .expect("save");
    assert_eq!(hub.fat_ping(TOPIC, "{\"observed\":true}").await, 202);
    assert!(
        subscriber
            .wait_until(Duration::from_secs(20), |s| s.attempts("observed") > 0)
            .await,
        "the event was never attempted"
    );
}

fn hub_args(database_url: &str) -> Vec<String> {
    [
        "--database-url",
        database_url,
        "--allow-private-network",
        "--internal-api-key",
        INTERNAL_KEY,
    ]
    .map(str::to_owned)
    .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_has_help_and_type_and_a_delivery_is_measured() {
    let dir = scratch_dir("metrics");
    let database_url = format!("sqlite:{}", dir.join("hub.db").display());
    let args = hub_args(&database_url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hub = Websubd::spawn(&dir, free_port(), &args).ready().await;
    let subscriber = TestSubscriber::start().await;
    deliver_one(&hub, &database_url, &subscriber).await;
    // The outcome is counted when the attempt ends, a moment after the
    // callback has the body.
    let deadline = Instant::now() + Duration::from_secs(10);
    let families = loop {
        let families = scrape(&hub).await;
        let delivered = families.get("websub_deliveries_total").map_or(0.0, |_| {
            value(
                &families,
                "websub_deliveries_total",
                "websub_deliveries_total",
                &["channel=\"websub\"", "outcome=\"delivered\""],
            )
        });
        if delivered >= 1.0 {
            break families;
        }
        assert!(
            Instant::now() < deadline,
            "no delivery counted: {families:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let undocumented: BTreeSet<&String> = families
        .iter()
        .filter(|(_, family)| !family.help || family.kind.is_none())
        .map(|(name, _)| name)
        .collect();
    assert!(
        undocumented.is_empty(),
        "without # HELP or # TYPE: {undocumented:?}"
    );
    for (name, kind) in [
        ("websub_deliveries_total", "counter"),
        ("websub_delivery_attempt_seconds", "histogram"),
        ("websub_delivery_latency_seconds", "histogram"),
        ("websub_deliveries_in_flight", "gauge"),
        ("websub_deliveries_waiting_for_host", "gauge"),
        ("websub_http_requests_total", "counter"),
        ("websub_http_request_seconds", "histogram"),
        ("websub_http_connections_open", "gauge"),
    ] {
        let family = families.get(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(family.kind.as_deref(), Some(kind), "{name}");
    }
    let websub = ["channel=\"websub\""];
    for histogram in [
        "websub_delivery_attempt_seconds",
        "websub_delivery_latency_seconds",
    ] {
        let count = value(&families, histogram, &format!("{histogram}_count"), &websub);
        assert!(count >= 1.0, "{histogram} observed nothing");
        let infinite = value(
            &families,
            histogram,
            &format!("{histogram}_bucket"),
            &[websub[0], "le=\"+Inf\""],
        );
        assert_eq!(infinite, count, "{histogram}: every observation is in +Inf");
    }
    let in_flight = value(
        &families,
        "websub_deliveries_in_flight",
        "websub_deliveries_in_flight",
        &websub,
    );
    assert_eq!(in_flight, 0.0, "nothing is on the wire once delivered");
    let publishes = value(
        &families,
        "websub_http_requests_total",
        "websub_http_requests_total",
        &["route=\"/\"", "method=\"POST\"", "status=\"202\""],
    );
    assert_eq!(publishes, 1.0, "the fat ping, by its route and status");
}

/// The backlog gauges are sampled every few seconds: a callback that keeps
/// failing shows as a record to deliver whose event ages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_callback_shows_in_the_backlog_gauges() {
    let dir = scratch_dir("backlog-gauges");
    let database_url = format!("sqlite:{}", dir.join("hub.db").display());
    let args = hub_args(&database_url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hub = Websubd::spawn(&dir, free_port(), &args).ready().await;
    let subscriber = TestSubscriber::start().await;
    subscriber.answer_every_delivery(Answer::status(500));
    deliver_one(&hub, &database_url, &subscriber).await;
    let websub = ["channel=\"websub\""];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let families = scrape(&hub).await;
        let backlog = value(
            &families,
            "websub_delivery_backlog",
            "websub_delivery_backlog",
            &websub,
        );
        let oldest = value(
            &families,
            "websub_oldest_undelivered_seconds",
            "websub_oldest_undelivered_seconds",
            &websub,
        );
        if backlog >= 1.0 && oldest > 0.0 {
            for gauge in ["websub_verifications_waiting", "websub_fetches_waiting"] {
                let family = families.get(gauge).unwrap_or_else(|| panic!("no {gauge}"));
                assert_eq!(family.kind.as_deref(), Some("gauge"));
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the failing record never showed: backlog {backlog}, oldest {oldest}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_migration_the_database_lacks() {
    let dir = scratch_dir("readyz-sqlite");
    let path = dir.join("hub.db");
    let database_url = format!("sqlite:{}", path.display());
    let args = hub_args(&database_url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hub = Websubd::spawn(&dir, free_port(), &args).ready().await;
    let (status, body) = readiness(&hub).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ready"], true);
    assert_eq!(body["event_log"], "ok");
    assert_eq!(body["migrations"], "ok");
    assert_eq!(body["store"], "ok");

    // As after a restore from a backup older than this build.
    let mut db = sqlx::SqliteConnection::connect(&database_url)
        .await
        .expect("open the hub's SQLite file");
    let newest: i64 = sqlx::query_scalar("SELECT max(version) FROM websub_hub_migrations")
        .fetch_one(&mut db)
        .await
        .expect("the newest migration");
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM websub_hub_migrations WHERE version = {newest}"
    )))
    .execute(&mut db)
    .await
    .expect("forget it");
    let (status, body) = readiness(&hub).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["ready"], false);
    assert_eq!(body["event_log"], "ok");
    assert_eq!(body["migrations"], format!("not applied: {newest}"));
    let healthy = http_client()
        .get(format!("{}healthz", hub.url))
        .send()
        .await
        .expect("healthz");
    assert!(healthy.status().is_success(), "the process still lives");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_while_postgres_refuses_and_recovers_after() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    let dir = scratch_dir("readyz-postgres");
    let args = hub_args(&url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hub = Websubd::spawn(&dir, free_port(), &args).ready().await;
    assert_eq!(readiness(&hub).await.0, 200);

    let outage = DatabaseOutage::begin(&url).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (status, body) = readiness(&hub).await;
        if status == 503 {
            break body;
        }
        assert!(Instant::now() < deadline, "still ready: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(body["ready"], false);
    // What failed, in the hub's words: PostgreSQL's refusal (naming the
    // database) stays in the hub's log.
    assert_eq!(
        body["event_log"], "failed: the event log's database did not answer",
        "{body}"
    );
    assert_eq!(body["migrations"], "unknown: the event log did not answer");
    let text = body.to_string();
    let database = url.rsplit('/').next().expect("a database name");
    assert!(!text.contains(database), "backend text in {text}");
    assert!(
        !text.contains("accepting connections"),
        "backend text in {text}"
    );

    outage.end().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = readiness(&hub).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never ready again: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_json_writes_one_object_per_line() {
    let dir = scratch_dir("json-log");
    let database_url = format!("sqlite:{}", dir.join("hub.db").display());
    let mut args = hub_args(&database_url);
    args.extend(["--log-format".to_owned(), "json".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut hub = Websubd::spawn_logging(&dir, free_port(), &args, "info", Stdio::piped());
    let log = hub.log().expect("piped stderr");
    let mut hub = hub.ready().await;
    let status = hub.terminate();
    assert!(status.success(), "websubd exited with {status}");
    let lines: Vec<String> = std::io::BufReader::new(log)
        .lines()
        .map(|line| line.expect("a log line"))
        .collect();
    assert!(
        lines.len() >= 2,
        "start-up and shutdown are logged: {lines:?}"
    );
    for line in &lines {
        let object: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
        assert!(object["level"].is_string(), "{line}");
        assert!(object["fields"].is_object(), "{line}");
        assert!(object["timestamp"].is_string(), "{line}");
    }
}
