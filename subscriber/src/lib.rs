//! The subscriber's side, for services that receive from a WebSub hub
//! (websub-hub or any compliant hub) or from websub-hub's outbox webhooks,
//! without compiling the hub:
//!
//! - [`Receiver`]: an axum router that confirms only the verifications of
//!   intent this service asked for, checks `X-Hub-Signature` (or the
//!   messaging webhook signature) over the raw body before anything else,
//!   drops duplicate event ids through a pluggable [`DedupStore`], and calls
//!   the service's [`NotificationHandler`];
//! - [`SubscriberClient`]: subscribe and unsubscribe requests, user tokens,
//!   and [`discover`]y of a topic's hub;
//! - [`Intents`]: what the service asked for, shared by the two;
//! - [`Renewer`]: re-subscribes before leases run out.
//!
//! ```rust,no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use tokio_util::sync::CancellationToken;
//! use websub_subscriber::{
//!     NotificationError, Intents, MemoryDedup, Notification, Receiver, Renewer, SubscriberClient,
//! };
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let intents = Intents::new();
//! let receiver = Receiver::builder()
//!     .intents(intents.clone())
//!     .callback("/websub")
//!     .webhook("/hooks/outbox", "a webhook secret")
//!     .dedup(Arc::new(MemoryDedup::new(100_000)))
//!     .handler(|notification: Notification| async move {
//!         println!("{}: {} bytes", notification.topic, notification.body.len());
//!         Ok::<(), NotificationError>(())
//!     })
//!     .build()?;
//! let app: axum::Router = receiver.router();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! tokio::spawn(async move { axum::serve(listener, app).await });
//!
//! // reqwest runs on rustls without a crypto provider of its own.
//! let _ = rustls::crypto::ring::default_provider().install_default();
//! let client = SubscriberClient::new("https://hub.example/".parse()?, reqwest::Client::new())
//!     .with_intents(intents);
//! client
//!     .subscribe(
//!         "https://publisher.example/feed",
//!         "https://me.example/websub",
//!         Some(Duration::from_secs(86_400)),
//!         Some("a secret shared with the hub"),
//!     )
//!     .await?;
//! let stop = CancellationToken::new();
//! tokio::spawn(Renewer::new(client).run(stop.clone()));
//! # Ok(())
//! # }
//! ```

mod client;
mod dedup;
mod discovery;
mod error;
mod intents;
mod receiver;
mod renew;
mod report;

pub use client::SubscriberClient;
pub use dedup::{Claim, DEFAULT_DEDUP_CAPACITY, DedupError, DedupStore, MemoryDedup};
pub use discovery::{Discovery, LinkValue, discover, parse_link_header};
pub use error::ClientError;
pub use intents::{IntentError, Intents, State, Status};
pub use receiver::{
    BuildError, DEFAULT_MAX_BODY_BYTES, Notification, NotificationError, NotificationHandler,
    Receiver, ReceiverBuilder, Source,
};
pub use renew::{DEFAULT_RENEW_FRACTION, Renewer};
pub use report::{ReceiverEvent, ReceiverStats};
