//! The delivery metrics, one set of names for every channel: registered once
//! per channel when its scheduler starts, never looked up per delivery.

use super::Channel;

/// `websub_deliveries_total{channel, outcome}`: attempts by what they came
/// to. `outcome` is `delivered`, `gone` (a WebSub 410 that ended the
/// subscription), `retried` or `exhausted`.
pub const DELIVERIES_TOTAL: &str = "websub_deliveries_total";

/// The `outcome` label of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tally {
    /// Delivered.
    Delivered,
    /// A WebSub 410 that ended the subscription.
    Gone,
    /// Failed, to be retried.
    Retried,
    /// Failed with no retries left.
    Exhausted,
}

/// One channel's counters.
#[derive(Debug, Clone)]
pub struct DeliveryMetrics {
    delivered: metrics::Counter,
    gone: metrics::Counter,
    retried: metrics::Counter,
    exhausted: metrics::Counter,
}

impl DeliveryMetrics {
    /// Registers the counters of `channel`.
    pub fn register(channel: Channel) -> Self {
        let counter = |outcome: &'static str| metrics::counter!(DELIVERIES_TOTAL, "channel" => channel.label(), "outcome" => outcome);
        metrics::describe_counter!(
            DELIVERIES_TOTAL,
            "Delivery attempts by channel and by what they came to"
        );
        Self {
            delivered: counter("delivered"),
            gone: counter("gone"),
            retried: counter("retried"),
            exhausted: counter("exhausted"),
        }
    }

    /// Counts one attempt.
    pub fn count(&self, outcome: Tally) {
        let counter = match outcome {
            Tally::Delivered => &self.delivered,
            Tally::Gone => &self.gone,
            Tally::Retried => &self.retried,
            Tally::Exhausted => &self.exhausted,
        };
        counter.increment(1);
    }
}
