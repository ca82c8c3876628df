//! The delivery core of websub-hub, whichever channel a delivery is on
//! (a WebSub callback, an outbox webhook, the operator webhook): what one
//! attempt sends and how its answer is judged, the clients that carry it,
//! the retry policy, the adaptive limit of an endpoint, the batched
//! recording of outcomes, and the traces and metrics an attempt leaves.
//! The hub's WebSub scheduler and the outbox's dispatcher
//! (`websub-dispatcher`) are built on it; the hub re-exports it as
//! `websub_hub::delivery`.
//!
//! - [`retry`]: the retry policy and the one decision after a failure;
//! - [`attempt`]: the request with the channel's signature headers, the
//!   POST under its timeout, the bounded drain, the classification of the
//!   answer, and the one format of a recorded error;
//! - [`verdict`]: answers turned into delivered / gone / retry / exhausted,
//!   counted and logged once;
//! - [`client`]: the builder of every outgoing HTTP client, with the network
//!   policy;
//! - [`direct`]: one callback host's keep-alive connections, which carry its
//!   WebSub deliveries and verifications;
//! - [`pool`]: a client per callback host, the least recently used dropped
//!   first, so idle connections are bounded as a whole;
//! - [`recorder`]: gathering, batching and retrying the writes of outcomes;
//! - [`metrics`]: one set of metric names, labelled by [`Channel`];
//! - [`limit`]: an endpoint's in-flight limit, adapting to how it answers;
//! - [`net`]: the network policy for everything contacted on others' behalf
//!   (deliveries, verifications, topic fetches), enforced by every client;
//! - [`traces`]: the spans of an event's way, exported over OTLP when asked;
//! - [`otlp`]: what the OTLP exports of traces and metrics share;
//! - [`health`]: failures counted per endpoint, breakers, and endpoints
//!   disabled after too many failures in a row;
//! - [`changes`]: each change of an endpoint's state, counted and kept;
//! - [`operator`]: the changes sent to the optional operator webhook, an
//!   endpoint like any other;
//! - [`state`]: the contract of whoever keeps endpoint state for them (the
//!   hub's event log), and [`history`]: the changes it keeps;
//! - [`clock`]: injected time; [`setting`]: a bad setting named, and
//!   durations as text.

pub mod attempt;
pub mod changes;
pub mod client;
pub mod clock;
pub mod direct;
pub mod health;
pub mod history;
pub mod limit;
pub mod metrics;
pub mod net;
pub mod operator;
pub mod otlp;
pub mod pool;
pub mod recorder;
pub mod retry;
pub mod setting;
pub mod state;
pub mod traces;
pub mod verdict;

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
