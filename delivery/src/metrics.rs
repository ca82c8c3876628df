//! The delivery metrics, one set of names for every channel: registered once
//! per channel when its scheduler starts, never looked up per delivery.

use crate::Channel;

/// `websub_deliveries_total{channel, outcome}`: attempts by what they came
/// to. `outcome` is `delivered`, `gone` (a WebSub 410 that ended the
/// subscription), `retried` or `exhausted`.
pub const DELIVERIES_TOTAL: &str = "websub_deliveries_total";

/// `websub_delivery_attempt_seconds{channel}`: how long each attempt took.
pub const ATTEMPT_SECONDS: &str = "websub_delivery_attempt_seconds";

/// `websub_delivery_latency_seconds{channel}`: from an event's recording
/// to its delivery, for each delivered one.
pub const DELIVERY_LATENCY_SECONDS: &str = "websub_delivery_latency_seconds";

/// `websub_deliveries_in_flight{channel}`: attempts on the wire.
pub const DELIVERIES_IN_FLIGHT: &str = "websub_deliveries_in_flight";

/// `websub_deliveries_waiting_for_host{channel}`: claimed records waiting
/// in their callback host's queue for a free slot of the host.
pub const DELIVERIES_WAITING_FOR_HOST: &str = "websub_deliveries_waiting_for_host";

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
    /// Not made, or failed for want of the hub's own resources (its
    /// host's queue was full for too long, no descriptor): tried again
    /// without counting a failure.
    Postponed,
}

/// One channel's metrics.
#[derive(Debug, Clone)]
pub struct DeliveryMetrics {
    delivered: metrics::Counter,
    gone: metrics::Counter,
    retried: metrics::Counter,
    exhausted: metrics::Counter,
    postponed: metrics::Counter,
    attempt_seconds: metrics::Histogram,
    latency_seconds: metrics::Histogram,
    in_flight: metrics::Gauge,
}

/// One attempt on the wire: counted in flight until it is dropped.
#[derive(Debug)]
pub struct InFlight {
    started: std::time::Instant,
    in_flight: metrics::Gauge,
}

impl InFlight {
    /// How long the attempt has run.
    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.in_flight.decrement(1.0);
    }
}

impl DeliveryMetrics {
    /// Registers the metrics of `channel`.
    pub fn register(channel: Channel) -> Self {
        let label = channel.label();
        let counter = |outcome: &'static str| metrics::counter!(DELIVERIES_TOTAL, "channel" => label, "outcome" => outcome);
        Self {
            delivered: counter("delivered"),
            gone: counter("gone"),
            retried: counter("retried"),
            exhausted: counter("exhausted"),
            postponed: counter("postponed"),
            attempt_seconds: metrics::histogram!(ATTEMPT_SECONDS, "channel" => label),
            latency_seconds: metrics::histogram!(DELIVERY_LATENCY_SECONDS, "channel" => label),
            in_flight: metrics::gauge!(DELIVERIES_IN_FLIGHT, "channel" => label),
        }
    }

    /// An attempt starts.
    pub fn attempting(&self) -> InFlight {
        self.in_flight.increment(1.0);
        InFlight {
            started: std::time::Instant::now(),
            in_flight: self.in_flight.clone(),
        }
    }

    /// The attempt `attempt` ended; its event was recorded at `recorded`,
    /// and was delivered if `delivered`.
    pub fn attempted(
        &self,
        attempt: InFlight,
        recorded: chrono::DateTime<chrono::Utc>,
        delivered: bool,
    ) {
        self.attempt_seconds
            .record(attempt.started.elapsed().as_secs_f64());
        if delivered {
            let age = chrono::Utc::now().signed_duration_since(recorded);
            // A clock that went back (or a producer's skewed one) gives no
            // meaningful latency; zero rather than nothing keeps the count.
            self.latency_seconds
                .record(age.to_std().unwrap_or_default().as_secs_f64());
        }
    }

    /// Counts one attempt.
    pub fn count(&self, outcome: Tally) {
        let counter = match outcome {
            Tally::Delivered => &self.delivered,
            Tally::Gone => &self.gone,
            Tally::Retried => &self.retried,
            Tally::Exhausted => &self.exhausted,
            Tally::Postponed => &self.postponed,
        };
        counter.increment(1);
    }
}
