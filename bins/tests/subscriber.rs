//! The subscriber helpers against the real `websubd` binary: a client
//! subscribes a receiver, and a publish reaches the receiver's handler with
//! a valid signature.

use crate::common;

use std::time::{Duration, Instant};

use common::{Websubd, free_port, scratch_dir};

use tokio::sync::mpsc;
use websub_hub::signature::{self, HUB_SIGNATURE_HEADER};
use websub_hub::subscriber::{Notification, NotificationError, Receiver, State, SubscriberClient};
use websub_tests::{http_client, serve_on_loopback};

const INTERNAL_KEY: &str = "an-internal-api-key-of-at-least-32-characters";
const SECRET: &str = "a secret shared with websubd";

async fn start_websubd() -> (Websubd, String) {
    let dir = scratch_dir("subscriber");
    let hub = Websubd::spawn(
        &dir,
        free_port(),
        &[
            "--allow-private-network",
            "--internal-api-key",
            INTERNAL_KEY,
            "--poll-interval",
            "200ms",
        ],
    )
    .ready()
    .await;
    let url = hub.url.clone();
    (hub, url)
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
                    .map_err(|_| NotificationError::from("the test stopped listening"))
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
    // The receiver counts a delivery once the handler has returned, which
    // is after the handler passed the notification on.
    let deadline = Instant::now() + Duration::from_secs(5);
    while receiver.stats().delivered == 0 {
        assert!(Instant::now() < deadline, "the delivery was never counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(receiver.stats().signature_rejected, 0);
}
