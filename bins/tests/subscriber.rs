//! The subscriber helpers against the real `websubd` binary: a client
//! subscribes a receiver, and a publish reaches the receiver's handler with
//! a valid signature.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use websub_hub::signature::{self, HUB_SIGNATURE_HEADER};
use websub_hub::subscriber::{HandlerError, Notification, Receiver, State, SubscriberClient};
use websub_tests::{http_client, serve_on_loopback};

const INTERNAL_KEY: &str = "an-internal-api-key-of-at-least-32-characters";
const SECRET: &str = "a secret shared with websubd";

/// websubd, killed when dropped.
struct Websubd(Child);

impl Drop for Websubd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

async fn start_websubd() -> (Websubd, String) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("websubd-subscriber-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_websubd"))
        .current_dir(&dir)
        .env("RUST_LOG", "warn")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--allow-private-network",
            "--internal-api-key",
            INTERNAL_KEY,
        ])
        .args(["--poll-interval", "200ms"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start websubd");
    let hub = Websubd(child);
    let url = format!("http://127.0.0.1:{port}/");
    let client = http_client();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = client.get(format!("{url}healthz")).send().await
            && response.status().is_success()
        {
            return (hub, url);
        }
        assert!(Instant::now() < deadline, "websubd did not become ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_receiver_gets_a_signed_publish() {
    let (_websubd, hub_url) = start_websubd().await;

    let (sender, mut received) = mpsc::unbounded_channel();
    let receiver = Receiver::builder()
        .callback("/websub")
        .handler(move |notification: Notification| {
            let sender = sender.clone();
            async move {
                sender
                    .send(notification)
                    .map_err(|_| HandlerError::from("the test stopped listening"))
            }
        })
        .build()
        .expect("build the receiver");
    let server = serve_on_loopback(receiver.router()).await;
    let callback = format!("http://{}/websub", server.address);
    let topic = "http://127.0.0.1:9/topics/e2e";

    let client = SubscriberClient::new(hub_url.parse().expect("hub URL"), http_client())
        .with_intents(receiver.intents().clone());
    client
        .subscribe(
            topic,
            &callback,
            Some(Duration::from_secs(3600)),
            Some(SECRET),
        )
        .await
        .expect("websubd accepts the request");
    let status = receiver
        .intents()
        .wait_for(topic, &callback, Duration::from_secs(10), |status| {
            status.state == State::Active
        })
        .await
        .expect("websubd verified the subscription");
    assert_eq!(status.lease, Some(Duration::from_secs(3600)));

    // websubd saves the subscription just after the verification; publish
    // until the delivery arrives (each ping is a new event, so stop at the
    // first).
    let body = "{\"shipped\":true}";
    let deadline = Instant::now() + Duration::from_secs(20);
    let notification = loop {
        let response = http_client()
            .post(format!(
                "{hub_url}?hub.mode=publish&hub.topic=http%3A%2F%2F127.0.0.1%3A9%2Ftopics%2Fe2e"
            ))
            .header("content-type", "application/json")
            .header("X-Internal-API-Key", INTERNAL_KEY)
            .body(body)
            .send()
            .await
            .expect("fat ping");
        assert_eq!(response.status().as_u16(), 202);
        if let Ok(Some(notification)) =
            tokio::time::timeout(Duration::from_secs(1), received.recv()).await
        {
            break notification;
        }
        assert!(Instant::now() < deadline, "no delivery reached the handler");
    };

    assert_eq!(notification.topic, topic);
    assert_eq!(notification.body.as_ref(), body.as_bytes());
    assert_eq!(
        notification.content_type.as_deref(),
        Some("application/json")
    );
    let signature = notification
        .headers
        .get(HUB_SIGNATURE_HEADER)
        .and_then(|value| value.to_str().ok());
    assert!(
        signature::verify(SECRET.as_bytes(), body.as_bytes(), signature),
        "websubd signs with the subscription's secret: {signature:?}"
    );
    let stats = receiver.stats();
    assert_eq!(stats.signature_rejected, 0);
    assert!(stats.delivered >= 1);
}
