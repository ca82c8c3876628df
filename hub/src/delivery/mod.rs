//! Scheduling and delivery: the two schedulers, and the delivery core they
//! share, whichever channel a delivery is on.
//!
//! The schedulers decide what is due and in which order:
//! - [`websub`]: the WebSub scheduler, whose [`Distributor`](websub::Distributor)
//!   expands the events of the hub's own log into the subscriptions of their
//!   topic, claims them per endpoint lane and hands each to the core;
//! - [`outbox`]: the outbox scheduler, whose [`Dispatcher`](outbox::Dispatcher)
//!   delivers the rows of a producer's outbox to registered webhooks and
//!   in-process handlers.
//!
//! The core every channel shares (the attempt, its verdict and retry
//! policy, the clients, the network policy, the outcome recorder, the
//! metrics and the adaptive limit) is the `websub-delivery` crate,
//! re-exported here. What stands on the hub's own storage is here:
//!
//! - [`health`]: failures counted per endpoint, and endpoints disabled after
//!   too many in a row;
//! - [`changes`]: each change of an endpoint's state, counted and kept;
//! - [`operator`]: the changes sent to the optional operator webhook, an
//!   endpoint like any other.

pub mod changes;
pub mod health;
pub mod operator;
pub mod outbox;
pub mod websub;

pub use websub_delivery::{
    Channel, attempt, client, direct, limit, metrics, net, pool, recorder, retry, verdict,
};

pub use attempt::{Answer, MESSAGING_SCHEME, Request, SignatureScheme, WEBSUB_SCHEME, error_chain};
pub use health::Endpoints;
pub use recorder::{Batching, OutcomeStore};
pub use retry::{NextStep, RetryPolicy};
pub use verdict::{Judge, Verdict};
