//! websub-hub: a WebSub hub that is also the delivery end of a transactional
//! outbox.
//!
//! The library does the work; `websubd` only wires it. [`serve`] takes a
//! bound listener, a validated [`HubConfig`] and a shutdown future, and runs
//! the hub until the future resolves, then drains in-flight work.
//!
//! One module per job:
//! - [`protocol`]: parsing and validating WebSub requests;
//! - [`verify`]: verification of intent, denials, and the subscription
//!   workflow that saves or deletes only after success;
//! - [`lease`]: lease clamping and the reaper of expired subscriptions;
//! - [`net`]: the network policy for callbacks and topic fetches;
//! - [`intake`]: publish pings, topic fetches, fat pings;
//! - [`events`]: the durable event log and per-subscriber delivery records;
//! - [`dispatch`]: expand, claim, deliver, record;
//! - [`outbox`]: producers' outbox tables: writing events, the dispatcher
//!   that delivers them to handlers and webhooks, and the feed that turns
//!   them into hub events;
//! - [`signature`]: `X-Hub-Signature` and webhook signatures;
//! - [`quota`]: total-quota enforcement against the subscriptions service;
//! - [`auth`]: user tokens and the internal API key;
//! - [`api`]: the HTTP adapter;
//! - [`subscriber`]: the receiving side for services that subscribe;
//! - [`config`]: settings, defaults and validation.

pub mod api;
pub mod auth;
pub mod clock;
pub mod config;
pub mod delivery;
pub mod dispatch;
pub mod events;
pub mod feed;
mod future;
pub mod intake;
pub mod lease;
pub mod net;
pub mod outbox;
pub mod protocol;
pub mod quota;
pub mod server;
mod setting;
pub mod signature;
pub mod subscriber;
pub mod verify;

pub use config::HubConfig;
pub use server::serve;
pub use websub_store as store;
