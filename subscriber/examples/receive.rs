//! A service that only receives: it subscribes to a topic at a hub, confirms
//! the hub's verification, checks each notification's signature, drops
//! duplicates and prints what arrives, renewing its lease as it runs out.
//! It depends on `websub-subscriber` alone, not on the hub.
//!
//! ```sh
//! cargo run -p websub-subscriber --example receive -- \
//!     http://127.0.0.1:8080/ https://publisher.example/feed http://127.0.0.1:3000/websub
//! ```

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use websub_subscriber::{
    Intents, Notification, NotificationError, Receiver, Renewer, SubscriberClient,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(hub), Some(topic), Some(callback)) = (args.next(), args.next(), args.next()) else {
        return Err("usage: receive HUB_URL TOPIC CALLBACK_URL".into());
    };
    let callback_url: url::Url = callback.parse()?;
    let secret = "a secret only this service and the hub know";

    let intents = Intents::new();
    let receiver = Receiver::builder()
        .intents(intents.clone())
        .callback(callback_url.path())
        .handler(|notification: Notification| async move {
            println!(
                "{}: {} bytes, event {:?}",
                notification.topic,
                notification.body.len(),
                notification.event_id
            );
            Ok::<(), NotificationError>(())
        })
        .build()?;
    let address = format!(
        "{}:{}",
        callback_url.host_str().unwrap_or("127.0.0.1"),
        callback_url.port_or_known_default().unwrap_or(80)
    );
    let listener = tokio::net::TcpListener::bind(&address).await?;
    let stop = CancellationToken::new();
    let serving = tokio::spawn(axum::serve(listener, receiver.router()).into_future());

    // reqwest runs on rustls without a crypto provider of its own.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = SubscriberClient::new(hub.parse()?, reqwest::Client::new()).with_intents(intents);
    client
        .subscribe(
            &topic,
            &callback,
            Some(Duration::from_secs(86_400)),
            Some(secret),
        )
        .await?;
    let renewing = tokio::spawn(Renewer::new(client).run(stop.clone()));

    tokio::signal::ctrl_c().await?;
    stop.cancel();
    renewing.await?;
    serving.abort();
    Ok(())
}
