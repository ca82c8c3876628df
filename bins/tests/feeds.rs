//! Outbox feeds through the real `websubd`: two processes on one feed
//! deliver every event without ever delivering one twice at once, a
//! `kill -9` mid-flow loses nothing, WebSub subscribers of a feed's topic get
//! the envelope, and SIGHUP applies a changed webhooks file.

use crate::common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{DatabaseOutage, PythonReceiver, Websubd, free_port, prometheus, scratch_dir};
use sqlx::postgres::PgPool;
use websub_hub::delivery::outbox::{Event, Outbox, OutboxTables, ddl};
use websub_hub::signature::{MESSAGING_EVENT_ID_HEADER, MESSAGING_SIGNATURE_HEADER, verify};
use websub_tests::{Answer, Received, RecordingReceiver, Route, TestSubscriber, http_client};

const INTERNAL_KEY: &str = "an-internal-api-key-of-at-least-32-characters";
const SIGNING_SECRET: &str = "the feed's webhook secret";
pub(crate) const EVENT_NAME: &str = "shop.order.created";
const WAIT: Duration = Duration::from_secs(30);

/// An order the shop writes to its outbox.
struct OrderCreated(u32);

impl Event for OrderCreated {
    fn name(&self) -> &str {
        EVENT_NAME
    }
    fn resource_type(&self) -> &str {
        "order"
    }
    fn resource_id(&self) -> String {
        self.0.to_string()
    }
    fn event_type(&self) -> &str {
        "created"
    }
    fn payload(&self) -> Result<serde_json::Value, serde_json::Error> {
        Ok(serde_json::json!({ "order": self.0 }))
    }
}

/// The shop's database, with its outbox tables in schema `shop`.
pub(crate) struct Shop {
    pub(crate) url: String,
    pool: PgPool,
    outbox: Outbox,
}

impl Shop {
    pub(crate) async fn open() -> Option<Self> {
        websub_hub::delivery::net::install_crypto_provider();
        let url = websub_storetest::servers::fresh_postgres_url().await?;
        let pool = PgPool::connect(&url).await.expect("connect to the shop");
        let tables = OutboxTables::in_schema("shop").expect("valid names");
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

    /// Commits orders `range`, one transaction each, from four connections.
    pub(crate) async fn produce(&self, range: std::ops::Range<u32>) {
        let producers = (0..4).map(|lane| {
            let orders: Vec<u32> = range.clone().filter(|n| n % 4 == lane).collect();
            async move {
                for order in orders {
                    let mut tx = self.pool.begin().await.expect("begin");
                    self.outbox
                        .message(&OrderCreated(order))
                        .notify()
                        .send(&mut tx)
                        .await
                        .expect("send");
                    tx.commit().await.expect("commit");
                }
            }
        });
        futures::future::join_all(producers).await;
    }

    /// websubd's configuration file for a feed of this shop.
    pub(crate) fn config_file(&self, dir: &Path, webhooks: &Path) -> PathBuf {
        let path = dir.join("websubd.toml");
        let text = format!(
            r#"allow_private_network = true
internal_api_key = "{INTERNAL_KEY}"

[[feed]]
database_url = "{url}"
outbox_table = "shop.outbox"
deliveries_table = "shop.outbox_deliveries"
webhooks_file = "{webhooks}"
signing_secret = "{SIGNING_SECRET}"
poll_interval = "200ms"
delivery_max_backoff = "500ms"
delivery_timeout = "2s"
visibility_timeout = "3s"
"#,
            url = self.url,
            webhooks = webhooks.display(),
        );
        std::fs::write(&path, text).expect("write the config");
        path
    }
}

pub(crate) fn write_webhooks(path: &Path, subscriber: &str, url: &str) {
    let text = format!(
        "[[webhook]]\nevent = \"{EVENT_NAME}\"\nsubscriber = \"{subscriber}\"\nurl = \"{url}\"\n"
    );
    std::fs::write(path, text).expect("write the webhooks file");
}

/// A webhook receiver on the recording receiver: every path answers 204
/// after `delay`; an event counts once it was answered and its signature
/// checks out.
struct Hook {
    receiver: RecordingReceiver,
}

impl Hook {
    async fn start(delay: Duration) -> Self {
        let receiver = RecordingReceiver::start().await;
        receiver.answer(Route::any(), Answer::status(204).after(delay));
        Self { receiver }
    }

    fn url(&self, path: &str) -> String {
        self.receiver.url(&format!("/{path}")).to_string()
    }

    /// Distinct events received on `path`.
    fn events_on(&self, path: &str) -> usize {
        events_on(&self.receiver, path)
    }

    async fn wait_for(&self, path: &str, events: usize) -> bool {
        self.receiver
            .wait_until(WAIT, |receiver| events_on(receiver, path) >= events)
            .await
    }

    /// Requests that arrived while the same event was being delivered to
    /// the same path.
    fn overlaps(&self) -> usize {
        self.receiver.overlaps(MESSAGING_EVENT_ID_HEADER)
    }

    /// Requests whose signature does not check out.
    fn bad_signatures(&self) -> usize {
        self.receiver.count_where(|received| !signed(received))
    }
}

fn signed(received: &Received) -> bool {
    verify(
        SIGNING_SECRET.as_bytes(),
        &received.body,
        received.header(MESSAGING_SIGNATURE_HEADER),
    )
}

fn events_on(receiver: &RecordingReceiver, path: &str) -> usize {
    let path = format!("/{path}");
    receiver
        .received_where(|received| {
            received.path == path && received.succeeded() && signed(received)
        })
        .iter()
        .filter_map(|received| {
            received
                .header(MESSAGING_EVENT_ID_HEADER)
                .map(str::to_owned)
        })
        .collect::<HashSet<_>>()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_websubd_processes_on_one_feed_deliver_each_event_never_twice_at_once() {
    let Some(shop) = Shop::open().await else {
        return;
    };
    let hook = Hook::start(Duration::from_millis(2)).await;
    let mut hubs = Vec::new();
    for name in ["first", "second"] {
        let dir = scratch_dir(&format!("feed-{name}"));
        let webhooks = dir.join("webhooks.toml");
        write_webhooks(&webhooks, "billing", &hook.url("billing"));
        let config = shop.config_file(&dir, &webhooks);
        let config = config.display().to_string();
        hubs.push(
            Websubd::spawn(&dir, free_port(), &["--config", &config])
                .ready()
                .await,
        );
    }
    shop.produce(0..400).await;
    assert!(hook.wait_for("billing", 400).await, "every event arrives");
    assert_eq!(hook.overlaps(), 0);
    assert_eq!(hook.bad_signatures(), 0);
    drop(hubs);
}

/// A feed's gauges: its listener is up, and the rows a failing webhook
/// leaves show as its backlog, with the age of the oldest event; its
/// attempts are counted and timed on the webhook channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_feed_shows_its_listener_and_a_failing_webhook_in_the_metrics() {
    let Some(shop) = Shop::open().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer(Route::any(), Answer::status(500));
    let dir = scratch_dir("feed-gauges");
    let webhooks = dir.join("webhooks.toml");
    write_webhooks(&webhooks, "billing", receiver.url("/broken").as_str());
    let config = shop.config_file(&dir, &webhooks);
    // Retries enough that the rows stay pending while the gauges are read
    // (the feed's table is the file's last).
    let mut text = std::fs::read_to_string(&config).expect("read the config");
    text.push_str("delivery_retries = 1000\n");
    std::fs::write(&config, text).expect("write the config");
    let config = config.display().to_string();
    let hub = Websubd::spawn(&dir, free_port(), &["--config", &config])
        .ready()
        .await;
    shop.produce(0..3).await;
    let outbox = ["outbox=\"shop.outbox\""];
    let webhook = ["channel=\"webhook\""];
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let families = prometheus::scrape(&hub).await;
        let gauge = |name: &str| {
            families
                .get(name)
                .map_or(0.0, |_| prometheus::value(&families, name, name, &outbox))
        };
        let listening = gauge("websub_outbox_listener_connected");
        let backlog = gauge("websub_outbox_backlog");
        let oldest = gauge("websub_outbox_oldest_undelivered_seconds");
        let attempts = families
            .get("websub_delivery_attempt_seconds")
            .map_or(0.0, |_| {
                prometheus::value(
                    &families,
                    "websub_delivery_attempt_seconds",
                    "websub_delivery_attempt_seconds_count",
                    &webhook,
                )
            });
        if listening == 1.0 && backlog == 3.0 && oldest > 0.0 && attempts >= 3.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "listening {listening}, backlog {backlog}, oldest {oldest}, attempts {attempts}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_flow_loses_no_event() {
    let Some(shop) = Shop::open().await else {
        return;
    };
    // Each answer takes 100 ms: 200 events at 16 in flight take over a
    // second, so the kill lands mid-flow even on a busy machine.
    let hook = Hook::start(Duration::from_millis(100)).await;
    let dir = scratch_dir("feed-crash");
    let webhooks = dir.join("webhooks.toml");
    write_webhooks(&webhooks, "billing", &hook.url("billing"));
    let config = shop.config_file(&dir, &webhooks).display().to_string();
    let port = free_port();
    let hub = Websubd::spawn(&dir, port, &["--config", &config])
        .ready()
        .await;
    shop.produce(0..200).await;
    assert!(hook.wait_for("billing", 20).await);
    hub.kill_9();
    let delivered_before = hook.events_on("billing");
    assert!(delivered_before < 200, "the kill landed mid-flow");
    let _hub = Websubd::spawn(&dir, port, &["--config", &config])
        .ready()
        .await;
    assert!(
        hook.wait_for("billing", 200).await,
        "only {} of 200 events arrived",
        hook.events_on("billing")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn websub_subscribers_get_the_envelope_and_sighup_applies_new_webhooks() {
    let Some(shop) = Shop::open().await else {
        return;
    };
    let hook = Hook::start(Duration::ZERO).await;
    let dir = scratch_dir("feed-bridge");
    let webhooks = dir.join("webhooks.toml");
    write_webhooks(&webhooks, "billing", &hook.url("billing"));
    let config = shop.config_file(&dir, &webhooks).display().to_string();
    let hub = Websubd::spawn(&dir, free_port(), &["--config", &config])
        .ready()
        .await;

    // A WebSub subscriber finds the hub from the topic URL and subscribes.
    let topic = format!("{}topics/{EVENT_NAME}", hub.url);
    let discovered = http_client().get(&topic).send().await.expect("GET topic");
    let link = discovered
        .headers()
        .get("link")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        link.contains(&format!("<{}>; rel=\"hub\"", hub.url)),
        "{link}"
    );
    let subscriber = TestSubscriber::start().await;
    let callback = subscriber.callback("orders");
    let form = [
        ("hub.mode", "subscribe"),
        ("hub.topic", topic.as_str()),
        ("hub.callback", callback.as_str()),
        ("hub.secret", "websub-secret"),
    ];
    let response = http_client()
        .post(&hub.url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(form).unwrap_or_default())
        .send()
        .await
        .expect("subscribe");
    assert_eq!(response.status().as_u16(), 202);
    subscriber.wait_for_verifications(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    shop.produce(0..1).await;
    let delivered = subscriber.wait_for_deliveries("orders", 1, WAIT).await;
    assert_eq!(delivered.len(), 1);
    let delivery = &delivered[0];
    assert_eq!(delivery.header("content-type"), Some("application/json"));
    assert!(
        delivery
            .header("link")
            .is_some_and(|link| link.contains(&format!("<{topic}>; rel=\"self\"")))
    );
    assert!(verify(
        b"websub-secret",
        &delivery.body,
        delivery.header("x-hub-signature")
    ));
    let envelope: serde_json::Value =
        serde_json::from_slice(&delivery.body).expect("the envelope is JSON");
    assert_eq!(envelope["event_name"], EVENT_NAME);
    assert_eq!(envelope["data"], serde_json::json!({"order": 0}));
    assert!(envelope.get("app").is_none(), "no app, no key");
    assert!(hook.wait_for("billing", 1).await);

    // A changed webhooks file applies on SIGHUP: the next event goes to the
    // new URL only.
    write_webhooks(&webhooks, "billing", &hook.url("billing-v2"));
    hub.hangup();
    tokio::time::sleep(Duration::from_millis(500)).await;
    shop.produce(1..2).await;
    assert!(hook.wait_for("billing-v2", 1).await);
    assert_eq!(hook.events_on("billing"), 1);
    assert_eq!(
        subscriber
            .wait_for_deliveries("orders", 2, WAIT)
            .await
            .len(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hub_database_outage_loses_and_duplicates_no_bridged_event() {
    const EVENTS: u32 = 600;
    let Some(shop) = Shop::open().await else {
        return;
    };
    let hub_database = websub_storetest::servers::fresh_postgres_url()
        .await
        .expect("a database for the hub");
    let hook = Hook::start(Duration::ZERO).await;
    let dir = scratch_dir("feed-outage");
    let webhooks = dir.join("webhooks.toml");
    write_webhooks(&webhooks, "billing", &hook.url("billing"));
    let config = shop.config_file(&dir, &webhooks);
    // Listed, the events go to the bridge whoever subscribes: it is called
    // (and fails) throughout the outage.
    let text = std::fs::read_to_string(&config).expect("read the config");
    std::fs::write(
        &config,
        text.replace(
            "[[feed]]\n",
            &format!("[[feed]]\nevents = [\"{EVENT_NAME}\"]\n"),
        ),
    )
    .expect("write the config");
    let config = config.display().to_string();
    let hub = Websubd::spawn(
        &dir,
        free_port(),
        &["--config", &config, "--database-url", &hub_database],
    )
    .ready()
    .await;
    let topic = format!("{}topics/{EVENT_NAME}", hub.url);
    let subscriber = TestSubscriber::start().await;
    let callback = subscriber.callback("orders");
    let response = http_client()
        .post(&hub.url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            serde_urlencoded::to_string([
                ("hub.mode", "subscribe"),
                ("hub.topic", topic.as_str()),
                ("hub.callback", callback.as_str()),
            ])
            .unwrap_or_default(),
        )
        .send()
        .await
        .expect("subscribe");
    assert_eq!(response.status().as_u16(), 202);
    subscriber.wait_for_verifications(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    shop.produce(0..EVENTS / 3).await;
    let outage = DatabaseOutage::begin(&hub_database).await;
    let at_outage = subscriber.deliveries_to("orders").len();
    shop.produce(EVENTS / 3..2 * EVENTS / 3).await;
    // The bridge cannot record while the hub's database is down: its
    // events wait (postponed, without limit) past the feed's claims going
    // stale (3 s) and several rounds of its backoff (at most 500 ms).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before_the_end = distinct_orders(&subscriber.deliveries_to("orders"));
    assert!(
        before_the_end < (2 * EVENTS / 3) as usize,
        "{before_the_end} events delivered during the outage: it held nothing back"
    );
    outage.end().await;
    shop.produce(2 * EVENTS / 3..EVENTS).await;

    let all = subscriber
        .wait_until(Duration::from_secs(120), |s| {
            distinct_orders(&s.deliveries_to("orders")) >= EVENTS as usize
        })
        .await;
    let deliveries = subscriber.deliveries_to("orders");
    assert!(
        all,
        "{} of {EVENTS} events reached the WebSub subscriber ({at_outage} before the outage)",
        distinct_orders(&deliveries)
    );
    assert!(
        (at_outage as u32) < EVENTS,
        "every event was delivered before the outage; the test proves nothing"
    );
    // One event per outbox event: every delivery carries its envelope's id,
    // so a receiver de-duplicating on it sees each event once.
    let mut ids_of_order: std::collections::HashMap<String, HashSet<String>> =
        std::collections::HashMap::new();
    for delivery in &deliveries {
        let envelope: serde_json::Value =
            serde_json::from_slice(&delivery.body).expect("the envelope is JSON");
        let event_id = envelope["event_id"].as_str().expect("event_id").to_owned();
        assert_eq!(
            delivery.header("x-websub-event-id"),
            Some(event_id.as_str()),
            "the WebSub event id is the envelope's"
        );
        ids_of_order
            .entry(envelope["data"]["order"].to_string())
            .or_default()
            .insert(event_id);
    }
    let recorded_twice = ids_of_order.values().filter(|ids| ids.len() > 1).count();
    assert_eq!(recorded_twice, 0, "events recorded as two hub events");
    eprintln!(
        "{} deliveries of {EVENTS} events ({} repeated with the same id)",
        deliveries.len(),
        deliveries.len() - EVENTS as usize
    );
    assert!(hook.wait_for("billing", EVENTS as usize).await);
    drop(hub);
}

fn distinct_orders(deliveries: &[Received]) -> usize {
    deliveries
        .iter()
        .map(|delivery| delivery.body.clone())
        .collect::<HashSet<_>>()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_webhook_that_redirects_to_loopback_sends_nothing_there() {
    let Some(shop) = Shop::open().await else {
        return;
    };
    let hook = Hook::start(Duration::ZERO).await;
    // The webhook answers every delivery with a redirect to another path on
    // loopback, the kind of address a redirect must not smuggle a key to.
    let target = hook.url("internal-target");
    hook.receiver.answer(
        Route::path("/redirecting"),
        Answer::status(307).with_header("location", &target),
    );
    let dir = scratch_dir("feed-redirect");
    let webhooks = dir.join("webhooks.toml");
    write_webhooks(&webhooks, "billing", &hook.url("redirecting"));
    let config = shop.config_file(&dir, &webhooks).display().to_string();
    let _hub = Websubd::spawn(&dir, free_port(), &["--config", &config])
        .ready()
        .await;
    shop.produce(0..1).await;

    // Every attempt (the first and the retries, 500 ms apart at most) ends
    // at the redirect; the row keeps the status as its error.
    let deadline = tokio::time::Instant::now() + WAIT;
    let last_error = loop {
        let row: Option<(Option<String>, i32, bool)> = sqlx::query_as(
            "SELECT last_error, retry_count, processed_at IS NOT NULL \
             FROM shop.outbox_deliveries WHERE subscriber = 'billing'",
        )
        .fetch_optional(&shop.pool)
        .await
        .expect("read the delivery row");
        if let Some((Some(error), retries, processed)) = row {
            assert!(!processed, "a redirect was recorded as delivered");
            if retries >= 2 {
                break error;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the webhook was never attempted twice"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(last_error.contains("307"), "{last_error}");
    assert!(
        hook.receiver.received_at("/redirecting").len() >= 2,
        "the webhook itself was asked"
    );
    assert!(
        hook.receiver.received_at("/internal-target").is_empty(),
        "the redirect target received a delivery"
    );
}

/// A webhook receiver written with the published `standardwebhooks`
/// Python library: it verifies every POST as that library does and answers
/// 204, or 401 when verification fails, and records each verdict.
const STANDARD_RECEIVER: &str = r#"
import http.server, sys
from standardwebhooks.webhooks import Webhook
secret, port_file, log_file = sys.argv[1], sys.argv[2], sys.argv[3]
hook = Webhook(secret)
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            hook.verify(body, dict(self.headers.items()))
            verdict, status = "verified " + self.headers["webhook-id"], 204
        except Exception as error:
            verdict, status = "refused " + type(error).__name__, 401
        with open(log_file, "a") as log:
            log.write(verdict + "\n")
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standard_webhooks_signatures_verify_with_the_published_library() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    if !python_has("standardwebhooks") {
        return;
    }
    let Some(shop) = Shop::open().await else {
        return;
    };
    let dir = scratch_dir("feed-standard");
    let receiver = standard_receiver(&dir, "receiver", SECRET).await;
    let port = receiver.port;
    let verdicts = || receiver.lines();
    let deadline = tokio::time::Instant::now() + WAIT;

    let webhooks = dir.join("webhooks.toml");
    write_webhooks(
        &webhooks,
        "billing",
        &format!("http://127.0.0.1:{port}/hook"),
    );
    let config = shop.config_file(&dir, &webhooks);
    let text = std::fs::read_to_string(&config).expect("read the config");
    std::fs::write(
        &config,
        text.replace(
            &format!("signing_secret = \"{SIGNING_SECRET}\""),
            &format!("signing_secret = \"{SECRET}\"\nsignature_scheme = \"standard-webhooks\""),
        ),
    )
    .expect("write the config");
    let config = config.display().to_string();
    let hub = Websubd::spawn(&dir, free_port(), &["--config", &config])
        .ready()
        .await;
    shop.produce(0..3).await;
    while verdicts().len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline + WAIT,
            "the webhooks never arrived: {:?}",
            verdicts()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = verdicts();
    assert!(
        received
            .iter()
            .all(|verdict| verdict.starts_with("verified ")),
        "{received:?}"
    );
    // The same library refuses what it should: a changed body, and a
    // correctly signed request whose timestamp is ten minutes old.
    let key = websub_hub::signature::standard_key(SECRET).expect("the key");
    let old = chrono::Utc::now().timestamp() - 600;
    let body = br#"{"order":1}"#;
    for (timestamp, sent) in [
        (chrono::Utc::now().timestamp(), br#"{"order":2}"#.as_slice()),
        (old, body.as_slice()),
    ] {
        let signature = websub_hub::signature::sign_standard(&key, "msg_1", timestamp, body);
        let answer = http_client()
            .post(format!("http://127.0.0.1:{port}/hook"))
            .header("webhook-id", "msg_1")
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(sent.to_vec())
            .send()
            .await
            .expect("POST to the receiver");
        assert_eq!(answer.status().as_u16(), 401);
    }
    drop(hub);
}

/// A Standard Webhooks receiver on the published Python library, holding
/// one secret: each request's verdict is a line of its log.
async fn standard_receiver(dir: &Path, name: &str, secret: &str) -> PythonReceiver {
    PythonReceiver::start(dir, name, STANDARD_RECEIVER, &[secret]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_feeds_signing_secret_is_replaced_through_an_overlap_with_no_refused_request() {
    const OLD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const NEW: &str = "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24=";
    if !python_has("standardwebhooks") {
        return;
    }
    let Some(shop) = Shop::open().await else {
        return;
    };
    let dir = scratch_dir("feed-rotation");
    // A receiver that still holds the old secret, and one that already
    // moved to the new one.
    let old_holder = standard_receiver(&dir, "old", OLD).await;
    let new_holder = standard_receiver(&dir, "new", NEW).await;
    let webhooks = dir.join("webhooks.toml");
    let entry = |subscriber: &str, port: u16| {
        format!(
            "[[webhook]]\nevent = \"{EVENT_NAME}\"\nsubscriber = \"{subscriber}\"\n\
             url = \"http://127.0.0.1:{port}/hook\"\n\n"
        )
    };
    let config = shop.config_file(&dir, &webhooks);
    let base = std::fs::read_to_string(&config).expect("read the config");
    let phase = |previous: Option<&str>| {
        let secrets = match previous {
            Some(previous) => {
                format!("signing_secret = \"{NEW}\"\nprevious_signing_secret = \"{previous}\"")
            }
            None => format!("signing_secret = \"{NEW}\""),
        };
        std::fs::write(
            &config,
            base.replace(
                &format!("signing_secret = \"{SIGNING_SECRET}\""),
                &format!("{secrets}\nsignature_scheme = \"standard-webhooks\""),
            ),
        )
        .expect("write the config");
    };
    let config_path = config.display().to_string();

    // The overlap: every request carries a signature with each secret, so
    // both receivers verify every one.
    std::fs::write(
        &webhooks,
        entry("old-holder", old_holder.port) + &entry("new-holder", new_holder.port),
    )
    .expect("write the webhooks file");
    phase(Some(OLD));
    let hub = Websubd::spawn(&dir, free_port(), &["--config", &config_path])
        .ready()
        .await;
    shop.produce(0..3).await;
    for receiver in [&old_holder, &new_holder] {
        let verdicts = receiver.wait_for(3).await;
        assert!(
            verdicts
                .iter()
                .all(|verdict| verdict.starts_with("verified ")),
            "{verdicts:?}"
        );
    }
    drop(hub);

    // After it: the new secret alone, which the old holder no longer takes.
    phase(None);
    let hub = Websubd::spawn(&dir, free_port(), &["--config", &config_path])
        .ready()
        .await;
    shop.produce(3..5).await;
    let verdicts = new_holder.wait_for(5).await;
    assert!(
        verdicts
            .iter()
            .all(|verdict| verdict.starts_with("verified ")),
        "{verdicts:?}"
    );
    let verdicts = old_holder.wait_for(5).await;
    assert!(
        verdicts[3..]
            .iter()
            .all(|verdict| verdict.starts_with("refused ")),
        "the overlap is what kept the old holder going: {verdicts:?}"
    );
    drop(hub);
}

/// Whether python3 imports `module`; outside CI a missing one skips the
/// test, in CI it fails it (.ci/run installs it).
pub(crate) fn python_has(module: &str) -> bool {
    let found = std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but python3 cannot import {module} (.ci/run installs it)"
        );
        eprintln!("skipped: python3 -m pip install {module} to run this test");
    }
    found
}

/// With its defaults, a feed keeps the messaging contract whatever its
/// webhook does: every row is tried to its own retry limit and kept,
/// exhausted, with its last error; none is skipped, however many fail in a
/// row (the hub's breaker and disabling are for WebSub callbacks).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_feed_keeps_every_row_to_its_own_retry_limit_by_default() {
    let Some(shop) = Shop::open().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer(Route::any(), Answer::status(500));
    let dir = scratch_dir("feed-contract");
    let webhooks = dir.join("webhooks.toml");
    write_webhooks(&webhooks, "billing", receiver.url("/down").as_str());
    let config = shop.config_file(&dir, &webhooks);
    let mut text = std::fs::read_to_string(&config).expect("read the config");
    text.push_str("delivery_retries = 1\n");
    std::fs::write(&config, text).expect("write the config");
    let config = config.display().to_string();
    let hub = Websubd::spawn(&dir, free_port(), &["--config", &config])
        .ready()
        .await;
    // Eight rows failing in a row: more than any count that would disable
    // a webhook.
    shop.produce(0..8).await;
    let exhausted = "SELECT count(*) FROM shop.outbox_deliveries \
         WHERE subscriber = 'billing' AND processed_at IS NULL AND next_attempt_at IS NULL \
           AND retry_count = 2 AND last_error LIKE 'HTTP 500%'";
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let count: i64 = sqlx::query_scalar(exhausted)
            .fetch_one(&shop.pool)
            .await
            .expect("count exhausted rows");
        if count == 8 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{count} of 8 rows exhausted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let skipped: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM shop.outbox_deliveries WHERE last_error = 'endpoint disabled'",
    )
    .fetch_one(&shop.pool)
    .await
    .expect("count skipped rows");
    assert_eq!(skipped, 0, "nothing skipped");
    assert_eq!(
        receiver.count_where(|received| received.path == "/down"),
        16,
        "two attempts per row"
    );
    drop(hub);
}

/// Beyond the messaging contract, on request: a webhook's breaker. Every
/// row's first attempt fails while the webhook is down, each with no retry
/// to spare; the first failures run out, the breaker opens and the rest
/// wait without spending anything; once the webhook answers again, a probe
/// closes the breaker, what waited goes out, and the rows that ran out
/// while it failed start again. Every event arrives with no operator
/// action, and no row is left exhausted or skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_feed_with_a_breaker_delivers_everything_after_an_outage() {
    let Some(shop) = Shop::open().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer(Route::any(), Answer::status(500));
    let dir = scratch_dir("feed-breaker");
    let webhooks = dir.join("webhooks.toml");
    write_webhooks(&webhooks, "billing", receiver.url("/down").as_str());
    let config = shop.config_file(&dir, &webhooks);
    let mut text = std::fs::read_to_string(&config).expect("read the config");
    text.push_str("delivery_retries = 0\nbreaker_open_after = 3\nresend_exhausted = true\n");
    std::fs::write(&config, text).expect("write the config");
    let config = config.display().to_string();
    let hub = Websubd::spawn(&dir, free_port(), &["--config", &config])
        .ready()
        .await;
    shop.produce(0..8).await;
    // Down for a while: three failures open the breaker, and the rows
    // after them wait for its probes.
    assert!(
        receiver
            .wait_until(WAIT, |receiver| receiver
                .count_where(|received| received.path == "/down")
                >= 3)
            .await,
        "the first rows were tried"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let families = prometheus::scrape(&hub).await;
    let changes = |to: &str| {
        prometheus::value(
            &families,
            "websub_endpoint_changes_total",
            "websub_endpoint_changes_total",
            &["channel=\"webhook\"", &format!("to=\"{to}\"")],
        )
    };
    assert_eq!(changes("open"), 1.0, "the webhook's breaker opened");
    let exhausted = "SELECT count(*) FROM shop.outbox_deliveries \
         WHERE subscriber = 'billing' AND processed_at IS NULL AND next_attempt_at IS NULL";
    let ran_out: i64 = sqlx::query_scalar(exhausted)
        .fetch_one(&shop.pool)
        .await
        .expect("count exhausted rows");
    let tried = receiver.count_where(|received| received.path == "/down");
    eprintln!("{ran_out} rows ran out of retries before the breaker opened; {tried} attempts");
    assert!(ran_out >= 1, "the failures that opened the breaker ran out");
    assert!(
        ran_out < 8,
        "the rows after the breaker opened wait, their retries unspent"
    );

    // Back: everything arrives, nobody steps in.
    receiver.answer(Route::any(), Answer::status(204));
    let back = std::time::Instant::now();
    assert!(
        receiver
            .wait_until(WAIT, |receiver| events_on(receiver, "down") == 8)
            .await,
        "{} of 8 events delivered after the webhook came back",
        events_on(&receiver, "down")
    );
    eprintln!(
        "all delivered {:?} after the webhook was back",
        back.elapsed()
    );
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM shop.outbox_deliveries \
             WHERE subscriber = 'billing' AND processed_at IS NULL",
        )
        .fetch_one(&shop.pool)
        .await
        .expect("count open rows");
        if open == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{open} rows not closed as delivered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let families = prometheus::scrape(&hub).await;
    assert!(
        prometheus::value(
            &families,
            "websub_endpoint_changes_total",
            "websub_endpoint_changes_total",
            &["channel=\"webhook\"", "to=\"recovered\""],
        ) >= 1.0,
        "the breaker closed on a probe"
    );
    drop(hub);
}

/// A feed's webhook answering `429` with `Retry-After` gets nothing more,
/// neither the retry nor the events after it, until the wait is over; then
/// everything arrives, the retry spent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_feed_webhooks_retry_after_pauses_all_its_deliveries() {
    let Some(shop) = Shop::open().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    receiver.answer_in_turn(
        Route::any(),
        [
            Answer::status(429).with_header("Retry-After", "2"),
            Answer::status(204),
        ],
    );
    let dir = scratch_dir("feed-retry-after");
    let webhooks = dir.join("webhooks.toml");
    write_webhooks(&webhooks, "billing", receiver.url("/paced").as_str());
    let config = shop.config_file(&dir, &webhooks);
    let mut text = std::fs::read_to_string(&config).expect("read the config");
    // The patience (three quarters of the visibility timeout) must outlast
    // the pause, or the waiting rows are handed back and claimed again.
    text = text.replace(
        "visibility_timeout = \"3s\"",
        "visibility_timeout = \"10s\"",
    );
    text.push_str("delivery_per_subscriber_min = 2\n");
    std::fs::write(&config, text).expect("write the config");
    let config = config.display().to_string();
    let hub = Websubd::spawn(&dir, free_port(), &["--config", &config])
        .ready()
        .await;
    shop.produce(0..1).await;
    assert!(receiver.wait_for("/paced", 1, WAIT).await, "the 429");
    shop.produce(1..4).await;
    assert!(
        receiver
            .wait_until(WAIT, |receiver| events_on(receiver, "paced") == 4)
            .await,
        "every event after the pause"
    );
    let attempts = receiver.received_at("/paced");
    assert_eq!(attempts.len(), 5, "one 429, then the four events");
    for attempt in &attempts[1..] {
        let waited = attempt.at - attempts[0].at;
        assert!(
            waited >= Duration::from_millis(1_900),
            "an attempt went out {waited:?} after the 429, inside its Retry-After"
        );
    }
    let retried: Vec<i32> = sqlx::query_scalar(
        "SELECT retry_count FROM shop.outbox_deliveries \
         WHERE subscriber = 'billing' ORDER BY retry_count DESC",
    )
    .fetch_all(&shop.pool)
    .await
    .expect("read the rows");
    assert_eq!(retried, vec![1, 0, 0, 0], "one retry spent, by the 429");
    drop(hub);
}
