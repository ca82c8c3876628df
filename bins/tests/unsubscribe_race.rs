//! No delivery after a confirmed unsubscribe, against the real `websubd`:
//! a callback that publishes to its topic the moment it has answered its
//! unsubscribe verification receives none of those events, while the
//! events published before its unsubscribe request reach it. On
//! PostgreSQL the test holds the subscription's row locked meanwhile, so
//! the hub's delete waits and every one of those publishes lands between
//! the hub's receiving the answer and its deleting the subscription.

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use common::{Websubd, scratch_dir};
use websub_tests::{http_client, serve_on_loopback};

#[derive(Default)]
struct Callback {
    hub: Mutex<String>,
    topic: Mutex<String>,
    /// Event ids the publishes made after the unsubscribe answer got back.
    after_answer: Mutex<Vec<String>>,
    delivered: Mutex<HashSet<String>>,
    done: tokio::sync::Notify,
}

async fn fat_ping(hub: &str, topic: &str, n: usize) -> String {
    let response = http_client()
        .post(format!(
            "{hub}?hub.mode=publish&hub.topic={}",
            url::form_urlencoded::byte_serialize(topic.as_bytes()).collect::<String>()
        ))
        .header("content-type", "application/json")
        .header("X-Internal-API-Key", websub_tests::INTERNAL_KEY)
        .body(format!("{{\"n\":{n}}}"))
        .send()
        .await
        .expect("fat ping");
    assert_eq!(response.status().as_u16(), 202);
    let text = response.text().await.expect("fat ping answer");
    text.trim()
        .strip_prefix("recorded event ")
        .unwrap_or_else(|| panic!("an event id in {text:?}"))
        .to_owned()
}

async fn verify(
    State(callback): State<Arc<Callback>>,
    Query(query): Query<Vec<(String, String)>>,
) -> (StatusCode, String) {
    let param = |name: &str| {
        query
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
            .unwrap_or_default()
    };
    if param("hub.mode") == "unsubscribe" {
        // Publish as soon as the answer has reached the hub: it is written
        // when this handler returns, and read on loopback within a
        // millisecond; the publishes that follow land while the hub
        // deletes the subscription, and after.
        let publisher = callback.clone();
        tokio::spawn(async move {
            let callback = publisher;
            tokio::time::sleep(Duration::from_millis(5)).await;
            let hub = callback
                .hub
                .lock()
                .map(|hub| hub.clone())
                .unwrap_or_default();
            let topic = callback
                .topic
                .lock()
                .map(|topic| topic.clone())
                .unwrap_or_default();
            for n in 0..20 {
                let id = fat_ping(&hub, &topic, 100 + n).await;
                if let Ok(mut ids) = callback.after_answer.lock() {
                    ids.push(id);
                }
            }
            callback.done.notify_one();
        });
    }
    (StatusCode::OK, param("hub.challenge"))
}

async fn deliver(State(callback): State<Arc<Callback>>, headers: HeaderMap) -> StatusCode {
    if let Some(id) = headers
        .get("x-websub-event-id")
        .and_then(|value| value.to_str().ok())
        && let Ok(mut delivered) = callback.delivered.lock()
    {
        delivered.insert(id.to_owned());
    }
    StatusCode::NO_CONTENT
}

async fn post_form(hub: &str, form: &[(&str, &str)]) -> u16 {
    http_client()
        .post(hub)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(form).expect("form"))
        .send()
        .await
        .expect("POST to the hub")
        .status()
        .as_u16()
}

async fn no_delivery_after_a_confirmed_unsubscribe(database_url: String, hold_the_row: bool) {
    let callback = Arc::new(Callback::default());
    let app = Router::new()
        .route("/cb", get(verify).post(deliver))
        .with_state(callback.clone());
    let server = serve_on_loopback(app).await;
    let callback_url = format!("http://{}/cb", server.address);
    let topic = format!("http://127.0.0.1:9/race/{}", uuid::Uuid::new_v4().simple());
    let dir = scratch_dir("unsubscribe-race");
    let hub = Websubd::on_database(&dir, &database_url, &[]).await;
    *callback.hub.lock().expect("lock") = hub.url.clone();
    *callback.topic.lock().expect("lock") = topic.clone();

    let subscribe = [
        ("hub.mode", "subscribe"),
        ("hub.topic", topic.as_str()),
        ("hub.callback", callback_url.as_str()),
    ];
    assert_eq!(post_form(&hub.url, &subscribe).await, 202);
    // Subscribed once an event reaches it; the subscriber list is cached
    // by the expansion that delivers it.
    let mut before = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        before.push(fat_ping(&hub.url, &topic, before.len()).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let delivered = callback.delivered.lock().expect("lock").clone();
        if before.iter().any(|id| delivered.contains(id)) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never subscribed");
    }

    let unsubscribe = [
        ("hub.mode", "unsubscribe"),
        ("hub.topic", topic.as_str()),
        ("hub.callback", callback_url.as_str()),
    ];
    // The subscription's row locked: the hub's delete waits for it.
    let mut holder = if hold_the_row {
        use sqlx::Connection;
        let mut connection = sqlx::PgConnection::connect(&database_url)
            .await
            .expect("connect to the hub's database");
        sqlx::query("BEGIN")
            .execute(&mut connection)
            .await
            .expect("begin");
        sqlx::query(
            "SELECT 1 FROM websub_subscriptions WHERE topic = $1 AND callback = $2 FOR UPDATE",
        )
        .bind(&topic)
        .bind(&callback_url)
        .fetch_one(&mut connection)
        .await
        .expect("lock the subscription's row");
        Some(connection)
    } else {
        None
    };
    let done = callback.done.notified();
    assert_eq!(post_form(&hub.url, &unsubscribe).await, 202);
    tokio::time::timeout(Duration::from_secs(20), done)
        .await
        .expect("the publishes after the answer were made");
    if let Some(connection) = holder.as_mut() {
        // The events are expanded and sent meanwhile, the subscription
        // still in the store; then the delete may go on.
        tokio::time::sleep(Duration::from_secs(2)).await;
        sqlx::query("COMMIT")
            .execute(connection)
            .await
            .expect("release the row");
    }
    // Whatever was going to be delivered has had time to be.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let delivered = callback.delivered.lock().expect("lock").clone();
    let after: Vec<String> = callback.after_answer.lock().expect("lock").clone();
    assert_eq!(after.len(), 20);
    let leaked: Vec<&String> = after.iter().filter(|id| delivered.contains(*id)).collect();
    assert!(
        leaked.is_empty(),
        "{} events published after the unsubscribe answer were delivered: {leaked:?}",
        leaked.len()
    );
    assert!(
        before.iter().any(|id| delivered.contains(id)),
        "the events before the unsubscribe went out"
    );
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_delivery_after_a_confirmed_unsubscribe_on_sqlite() {
    let dir = scratch_dir("unsubscribe-race-db");
    no_delivery_after_a_confirmed_unsubscribe(
        format!("sqlite:{}", dir.join("hub.db").display()),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_delivery_after_a_confirmed_unsubscribe_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    no_delivery_after_a_confirmed_unsubscribe(url, true).await;
}
