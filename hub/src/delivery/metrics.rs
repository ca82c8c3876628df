//! The delivery metrics, one set of names for every channel: registered once
//! per channel when its scheduler starts, never looked up per delivery.

use super::Channel;
use super::verdict::Verdict;

/// `websub_deliveries_total{channel, outcome}`: attempts by what they came
/// to. `outcome` is `delivered`, `gone` (a WebSub 410 that ended the
/// subscription), `retried` or `exhausted`.
pub const DELIVERIES_TOTAL: &str = "websub_deliveries_total";

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
    pub fn count(&self, verdict: &Verdict) {
        match verdict {
            Verdict::Delivered => self.delivered.increment(1),
            Verdict::Gone => self.gone.increment(1),
            Verdict::Retry { .. } => self.retried.increment(1),
            Verdict::Exhausted { .. } => self.exhausted.increment(1),
        }
    }
}
