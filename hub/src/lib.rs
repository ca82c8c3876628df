//! websub-hub: a WebSub hub that is also the delivery end of a transactional
//! outbox.
//!
//! The library does the work; `websubd` only wires it. [`serve`] takes a
//! bound listener, a validated [`HubConfig`] and a shutdown future, and runs
//! the hub until the future resolves, then drains in-flight work.
//!
//! There are **two sources** of events and **one delivery core**:
//! - the hub's own event log, fed by WebSub publishers, distributed to the
//!   subscriptions of each topic by the WebSub scheduler
//!   ([`delivery::websub`]);
//! - producers' outbox tables, delivered to webhooks and in-process handlers
//!   by the outbox scheduler ([`delivery::outbox::Dispatcher`]), which the
//!   hub runs per [feed](intake::feed);
//! - both hand every attempt to the [`delivery`] core: retry policy, request
//!   and signature headers, POST, verdict, HTTP clients, outcome recorder
//!   and metrics exist there once. `docs/architecture.md` draws the flow.
//!
//! The modules, by what they own:
//! - [`intake`]: what the hub accepts and keeps until it is done:
//!   [`publish`](intake::publish) (pings, topic fetches, fat pings),
//!   [`verify`](intake::verify) (verification of intent and the
//!   subscription workflow), [`lease`](intake::lease),
//!   [`quota`](intake::quota), the operator's [`deny`](intake::deny) list,
//!   and the [`feed`](intake::feed)s that bring producers' outbox events in;
//! - [`delivery`]: scheduling and delivery: the WebSub scheduler
//!   ([`websub`](delivery::websub)), the outbox scheduler
//!   ([`outbox`](delivery::outbox): the `websub-dispatcher` crate, with
//!   the producer side of the `websub-outbox` crate), and the delivery core
//!   they share, endpoint health and its changes included, with the network
//!   policy ([`net`](delivery::net)) for everything contacted on others'
//!   behalf (the `websub-delivery` crate, re-exported);
//! - [`storage`]: the hub's own tables: the event log and delivery records
//!   ([`events`](storage::events)), acknowledged work not yet done
//!   ([`backlog`](storage::backlog)), the [`replicas`](storage::replicas)
//!   sharing one PostgreSQL database, and the [`dialect`](storage::dialect)
//!   each database is spoken in;
//! - [`web`]: the hub over HTTP: the [`routes`](web::routes) with each
//!   route's policy, the [`api`](web::api) handlers, the
//!   [`admin`](web::admin) page, the subscriber [`portal`](web::portal),
//!   [`auth`](web::auth), and the connections
//!   they are served on under bounds on slow, idle and surplus clients;
//! - [`protocol`]: parsing and validating WebSub requests, and
//!   [`signature`]: the HMAC signatures and their header names (the
//!   `websub-protocol` crate, re-exported);
//! - [`subscriber`]: the receiving side for services that subscribe (the
//!   `websub-subscriber` crate, re-exported: a service that only receives
//!   depends on it alone); [`store`]: the subscription stores (the
//!   `websub-store` crate);
//! - [`server`]: assembling and running a hub; [`config`]: settings,
//!   defaults and validation; [`telemetry`]: every metric's name and help,
//!   histogram buckets, and the gauges sampled from the databases;
//!   [`clock`]: injected time (the delivery core's).
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

pub use websub_delivery::clock;
pub mod config;
pub mod delivery;
pub mod intake;
pub use websub_protocol as protocol;
pub mod server;
pub use websub_protocol::signature;
pub mod storage;
pub use websub_subscriber as subscriber;
pub mod telemetry;
pub mod web;

pub use config::HubConfig;
pub use server::serve;
pub use websub_store as store;
