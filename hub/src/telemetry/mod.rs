//! What operators read off a running hub besides its APIs: the name, kind
//! and help text of every metric it exports (in one table, so that
//! `/metrics` has `# HELP` and `# TYPE` for each), the histogram buckets,
//! and the gauges sampled from the databases.

pub mod meters;

pub use websub_delivery::otlp::{Exporting, OtlpError};
pub use websub_delivery::{otlp, traces};

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::delivery::Channel;
use crate::delivery::outbox::{
    OUTBOX_BACKLOG, OUTBOX_LISTENER_CONNECTED, OUTBOX_OLDEST_UNDELIVERED_SECONDS,
};
use crate::storage::backlog::Backlog;
use crate::storage::events::DeliveryOperations;

use crate::delivery::changes::ENDPOINT_CHANGES_DROPPED_TOTAL;
use crate::delivery::health::{
    ENDPOINT_CHANGES_TOTAL, ENDPOINTS_DISABLED, ENDPOINTS_DISABLED_TOTAL, ENDPOINTS_OPEN,
};
use crate::delivery::metrics::{
    ATTEMPT_SECONDS, DELIVERIES_IN_FLIGHT, DELIVERIES_TOTAL, DELIVERIES_WAITING_FOR_HOST,
    DELIVERY_LATENCY_SECONDS,
};
use crate::delivery::operator::OPERATOR_WEBHOOK_DELIVERIES_TOTAL;
use crate::intake::lease::EXPIRED_METRIC;
use crate::intake::publish::{EVENTS_RECORDED_TOTAL, FETCHES_TOTAL};
use crate::intake::verify::VERIFICATIONS_TOTAL;
use crate::web::api::{HTTP_REQUEST_SECONDS, HTTP_REQUESTS_TOTAL, SHED_TOTAL};
use crate::web::connections::{CLOSED_METRIC, OPEN_METRIC, REFUSED_METRIC};

/// A metric's kind, as `# TYPE` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets.
    Histogram,
}

/// Every metric the hub exports: name, kind, help.
pub const METRICS: &[(&str, Kind, &str)] = &[
    (
        traces::SPANS_DROPPED_TOTAL,
        Kind::Counter,
        "Trace spans dropped because the export queue was full (the OTLP collector slow or \
         unreachable): deliveries never wait for the collector.",
    ),
    (
        DELIVERIES_TOTAL,
        Kind::Counter,
        "Delivery attempts by channel (websub, webhook, handler) and by what they came to \
         (delivered, gone, retried, exhausted, postponed: not made or failed for want of the \
         hub's own resources, tried again without counting a failure).",
    ),
    (
        ATTEMPT_SECONDS,
        Kind::Histogram,
        "How long one delivery attempt took, by channel, from the request to the end of its \
         answer (or the error).",
    ),
    (
        DELIVERY_LATENCY_SECONDS,
        Kind::Histogram,
        "From an event's recording (a publish, a fat ping, an outbox commit) to its \
         successful delivery, by channel, retries included.",
    ),
    (
        DELIVERIES_IN_FLIGHT,
        Kind::Gauge,
        "Delivery attempts on the wire now, by channel.",
    ),
    (
        DELIVERIES_WAITING_FOR_HOST,
        Kind::Gauge,
        "Claimed deliveries waiting in their callback host's lane for a free slot (its \
         adaptive in-flight limit), by channel.",
    ),
    (
        ENDPOINT_CHANGES_TOTAL,
        Kind::Counter,
        "Endpoint state changes, by channel and new state: failing (attempts fail in a row: \
         half way to opening), open (failing in a row: deliveries \
         wait while the next one probes), recovered (answering again: what waited is sent), \
         disabled (after failures, a long outage, or by an operator), enabled (by an \
         operator). Each is kept in the history and sent to the operator webhook.",
    ),
    (
        ENDPOINT_CHANGES_DROPPED_TOTAL,
        Kind::Counter,
        "Endpoint state changes counted but not kept in the history, by channel: the queue \
         to the history was full, or writing failed.",
    ),
    (
        OPERATOR_WEBHOOK_DELIVERIES_TOTAL,
        Kind::Counter,
        "Endpoint changes sent to the operator webhook, by outcome: delivered, retried, held \
         (its breaker is open), failed (out of retries), dropped (past the backlog's bound \
         or age).",
    ),
    (
        ENDPOINTS_OPEN,
        Kind::Gauge,
        "Endpoints whose breaker is open now in this process, by channel.",
    ),
    (
        ENDPOINTS_DISABLED_TOTAL,
        Kind::Counter,
        "Endpoints disabled, by channel and by who disabled them: the hub after deliveries \
         exhausted their retries too many times in a row (failures) or after a long outage \
         (outage), or an operator.",
    ),
    (
        ENDPOINTS_DISABLED,
        Kind::Gauge,
        "Endpoints disabled now, by channel: their deliveries are recorded as skipped.",
    ),
    (
        EVENTS_RECORDED_TOTAL,
        Kind::Counter,
        "Events recorded in the hub's event log from publishes.",
    ),
    (
        FETCHES_TOTAL,
        Kind::Counter,
        "Topic fetches after a thin publish ping, by outcome (recorded, not_modified, \
         no_subscribers, retried, failed).",
    ),
    (
        VERIFICATIONS_TOTAL,
        Kind::Counter,
        "Verifications of intent by mode (subscribe, unsubscribe) and outcome (verified, \
         retried, failed, denied).",
    ),
    (
        EXPIRED_METRIC,
        Kind::Counter,
        "Subscriptions removed because their lease ran out.",
    ),
    (
        SHED_TOTAL,
        Kind::Counter,
        "Requests answered 503 with Retry-After: not accepted, to be sent again.",
    ),
    (
        HTTP_REQUESTS_TOTAL,
        Kind::Counter,
        "HTTP requests answered, by route (the matched pattern), method and status.",
    ),
    (
        HTTP_REQUEST_SECONDS,
        Kind::Histogram,
        "From an HTTP request's head to its answer's head, by route and method.",
    ),
    (
        DELIVERY_BACKLOG,
        Kind::Gauge,
        "Delivery records due, retrying or in flight, by channel (sampled).",
    ),
    (
        OLDEST_UNDELIVERED_SECONDS,
        Kind::Gauge,
        "Age of the oldest event with a delivery still to make, by channel; 0 when none \
         (sampled).",
    ),
    (
        VERIFICATIONS_WAITING,
        Kind::Gauge,
        "Verifications of intent due, retrying or in flight (sampled).",
    ),
    (
        FETCHES_WAITING,
        Kind::Gauge,
        "Topic fetches due, retrying or in flight (sampled).",
    ),
    (
        OUTBOX_LISTENER_CONNECTED,
        Kind::Gauge,
        "1 while an outbox feed's LISTEN connection is up, 0 while it reconnects, by outbox \
         table.",
    ),
    (
        OUTBOX_BACKLOG,
        Kind::Gauge,
        "An outbox feed's delivery rows due, retrying or in flight, by outbox table \
         (sampled).",
    ),
    (
        OUTBOX_OLDEST_UNDELIVERED_SECONDS,
        Kind::Gauge,
        "Age of an outbox feed's oldest event with a delivery row still to deliver, by \
         outbox table; 0 when none (sampled).",
    ),
    (
        crate::storage::replicas::CLAIMS_TAKEN_OVER_TOTAL,
        Kind::Counter,
        "Claims of dead replicas (on PostgreSQL) handed back to be claimed again at once, by \
         kind (delivery, verification, fetch).",
    ),
    (OPEN_METRIC, Kind::Gauge, "HTTP connections open."),
    (
        CLOSED_METRIC,
        Kind::Counter,
        "HTTP connections the hub closed: a head or body too slow, an idle wait too long, \
         or evicted to make room at the connection limit.",
    ),
    (
        REFUSED_METRIC,
        Kind::Counter,
        "HTTP connections answered 503 at the connection limit.",
    ),
];

/// Buckets of the short histograms (attempts, requests), in seconds.
const SHORT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of publish-to-delivery latency, in seconds: from milliseconds
/// to the hours a retry budget can span.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0, 14400.0,
];

/// The Prometheus recorder's builder, with the hub's histograms as
/// histograms (buckets) rather than summaries.
pub fn prometheus() -> PrometheusBuilder {
    let histograms = METRICS
        .iter()
        .filter(|(_, kind, _)| *kind == Kind::Histogram);
    let mut builder = PrometheusBuilder::new();
    for (name, _, _) in histograms {
        builder = builder
            .set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets(name))
            .unwrap_or_else(|_| unreachable!("the bucket lists are not empty"));
    }
    builder
}

/// The buckets of the histogram `name`.
fn buckets(name: &str) -> &'static [f64] {
    if name == DELIVERY_LATENCY_SECONDS {
        LATENCY_BUCKETS
    } else {
        SHORT_BUCKETS
    }
}

/// The help text of the metric `name`, if it is one of [`METRICS`].
fn help(name: &str) -> Option<&'static str> {
    METRICS
        .iter()
        .find(|(known, _, _)| *known == name)
        .map(|(_, _, help)| *help)
}

/// Gives every metric its help text, on the recorder installed now.
pub fn describe() {
    for (name, kind, help) in METRICS {
        match kind {
            Kind::Counter => metrics::describe_counter!(*name, *help),
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Histogram => metrics::describe_histogram!(*name, *help),
        }
    }
}

/// `websub_delivery_backlog{channel="websub"}`: WebSub delivery records due,
/// retrying or in flight.
pub const DELIVERY_BACKLOG: &str = "websub_delivery_backlog";

/// `websub_oldest_undelivered_seconds{channel="websub"}`: the age of the
/// oldest event with a record still to deliver (0 when there is none).
pub const OLDEST_UNDELIVERED_SECONDS: &str = "websub_oldest_undelivered_seconds";

/// `websub_verifications_waiting`: verifications of intent due, retrying or
/// in flight.
pub const VERIFICATIONS_WAITING: &str = "websub_verifications_waiting";

/// `websub_fetches_waiting`: topic fetches due, retrying or in flight.
pub const FETCHES_WAITING: &str = "websub_fetches_waiting";

/// How often the gauges read from the databases are sampled: often enough
/// for a dashboard, rarely enough that counting a large backlog costs
/// nothing that matters.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// Samples the WebSub backlog gauges every [`SAMPLE_INTERVAL`] until `stop`.
/// A failed read leaves a gauge as it was; the database's trouble shows in
/// `/readyz` and the log.
pub async fn sample(
    events: Arc<dyn DeliveryOperations>,
    backlog: Arc<dyn Backlog>,
    stop: CancellationToken,
) {
    let channel = Channel::WebSub.label();
    let records = metrics::gauge!(DELIVERY_BACKLOG, "channel" => channel);
    let oldest = metrics::gauge!(OLDEST_UNDELIVERED_SECONDS, "channel" => channel);
    let verifications = metrics::gauge!(VERIFICATIONS_WAITING);
    let fetches = metrics::gauge!(FETCHES_WAITING);
    loop {
        match events.undelivered().await {
            Ok(undelivered) => {
                records.set(undelivered.records as f64);
                oldest.set(age_seconds(undelivered.oldest));
            }
            Err(error) => debug!(%error, "sampling the delivery backlog failed"),
        }
        match backlog.waiting().await {
            Ok(waiting) => {
                verifications.set(waiting.verifications as f64);
                fetches.set(waiting.fetches as f64);
            }
            Err(error) => debug!(%error, "sampling the backlog failed"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(SAMPLE_INTERVAL) => {}
        }
    }
}

/// Drains the recorder's histogram samples into their buckets every
/// [`SAMPLE_INTERVAL`] until `stop`: without it they pile up between
/// scrapes, and without scrapes, for ever.
pub async fn upkeep(handle: PrometheusHandle, stop: CancellationToken) {
    loop {
        handle.run_upkeep();
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(SAMPLE_INTERVAL) => {}
        }
    }
}

/// Seconds since `at`, 0 for none (or for a time ahead of this clock).
fn age_seconds(at: Option<DateTime<Utc>>) -> f64 {
    at.map_or(0.0, |at| {
        Utc::now()
            .signed_duration_since(at)
            .to_std()
            .unwrap_or_default()
            .as_secs_f64()
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_metric_is_named_once_under_the_hubs_prefix_with_a_help_text() {
        let mut seen = HashSet::new();
        for (name, _, help) in METRICS {
            assert!(seen.insert(*name), "{name} twice");
            assert!(name.starts_with("websub_"), "{name}");
            assert!(help.ends_with('.'), "{name}: a sentence");
        }
    }

    #[test]
    fn ages_are_never_negative() {
        assert_eq!(age_seconds(None), 0.0);
        assert_eq!(
            age_seconds(Some(Utc::now() + chrono::Duration::hours(1))),
            0.0
        );
        assert!(age_seconds(Some(Utc::now() - chrono::Duration::seconds(5))) >= 5.0);
    }
}
