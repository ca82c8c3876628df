//! Outbox feeds through the real `websubd`: two processes on one feed
//! deliver every event without ever delivering one twice at once, a
//! `kill -9` mid-flow loses nothing, WebSub subscribers of a feed's topic get
//! the envelope, and SIGHUP applies a changed webhooks file.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Websubd, free_port, scratch_dir};
use sqlx::postgres::PgPool;
use websub_hub::outbox::{Event, Outbox, OutboxTables, ddl};
use websub_hub::signature::{MESSAGING_EVENT_ID_HEADER, MESSAGING_SIGNATURE_HEADER, verify};
use websub_tests::{Answer, Received, RecordingReceiver, Route, TestSubscriber, http_client};

const INTERNAL_KEY: &str = "an-internal-api-key-of-at-least-32-characters";
const SIGNING_SECRET: &str = "the feed's webhook secret";
const EVENT_NAME: &str = "shop.order.created";
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
struct Shop {
    url: String,
    pool: PgPool,
    outbox: Outbox,
}

impl Shop {
    async fn open() -> Option<Self> {
        websub_hub::net::install_crypto_provider();
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
    async fn produce(&self, range: std::ops::Range<u32>) {
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
    fn config_file(&self, dir: &Path, webhooks: &Path) -> PathBuf {
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

fn write_webhooks(path: &Path, subscriber: &str, url: &str) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_flow_loses_no_event() {
    let Some(shop) = Shop::open().await else {
        return;
    };
    let hook = Hook::start(Duration::from_millis(20)).await;
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
