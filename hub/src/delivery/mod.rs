//! Scheduling and delivery: the two schedulers, and the delivery core they
//! share, whichever channel a delivery is on.
//!
//! The schedulers decide what is due and in which order:
//! - [`websub`]: the WebSub scheduler, whose [`Distributor`](websub::Distributor)
//!   expands the events of the hub's own log into the subscriptions of their
//!   topic, claims them per endpoint lane and hands each to the core;
//! - [`outbox`]: the outbox scheduler, whose [`Dispatcher`](outbox::Dispatcher)
//!   delivers the rows of a producer's outbox to registered webhooks and
//!   in-process handlers (the `websub-dispatcher` crate).
//!
//! The core every channel shares (the attempt, its verdict and retry
//! policy, the clients, the network policy, the outcome recorder, the
//! metrics, the adaptive limit, endpoint [`health`] and its [`changes`],
//! and the [`operator`] webhook they are sent to) is the `websub-delivery`
//! crate, re-exported here; it keeps endpoint state through the hub's event
//! log ([`EndpointStates`](crate::storage::events::EndpointStates)). The
//! outbox scheduler is the `websub-dispatcher` crate, so a service can
//! embed it without the hub.

pub mod websub;

pub use websub_delivery::{
    Answer, Batching, Channel, Endpoints, Judge, MESSAGING_SCHEME, NextStep, OutcomeStore, Request,
    RetryPolicy, SignatureScheme, Verdict, WEBSUB_SCHEME, attempt, changes, client, direct,
    error_chain, health, limit, metrics, net, operator, pool, recorder, retry, verdict,
};
/// The outbox scheduler: the `websub-dispatcher` crate, which re-exports
/// the producer side (`websub-outbox`) too.
pub use websub_dispatcher as outbox;
