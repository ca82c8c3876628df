//! Traces and metrics from the real `websubd`, exported over OTLP
//! (http/protobuf) to a collector made here that decodes the real protobuf:
//! one fat ping's intake, expansion and every attempt of every subscription
//! in the publisher's trace, each receiver given the `traceparent` of its
//! attempt; a ping's trace going on through its fetch; an outbox event's
//! trace starting at its intake, with the webhook's attempt under it; a
//! collector that never answers neither slowing a delivery nor holding more
//! spans than the queue, the rest counted; and the metrics of `/metrics`
//! exported as OTLP sums, gauges and histograms with their help texts.

use crate::common;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use common::{Websubd, free_port, prometheus, scratch_dir};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use websub_tests::{
    Answer, LoopbackServer, RecordingReceiver, Route, TestPublisher, TestSubscriber,
    serve_on_loopback,
};

const TOPIC: &str = "http://127.0.0.1:9/topics/traced";
const WAIT: Duration = Duration::from_secs(30);

/// One span as the collector received it, ids in hex.
#[derive(Debug, Clone)]
struct Exported {
    trace: String,
    id: String,
    parent: String,
    name: String,
    kind: i32,
    attributes: HashMap<String, String>,
    service: String,
}

impl Exported {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// One metric's data point as the collector received it: its name,
/// description, labels, and its value (a sum's or gauge's, or a
/// histogram's count).
#[derive(Debug, Clone)]
struct Point {
    name: String,
    description: String,
    kind: &'static str,
    attributes: HashMap<String, String>,
    value: f64,
}

/// What the collector was sent.
#[derive(Debug, Default)]
struct Received {
    spans: Vec<Exported>,
    points: Vec<Point>,
}

/// An OTLP/HTTP collector on loopback, keeping every span and data point
/// it is sent.
struct Collector {
    server: LoopbackServer,
    received: Arc<Mutex<Received>>,
}

impl Collector {
    async fn start() -> Self {
        let received = Arc::new(Mutex::new(Received::default()));
        let app = Router::new()
            .route("/v1/traces", post(collect))
            .route("/v1/metrics", post(collect_metrics))
            .with_state(received.clone());
        Self {
            server: serve_on_loopback(app).await,
            received,
        }
    }

    /// Waits until a data point of `name` with every label of `labels`
    /// has a value that is `enough`, and returns it.
    async fn wait_for_point(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        enough: impl Fn(f64) -> bool,
    ) -> Point {
        let deadline = Instant::now() + WAIT;
        loop {
            let found = self
                .received
                .lock()
                .expect("the points")
                .points
                .iter()
                .rev()
                .find(|point| {
                    point.name == name
                        && enough(point.value)
                        && labels.iter().all(|(key, value)| {
                            point.attributes.get(*key).map(String::as_str) == Some(*value)
                        })
                })
                .cloned();
            if let Some(point) = found {
                return point;
            }
            assert!(
                Instant::now() < deadline,
                "no point of {name} {labels:?} with the value waited for"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.server.address)
    }

    fn spans_of(&self, trace: &str) -> Vec<Exported> {
        self.received
            .lock()
            .expect("the spans")
            .spans
            .iter()
            .filter(|span| span.trace == trace)
            .cloned()
            .collect()
    }

    /// Waits until `enough` holds of the spans of `trace`, and returns them.
    async fn wait_for(&self, trace: &str, enough: impl Fn(&[Exported]) -> bool) -> Vec<Exported> {
        let deadline = Instant::now() + WAIT;
        loop {
            let spans = self.spans_of(trace);
            if enough(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "the collector got only these spans of trace {trace}: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn collect_metrics(
    State(received): State<Arc<Mutex<Received>>>,
    body: Bytes,
) -> &'static str {
    use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point};
    let request = ExportMetricsServiceRequest::decode(body).expect("an OTLP metrics export");
    let mut kept = received.lock().expect("the points");
    let labels = |attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
        attributes
            .iter()
            .map(|attribute| (attribute.key.clone(), text(attribute.value.as_ref())))
            .collect::<HashMap<_, _>>()
    };
    let number = |value: Option<number_data_point::Value>| match value {
        Some(number_data_point::Value::AsDouble(value)) => value,
        Some(number_data_point::Value::AsInt(value)) => value as f64,
        None => f64::NAN,
    };
    for resource in request.resource_metrics {
        for scope in resource.scope_metrics {
            for metric in scope.metrics {
                let point = |kind, attributes, value| Point {
                    name: metric.name.clone(),
                    description: metric.description.clone(),
                    kind,
                    attributes,
                    value,
                };
                match &metric.data {
                    Some(Data::Sum(sum)) => kept.points.extend(
                        sum.data_points
                            .iter()
                            .map(|data| point("sum", labels(&data.attributes), number(data.value))),
                    ),
                    Some(Data::Gauge(gauge)) => {
                        kept.points.extend(gauge.data_points.iter().map(|data| {
                            point("gauge", labels(&data.attributes), number(data.value))
                        }))
                    }
                    Some(Data::Histogram(histogram)) => {
                        kept.points.extend(histogram.data_points.iter().map(|data| {
                            point("histogram", labels(&data.attributes), data.count as f64)
                        }));
                    }
                    _ => {}
                }
            }
        }
    }
    ""
}

async fn collect(State(received): State<Arc<Mutex<Received>>>, body: Bytes) -> &'static str {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    let mut kept = received.lock().expect("the spans");
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|resource| &resource.attributes)
            .find(|attribute| attribute.key == "service.name")
            .map(|attribute| text(attribute.value.as_ref()))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                kept.spans.push(Exported {
                    trace: hex(&span.trace_id),
                    id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|attribute| (attribute.key.clone(), text(attribute.value.as_ref())))
                        .collect(),
                    service: service.clone(),
                });
            }
        }
    }
    ""
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|value| value.value.as_ref()) {
        Some(Value::StringValue(text)) => text.clone(),
        Some(Value::IntValue(number)) => number.to_string(),
        Some(Value::BoolValue(flag)) => flag.to_string(),
        Some(Value::DoubleValue(number)) => number.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The trace id and parent span id of a `traceparent` header.
fn trace_and_parent(traceparent: &str) -> (String, String) {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "a traceparent: {traceparent}");
    assert_eq!(fields[0], "00");
    (fields[1].to_owned(), fields[2].to_owned())
}

fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

/// websubd on SQLite in `dir`, exporting to `collector` as `OTEL_*` says,
/// retrying soon.
async fn traced_hub(dir: &std::path::PathBuf, env: &[(&str, &str)]) -> Websubd {
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let arguments = [
        "--database-url",
        &database,
        "--allow-private-network",
        "--internal-api-key",
        websub_tests::INTERNAL_KEY,
        "--delivery-max-backoff",
        "100ms",
    ];
    Websubd::spawn_with_env(dir, free_port(), &arguments, "warn", Stdio::inherit(), env)
        .ready()
        .await
}

#[tokio::test]
async fn one_publish_is_one_trace_from_the_publisher_to_every_attempt() {
    let dir = scratch_dir("traces-publish");
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let subscriber = TestSubscriber::start().await;
    subscriber.answer_deliveries_in_turn("flaky", [Answer::status(500), Answer::status(204)]);
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let hub = traced_hub(
        &dir,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SERVICE_NAME", "hub-under-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    common::save_subscriptions(
        &database,
        TOPIC,
        vec![subscriber.callback("steady"), subscriber.callback("flaky")],
    )
    .await;

    let (trace, publisher_span) = (random_hex(16), random_hex(8));
    let published = websub_tests::http_client()
        .post(format!(
            "{}?hub.mode=publish&hub.topic={}",
            hub.url,
            url::form_urlencoded::byte_serialize(TOPIC.as_bytes()).collect::<String>()
        ))
        .header("content-type", "application/json")
        .header("X-Internal-API-Key", websub_tests::INTERNAL_KEY)
        .header("traceparent", format!("00-{trace}-{publisher_span}-01"))
        .header("tracestate", "publisher=kept")
        .body(r#"{"traced":true}"#)
        .send()
        .await
        .expect("publish");
    assert_eq!(published.status(), 202);
    assert!(
        subscriber
            .wait_until(WAIT, |subscriber| subscriber.deliveries_to("steady").len()
                == 1
                && subscriber.deliveries_to("flaky").len() == 1
                && subscriber.attempts("flaky") == 2)
            .await,
        "one delivery to the steady callback, a failure and a retry to the flaky one: {:?}",
        subscriber
            .deliveries()
            .iter()
            .map(|delivery| (delivery.path.clone(), delivery.status))
            .collect::<Vec<_>>()
    );

    let spans = collector
        .wait_for(&trace, |spans| {
            spans.iter().filter(|span| span.name == "POST").count() == 3
                && spans.iter().any(|span| span.name.starts_with("publish "))
                && spans.iter().any(|span| span.name.starts_with("create "))
        })
        .await;
    assert!(spans.iter().all(|span| span.service == "hub-under-test"));
    let intake = spans
        .iter()
        .find(|span| span.name == format!("publish {TOPIC}"))
        .expect("the intake span");
    assert_eq!(
        intake.parent, publisher_span,
        "the publisher's span is the parent"
    );
    assert_eq!(intake.kind, SpanKind::Producer as i32);
    assert_eq!(intake.attribute("messaging.system"), Some("websub"));
    assert_eq!(intake.attribute("messaging.destination.name"), Some(TOPIC));
    let event_id = intake
        .attribute("messaging.message.id")
        .expect("the event's id")
        .to_owned();
    let expansion = spans
        .iter()
        .find(|span| span.name == format!("create {TOPIC}"))
        .expect("the expansion span");
    assert_eq!(expansion.parent, intake.id);
    assert_eq!(
        expansion.attribute("messaging.batch.message_count"),
        Some("2")
    );

    let attempts: Vec<&Exported> = spans.iter().filter(|span| span.name == "POST").collect();
    for attempt in &attempts {
        assert_eq!(attempt.parent, intake.id, "an attempt continues the intake");
        assert_eq!(attempt.kind, SpanKind::Client as i32);
        assert_eq!(attempt.attribute("http.request.method"), Some("POST"));
        assert_eq!(
            attempt.attribute("messaging.message.id"),
            Some(event_id.as_str())
        );
        assert_eq!(attempt.attribute("server.address"), Some("127.0.0.1"));
    }
    let to = |name: &str| -> Vec<&&Exported> {
        let callback = subscriber.callback(name);
        attempts
            .iter()
            .filter(|span| span.attribute("url.full") == Some(callback.as_str()))
            .collect()
    };
    let steady = to("steady");
    assert_eq!(steady.len(), 1);
    assert_eq!(
        steady[0].attribute("http.response.status_code"),
        Some("204")
    );
    assert_eq!(steady[0].attribute("http.request.resend_count"), None);
    let flaky = to("flaky");
    let failed = flaky
        .iter()
        .find(|span| span.attribute("http.response.status_code") == Some("500"))
        .expect("the failed attempt");
    assert_eq!(failed.attribute("error.type"), Some("500"));
    assert_eq!(failed.attribute("http.request.resend_count"), None);
    let retried = flaky
        .iter()
        .find(|span| span.attribute("http.response.status_code") == Some("204"))
        .expect("the retry");
    assert_eq!(retried.attribute("http.request.resend_count"), Some("1"));
    assert_eq!(retried.attribute("error.type"), None);

    // Each request carried its own attempt's context, and the publisher's
    // trace state.
    let mut carried: Vec<String> = subscriber
        .receiver()
        .received_where(|received| received.method == "POST")
        .iter()
        .map(|delivery| {
            let traceparent = delivery
                .headers
                .get("traceparent")
                .expect("a delivery carries traceparent")
                .to_str()
                .expect("text");
            assert_eq!(
                delivery
                    .headers
                    .get("tracestate")
                    .map(|value| value.as_bytes()),
                Some(&b"publisher=kept"[..])
            );
            let (carried_trace, parent) = trace_and_parent(traceparent);
            assert_eq!(carried_trace, trace);
            parent
        })
        .collect();
    let mut attempt_ids: Vec<String> = attempts.iter().map(|span| span.id.clone()).collect();
    carried.sort();
    attempt_ids.sort();
    assert_eq!(
        carried, attempt_ids,
        "each receiver got its attempt's span id"
    );
}

#[tokio::test]
async fn a_pings_trace_goes_on_through_the_fetch_it_asked_for() {
    let dir = scratch_dir("traces-ping");
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let publisher = TestPublisher::start().await;
    publisher.set_topic("news", "text/plain", "fetched content", None);
    let topic = publisher.topic_url("news");
    let subscriber = TestSubscriber::start().await;
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let hub = traced_hub(
        &dir,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    common::save_subscriptions(&database, &topic, vec![subscriber.callback("reader")]).await;

    let (trace, publisher_span) = (random_hex(16), random_hex(8));
    let pinged = websub_tests::http_client()
        .post(&hub.url)
        .header("X-Internal-API-Key", websub_tests::INTERNAL_KEY)
        .header("traceparent", format!("00-{trace}-{publisher_span}-01"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            serde_urlencoded::to_string([("hub.mode", "publish"), ("hub.url", topic.as_str())])
                .expect("a form"),
        )
        .send()
        .await
        .expect("ping");
    assert_eq!(pinged.status(), 202);
    let delivered = subscriber.wait_for_deliveries("reader", 1, WAIT).await;
    let traceparent = delivered[0]
        .headers
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .expect("the delivery carries traceparent");
    let (carried_trace, attempt_id) = trace_and_parent(traceparent);
    assert_eq!(
        carried_trace, trace,
        "the fetched content's delivery is in the ping's trace"
    );

    let spans = collector
        .wait_for(&trace, |spans| {
            ["publish ", "fetch ", "create ", "POST"]
                .iter()
                .all(|name| spans.iter().any(|span| span.name.starts_with(name)))
        })
        .await;
    let named = |name: String| {
        spans
            .iter()
            .find(|span| span.name == name)
            .unwrap_or_else(|| panic!("no span {name}: {spans:#?}"))
    };
    let ping = named(format!("publish {topic}"));
    assert_eq!(ping.parent, publisher_span);
    let fetch = named(format!("fetch {topic}"));
    assert_eq!(fetch.parent, ping.id, "the fetch continues the ping");
    assert_eq!(fetch.kind, SpanKind::Producer as i32);
    assert!(fetch.attribute("messaging.message.id").is_some());
    assert_eq!(named(format!("create {topic}")).parent, fetch.id);
    let attempt = named("POST".to_owned());
    assert_eq!(attempt.parent, fetch.id);
    assert_eq!(attempt.id, attempt_id);
}

#[tokio::test]
async fn an_outbox_events_trace_starts_at_its_intake() {
    let Some(shop) = crate::feeds::Shop::open().await else {
        eprintln!("skipped: no PostgreSQL (set WEBSUB_TEST_DATABASE_URL)");
        return;
    };
    let dir = scratch_dir("traces-outbox");
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let hook = RecordingReceiver::start().await;
    hook.answer(Route::any(), Answer::status(204));
    let webhooks = dir.join("webhooks.toml");
    crate::feeds::write_webhooks(&webhooks, "billing", hook.url("/billing").as_str());
    let config = shop.config_file(&dir, &webhooks);
    let config = config.display().to_string();
    let _hub = Websubd::spawn_with_env(
        &dir,
        free_port(),
        &["--config", &config],
        "warn",
        Stdio::inherit(),
        &[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                &format!("{endpoint}/v1/traces"),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .ready()
    .await;
    shop.produce(0..1).await;

    let deadline = Instant::now() + WAIT;
    let delivery = loop {
        if let Some(delivery) = hook.received().into_iter().next() {
            break delivery;
        }
        assert!(Instant::now() < deadline, "the webhook got nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let event_id: uuid::Uuid = delivery
        .headers
        .get(websub_hub::signature::MESSAGING_EVENT_ID_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .expect("the event's id");
    let traceparent = delivery
        .headers
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .expect("a webhook delivery carries traceparent");
    let (trace, attempt_id) = trace_and_parent(traceparent);
    assert_eq!(
        trace,
        event_id.simple().to_string(),
        "the trace is the event's id"
    );

    let spans = collector
        .wait_for(&trace, |spans| {
            spans.iter().any(|span| span.name == "POST")
                && spans.iter().any(|span| span.name.starts_with("publish "))
                && spans.iter().any(|span| span.name.starts_with("create "))
        })
        .await;
    assert!(
        spans.iter().all(|span| span.service == "websubd"),
        "named websubd by default: {spans:#?}"
    );
    let intake = spans
        .iter()
        .find(|span| span.name == format!("publish {}", crate::feeds::EVENT_NAME))
        .expect("the intake span");
    assert_eq!(intake.parent, "", "the intake starts the trace");
    assert_eq!(intake.kind, SpanKind::Producer as i32);
    assert_eq!(
        intake.attribute("messaging.message.id"),
        Some(event_id.to_string().as_str())
    );
    let expansion = spans
        .iter()
        .find(|span| span.name.starts_with("create "))
        .expect("the expansion span");
    assert_eq!(expansion.parent, intake.id);
    let attempt = spans
        .iter()
        .find(|span| span.name == "POST")
        .expect("the attempt span");
    assert_eq!(
        attempt.id, attempt_id,
        "the webhook got its attempt's context"
    );
    assert_eq!(
        attempt.parent, intake.id,
        "the attempt continues the intake"
    );
    assert_eq!(attempt.attribute("http.response.status_code"), Some("204"));
}

#[tokio::test]
async fn a_collector_that_never_answers_slows_no_delivery() {
    let dir = scratch_dir("traces-stalled");
    // Accepts connections and never answers.
    let stalled = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", stalled.local_addr().expect("address"));
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((connection, _)) = stalled.accept().await {
            open.push(connection);
        }
    });
    let subscriber = TestSubscriber::start().await;
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let hub = traced_hub(
        &dir,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "8"),
            ("OTEL_BSP_SCHEDULE_DELAY", "10"),
        ],
    )
    .await;
    let callbacks: Vec<String> = (0..4)
        .map(|n| subscriber.callback(&format!("cb{n}")))
        .collect();
    common::save_subscriptions(&database, TOPIC, callbacks).await;

    let started = Instant::now();
    for n in 0..25 {
        assert_eq!(hub.fat_ping(TOPIC, &format!("{{\"n\":{n}}}")).await, 202);
    }
    assert!(
        subscriber
            .wait_until(Duration::from_secs(20), |subscriber| subscriber
                .deliveries()
                .len()
                >= 100)
            .await,
        "every delivery arrived while the collector hung"
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "deliveries took {took:?} with the collector hanging"
    );
    let families = prometheus::scrape(&hub).await;
    let dropped = prometheus::value(
        &families,
        "websub_trace_spans_dropped_total",
        "websub_trace_spans_dropped_total",
        &[],
    );
    // 25 intakes, 25 expansions and 100 attempts; at most 8 queued and
    // one batch in the exporter's hands.
    assert!(dropped >= 150.0 - 16.0, "only {dropped} spans were dropped");
    held.abort();
}

#[tokio::test]
async fn the_metrics_go_to_the_collector_too() {
    let dir = scratch_dir("otlp-metrics");
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let subscriber = TestSubscriber::start().await;
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let hub = traced_hub(
        &dir,
        &[
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                &format!("{endpoint}/v1/metrics"),
            ),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    )
    .await;
    common::save_subscriptions(&database, TOPIC, vec![subscriber.callback("counted")]).await;
    assert_eq!(hub.fat_ping(TOPIC, r#"{"counted":true}"#).await, 202);
    subscriber.wait_for_deliveries("counted", 1, WAIT).await;

    let delivered = collector
        .wait_for_point(
            "websub_deliveries_total",
            &[("channel", "websub"), ("outcome", "delivered")],
            |count| count >= 1.0,
        )
        .await;
    assert_eq!(delivered.kind, "sum");
    assert!(
        delivered
            .description
            .starts_with("Delivery attempts by channel"),
        "the help text of /metrics: {}",
        delivered.description
    );
    let attempts = collector
        .wait_for_point(
            "websub_delivery_attempt_seconds",
            &[("channel", "websub")],
            |count| count >= 1.0,
        )
        .await;
    assert_eq!(attempts.kind, "histogram");
    // Nothing in flight once delivered: the gauge went up and down.
    let in_flight = collector
        .wait_for_point(
            "websub_deliveries_in_flight",
            &[("channel", "websub")],
            |now| now.abs() < f64::EPSILON,
        )
        .await;
    assert_eq!(in_flight.kind, "gauge");
    // Only metrics were asked for: no span was made.
    assert!(
        collector
            .received
            .lock()
            .expect("the spans")
            .spans
            .is_empty()
    );
    // /metrics is as it was.
    let families = prometheus::scrape(&hub).await;
    assert!(
        prometheus::value(
            &families,
            "websub_deliveries_total",
            "websub_deliveries_total",
            &["outcome=\"delivered\""],
        ) >= 1.0
    );
}
