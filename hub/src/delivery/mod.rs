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
//! Everything else is here, once:
//!
//! - [`retry`]: the retry policy and the one decision after a failure;
//! - [`attempt`]: the request with the channel's signature headers, the
//!   POST under its timeout, the bounded drain, the classification of the
//!   answer, and the one format of a recorded error;
//! - [`verdict`]: answers turned into delivered / gone / retry / exhausted,
//!   counted and logged once;
//! - [`client`]: the builder of every outgoing HTTP client, with the network
//!   policy;
//! - [`direct`]: the client WebSub deliveries are carried by, hyper's own;
//! - [`pool`]: a client per callback host, the least recently used dropped
//!   first, so idle connections are bounded as a whole;
//! - [`recorder`]: gathering, batching and retrying the writes of outcomes;
//! - [`metrics`]: one set of metric names, labelled by [`Channel`];
//! - [`limit`]: an endpoint's in-flight limit, adapting to how it answers;
//! - [`health`]: failures counted per endpoint, and endpoints disabled after
//!   too many in a row;
//! - [`changes`]: each change of an endpoint's state, counted and kept;
//! - [`operator`]: the changes sent to the optional operator webhook, an
//!   endpoint like any other;
//! - [`net`]: the network policy for everything contacted on others' behalf
//!   (deliveries, verifications, topic fetches), enforced by every client.

pub mod attempt;
pub mod changes;
pub mod client;
pub mod direct;
pub mod health;
pub mod limit;
pub mod metrics;
pub mod net;
pub mod operator;
pub mod outbox;
pub mod pool;
pub mod recorder;
pub mod retry;
pub mod verdict;
pub mod websub;

pub use attempt::{Answer, MESSAGING_SCHEME, Request, SignatureScheme, WEBSUB_SCHEME, error_chain};
pub use health::Endpoints;
pub use recorder::{Batching, OutcomeStore};
pub use retry::{NextStep, RetryPolicy};
pub use verdict::{Judge, Verdict};

/// Which way a delivery goes: its metrics label, and what a 410 means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// A POST to a WebSub subscription's callback.
    WebSub,
    /// A POST to an outbox webhook.
    Webhook,
    /// A call of an in-process outbox handler.
    Handler,
    /// A POST of an endpoint change to the operator webhook.
    Operator,
}

impl Channel {
    /// The `channel` label of its metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::WebSub => "websub",
            Self::Webhook => "webhook",
            Self::Handler => "handler",
            Self::Operator => "operator",
        }
    }
}
