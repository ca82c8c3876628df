//! websub-hub: a WebSub hub that is also the delivery end of a transactional
//! outbox.
//!
//! The library does the work; `websubd` only wires it. [`serve`] takes a
//! bound listener, a validated [`HubConfig`] and a shutdown future, and runs
//! the hub until the future resolves, then drains in-flight work.
//!
//! There are **two sources** of events and **one delivery core**:
//! - the hub's own event log, fed by WebSub publishers, distributed to the
//!   subscriptions of each topic by the WebSub scheduler ([`dispatch`]);
//! - producers' outbox tables, delivered to webhooks and in-process handlers
//!   by the outbox scheduler ([`outbox::Dispatcher`]), which the hub runs per
//!   [`feed`];
//! - both hand every attempt to [`delivery`]: retry policy, request and
//!   signature headers, POST, verdict, HTTP clients, outcome recorder and
//!   metrics exist there once. `docs/architecture.md` draws the flow.
//!
//! The modules, one per job:
//! - [`protocol`]: parsing and validating WebSub requests (the
//!   `websub-protocol` crate, re-exported);
//! - [`verify`]: verification of intent, denials, and the subscription
//!   workflow that saves or deletes only after success;
//! - [`lease`]: lease clamping and the reaper of expired subscriptions;
//! - [`quota`]: total-quota enforcement against the subscriptions service;
//! - [`auth`]: user tokens and the internal API key;
//! - [`intake`]: publish pings, topic fetches, fat pings;
//! - [`backlog`]: acknowledged work not yet done (pending topic fetches and
//!   verifications), durable before its answer, and the workers that claim
//!   it;
//! - [`events`]: the durable event log, per-subscriber delivery records and
//!   the history of their attempts;
//! - [`dispatch`]: the WebSub scheduler: expand, claim, hand to the core;
//! - [`replicas`]: the replicas sharing one PostgreSQL database, their
//!   heartbeats, and the takeover of a dead one's claims;
//! - [`outbox`]: the outbox scheduler, and the producer side (the
//!   `websub-outbox` crate, re-exported);
//! - [`feed`]: the hub consuming a producer's outbox, bridged to WebSub;
//! - [`delivery`]: the delivery core both schedulers share;
//! - [`net`]: the network policy for everything contacted on others' behalf;
//! - [`signature`]: the HMAC signatures and their header names (from
//!   `websub-protocol`);
//! - [`api`]: the HTTP adapter; [`routes`]: its route table with each
//!   route's policy, and the table's export for Traefik; [`server`]:
//!   assembling and running a hub, which serves connections under bounds on
//!   slow, idle and surplus clients;
//! - [`telemetry`]: every metric's name and help, histogram buckets, and the
//!   gauges sampled from the databases;
//! - [`subscriber`]: the receiving side for services that subscribe (the
//!   `websub-subscriber` crate, re-exported: a service that only receives
//!   depends on it alone);
//! - [`config`]: settings, defaults and validation; [`clock`]: injected time.
//!
//! Running a hub on the embedded default until Ctrl-C:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = websub_hub::HubConfig::default();
//! let listener = tokio::net::TcpListener::bind(config.listen).await?;
//! websub_hub::serve(listener, config, async {
//!     let _ = tokio::signal::ctrl_c().await;
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```
//!
//! Deciding what follows a failed delivery, as both schedulers do:
//!
//! ```
//! use std::time::Duration;
//! use websub_hub::delivery::{NextStep, RetryPolicy};
//!
//! let policy = RetryPolicy::default();
//! assert_eq!(policy.after_failure(0), NextStep::RetryAfter(Duration::ZERO));
//! assert_eq!(policy.after_failure(10), NextStep::GiveUp);
//! ```

pub mod admin;
pub mod api;
pub mod auth;
pub mod backlog;
pub mod clock;
pub mod config;
pub mod delivery;
pub mod descriptors;
pub mod dispatch;
pub mod events;
pub mod feed;
mod future;
pub mod intake;
pub mod lease;
mod listen;
pub mod net;
pub mod outbox;
pub use websub_protocol as protocol;
pub mod quota;
pub mod replicas;
pub mod routes;
pub mod server;
mod setting;
pub use websub_protocol::signature;
pub use websub_subscriber as subscriber;
pub mod telemetry;
pub mod verify;

pub use config::HubConfig;
pub use server::serve;
pub use websub_store as store;
