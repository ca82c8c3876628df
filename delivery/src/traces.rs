//! Traces: the spans of an event's way through the hub, exported over OTLP
//! (http/protobuf) when the standard `OTEL_EXPORTER_OTLP_*` variables name
//! a collector, and nothing at all otherwise.
//!
//! A publish (or a topic fetch) is a producer span, the child of the
//! publisher's `traceparent`; its context is kept with the event in the log
//! (`trace_context`), so that the expansion and every attempt, made later
//! and perhaps by another process, are its children. Each attempt is an
//! HTTP client span whose context goes out as the delivery's `traceparent`
//! and `tracestate`: a receiver continues the same trace. An outbox event's
//! trace starts at its intake in a span whose ids are derived from the
//! event's id, since the producer's tables (the seed's) have no room for a
//! context: every attempt, retries after a restart included, finds its
//! parent again without storing anything.
//!
//! Spans are ended on the caller's thread into a bounded queue that a
//! thread of the SDK's exports from; a slow or unreachable collector fills
//! the queue, and what does not fit is dropped and counted in
//! [`SPANS_DROPPED_TOTAL`], never waited for. With tracing off every
//! function here returns at the first check of a `OnceLock`.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, IdGenerator, RandomIdGenerator, SdkTracer,
    SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use crate::client::Trust;
use crate::otlp::{self, Exporting, OtlpError};

/// Spans that did not fit in the export queue (the collector slow or
/// unreachable), and were dropped rather than waited for.
pub const SPANS_DROPPED_TOTAL: &str = "websub_trace_spans_dropped_total";

/// The most finished spans waiting for the exporter, unless
/// `OTEL_BSP_MAX_QUEUE_SIZE` says (within [`QUEUE_LIMITS`]).
const QUEUED_AT_MOST: usize = 2048;

/// The queue sizes `OTEL_BSP_MAX_QUEUE_SIZE` may choose.
const QUEUE_LIMITS: std::ops::RangeInclusive<usize> = 1..=65_536;

/// The `messaging.system` of WebSub events and of outbox events.
const WEBSUB: &str = "websub";
const OUTBOX: &str = "websub_outbox";

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// Whether spans are being made and exported.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// Starts tracing if the environment (`var`) names a collector:
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`,
/// unless `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. The
/// exporter reads the rest of the standard variables (headers, timeout,
/// `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, the sampler); the
/// service is named `websubd` unless they say otherwise. HTTPS collectors
/// are trusted through `trust`, as the hub's other clients are.
///
/// Call it off the async runtime (`spawn_blocking`): the exporter's client
/// is a blocking one, with a runtime of its own.
pub fn start_from_env(
    var: &dyn Fn(&str) -> Option<String>,
    trust: &Trust,
) -> Result<Option<Exporting>, OtlpError> {
    let Some(collector) = otlp::collector(var, "TRACES", trust)? else {
        return Ok(None);
    };
    let capacity = match otlp::set(var, "OTEL_BSP_MAX_QUEUE_SIZE") {
        None => QUEUED_AT_MOST,
        Some(value) => value
            .parse()
            .ok()
            .filter(|size| QUEUE_LIMITS.contains(size))
            .ok_or(OtlpError::Invalid {
                name: "OTEL_BSP_MAX_QUEUE_SIZE",
                value,
                expected: "a number of spans from 1 to 65536",
            })?,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(collector.client)
        .with_timeout(collector.timeout)
        .build()
        .map_err(|error| OtlpError::Exporter(error.to_string()))?;
    let queued = Arc::new(AtomicUsize::new(0));
    let batches = BatchSpanProcessor::builder(Counted {
        exporter,
        queued: queued.clone(),
    })
    .with_batch_config(
        BatchConfigBuilder::default()
            .with_max_queue_size(capacity)
            .build(),
    )
    .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Bounded {
            batches,
            queued,
            capacity,
        })
        .with_id_generator(ChosenIds::default())
        .with_resource(otlp::resource(var))
        .build();
    TRACER
        .set(provider.tracer("websub-hub"))
        .map_err(|_| OtlpError::Started)?;
    Ok(Some(Exporting::new("trace", move || provider.shutdown())))
}

/// Keeps the batch processor's queue from overflowing, so that what does
/// not fit is counted here: a span is let through only while fewer than
/// `capacity` wait for (or are in) an export.
#[derive(Debug)]
struct Bounded {
    batches: BatchSpanProcessor,
    queued: Arc<AtomicUsize>,
    capacity: usize,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.batches.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        // The batch processor exports sampled spans only.
        if span.span_context.is_sampled()
            && self.queued.fetch_add(1, Ordering::AcqRel) >= self.capacity
        {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!(SPANS_DROPPED_TOTAL).increment(1);
            return;
        }
        self.batches.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.batches.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.batches.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.batches.set_resource(resource);
    }
}

/// The exporter, counting the spans it is done with off [`Bounded`]'s
/// queue, whether they reached the collector or not.
#[derive(Debug)]
struct Counted<E> {
    exporter: E,
    queued: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.exporter.export(batch).await;
        self.queued.fetch_sub(spans, Ordering::AcqRel);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.exporter.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.exporter.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.exporter.set_resource(resource);
    }
}

thread_local! {
    /// The ids the next span started on this thread takes (see
    /// [`start_with_ids`]).
    static CHOSEN: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// Random ids, except for a span started through [`start_with_ids`].
#[derive(Debug, Default)]
struct ChosenIds(RandomIdGenerator);

impl IdGenerator for ChosenIds {
    fn new_trace_id(&self) -> TraceId {
        CHOSEN
            .get()
            .map_or_else(|| self.0.new_trace_id(), |(trace, _)| trace)
    }

    fn new_span_id(&self) -> SpanId {
        CHOSEN
            .get()
            .map_or_else(|| self.0.new_span_id(), |(_, span)| span)
    }
}

/// Starts the root span `builder` with the ids `ids` (the SDK takes ids only
/// from its generator; starting a span is synchronous, so the choice made
/// for this thread is the one the generator reads).
fn start_with_ids(
    tracer: &SdkTracer,
    builder: opentelemetry::trace::SpanBuilder,
    ids: (TraceId, SpanId),
) -> Span {
    CHOSEN.set(Some(ids));
    let span = tracer.build_with_context(builder, &Context::new());
    CHOSEN.set(None);
    span
}

/// The context of an outbox event's intake span: the trace is the event's
/// id, the span id a digest of it.
fn outbox_intake_ids(event_id: Uuid) -> (TraceId, SpanId) {
    let digest = Sha256::new()
        .chain_update(b"websub-outbox-intake")
        .chain_update(event_id.as_bytes())
        .finalize();
    let mut span = [0u8; 8];
    span.copy_from_slice(&digest[..8]);
    (
        TraceId::from_bytes(*event_id.as_bytes()),
        SpanId::from_bytes(span),
    )
}

/// The parent every span of the outbox event `event_id` has, when tracing
/// is on.
pub fn outbox_parent(event_id: Uuid) -> Option<SpanContext> {
    tracer()?;
    let (trace, span) = outbox_intake_ids(event_id);
    Some(SpanContext::new(
        trace,
        span,
        TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    ))
}

/// The kept form of the outbox event `event_id`'s context, for an event of
/// the hub's log made from it (a feed's).
pub fn outbox_kept(event_id: Uuid) -> Option<String> {
    outbox_parent(event_id).map(|parent| keep(&parent))
}

/// The outbox events just taken in, one `(id, name, recorded at)` per
/// delivery claimed at once: each event's intake (see `outbox_intake`),
/// with the number of its deliveries.
pub fn outbox_intakes<'a>(
    deliveries: impl Iterator<Item = (Uuid, &'a str, chrono::DateTime<chrono::Utc>)>,
) {
    if !enabled() {
        return;
    }
    let mut events: HashMap<Uuid, (&str, chrono::DateTime<chrono::Utc>, usize)> = HashMap::new();
    for (id, name, recorded_at) in deliveries {
        events.entry(id).or_insert((name, recorded_at, 0)).2 += 1;
    }
    for (id, (name, recorded_at, deliveries)) in events {
        outbox_intake(id, name, recorded_at.into(), deliveries);
    }
}

/// An outbox event taken in: its intake span (from its recording in the
/// producer's transaction to now, with the ids its attempts find again) and
/// the expansion into `deliveries` deliveries, as its child.
fn outbox_intake(event_id: Uuid, event_name: &str, recorded_at: SystemTime, deliveries: usize) {
    let Some(tracer) = tracer() else {
        return;
    };
    let builder = tracer
        .span_builder(format!("publish {event_name}"))
        .with_kind(SpanKind::Producer)
        .with_start_time(recorded_at)
        .with_attributes([
            KeyValue::new("messaging.system", OUTBOX),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", "publish"),
            KeyValue::new("messaging.destination.name", event_name.to_owned()),
            KeyValue::new("messaging.message.id", event_id.to_string()),
        ]);
    let mut intake = start_with_ids(tracer, builder, outbox_intake_ids(event_id));
    let now = SystemTime::now();
    expansion(
        tracer,
        intake.span_context(),
        OUTBOX,
        event_name,
        deliveries,
        now,
    );
    intake.end();
}

/// The span of an expansion of one event into `deliveries` deliveries,
/// from `started` to now.
fn expansion(
    tracer: &SdkTracer,
    parent: &SpanContext,
    system: &'static str,
    destination: &str,
    deliveries: usize,
    started: SystemTime,
) {
    let cx = Context::new().with_remote_span_context(parent.clone());
    tracer
        .span_builder(format!("create {destination}"))
        .with_kind(SpanKind::Internal)
        .with_start_time(started)
        .with_attributes([
            KeyValue::new("messaging.system", system),
            KeyValue::new("messaging.operation.type", "create"),
            KeyValue::new("messaging.operation.name", "expand"),
            KeyValue::new("messaging.destination.name", destination.to_owned()),
            KeyValue::new(
                "messaging.batch.message_count",
                i64::try_from(deliveries).unwrap_or(i64::MAX),
            ),
        ])
        .start_with_context(tracer, &cx)
        .end();
}

/// A WebSub event's expansion into `deliveries` deliveries, from
/// `started` to now, as a child of its intake's span (`parent`, read once
/// from the context kept with the event).
pub fn websub_expansion(
    parent: Option<&SpanContext>,
    topic: &str,
    deliveries: u64,
    started: SystemTime,
) {
    if let (Some(tracer), Some(parent)) = (tracer(), parent) {
        let deliveries = usize::try_from(deliveries).unwrap_or(usize::MAX);
        expansion(tracer, parent, WEBSUB, topic, deliveries, started);
    }
}

/// The intake of WebSub content, while it is being recorded: a producer
/// span, the child of the publisher's `traceparent` when the request had
/// one (or of the ping's, for content fetched after it). Its
/// [`kept`](Intake::kept) context goes into the log with the event.
#[derive(Debug)]
pub struct Intake {
    span: Span,
}

impl Intake {
    /// The intake of a request for `topic` (`operation`: `publish`),
    /// under its `headers`' context; `None` with tracing off.
    pub fn start(headers: &HeaderMap, operation: &'static str, topic: &str) -> Option<Self> {
        let tracer = tracer()?;
        let cx = TraceContextPropagator::new().extract(&HeaderText(headers));
        Some(Self::under(tracer, &cx, operation, topic))
    }

    /// The intake of content for `topic` (`operation`: `fetch`) that a
    /// request kept as `kept` asked for; `None` with tracing off.
    pub fn continuing(kept: Option<&str>, operation: &'static str, topic: &str) -> Option<Self> {
        let tracer = tracer()?;
        let cx = kept
            .and_then(kept_parent)
            .map_or_else(Context::new, |parent| {
                Context::new().with_remote_span_context(parent)
            });
        Some(Self::under(tracer, &cx, operation, topic))
    }

    fn under(tracer: &SdkTracer, cx: &Context, operation: &'static str, topic: &str) -> Self {
        let span = tracer
            .span_builder(format!("{operation} {topic}"))
            .with_kind(SpanKind::Producer)
            .with_attributes([
                KeyValue::new("messaging.system", WEBSUB),
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.operation.name", operation),
                KeyValue::new("messaging.destination.name", topic.to_owned()),
            ])
            .start_with_context(tracer, cx);
        Self { span }
    }

    /// The context kept with what it brought in.
    pub fn kept(&self) -> String {
        keep(self.span.span_context())
    }

    /// Ends the span: the event `id` of `bytes` is recorded.
    pub fn recorded(mut self, id: Uuid, bytes: usize) {
        self.span
            .set_attribute(KeyValue::new("messaging.message.id", id.to_string()));
        self.span.set_attribute(KeyValue::new(
            "messaging.message.body.size",
            i64::try_from(bytes).unwrap_or(i64::MAX),
        ));
        self.span.end();
    }

    /// Ends the span: what it brought in is kept (a ping's fetch).
    pub fn accepted(mut self) {
        self.span.end();
    }

    /// Ends the span: nothing was kept, because of `error`.
    pub fn failed(mut self, error: &dyn std::fmt::Display) {
        self.span
            .set_attribute(KeyValue::new("error.type", "not_recorded"));
        self.span.set_status(Status::error(error.to_string()));
        self.span.end();
    }
}

/// One delivery attempt: an HTTP client span whose context the request
/// carries.
#[derive(Debug)]
pub struct AttemptSpan {
    span: Span,
}

impl AttemptSpan {
    /// The attempt of a POST to `url` (the `resend_count`th retry) of the
    /// event `event_id`, the child of `parent` (a new trace without one);
    /// `None` with tracing off.
    pub fn start(
        parent: Option<&SpanContext>,
        url: &str,
        resend_count: u32,
        event_id: &HeaderValue,
    ) -> Option<Self> {
        let tracer = tracer()?;
        let cx = parent.map_or_else(Context::new, |parent| {
            Context::new().with_remote_span_context(parent.clone())
        });
        let mut attributes = vec![
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("url.full", url.to_owned()),
            KeyValue::new(
                "messaging.message.id",
                String::from_utf8_lossy(event_id.as_bytes()).into_owned(),
            ),
        ];
        if let Ok(parsed) = url::Url::parse(url) {
            if let Some(host) = parsed.host_str() {
                attributes.push(KeyValue::new("server.address", host.to_owned()));
            }
            if let Some(port) = parsed.port_or_known_default() {
                attributes.push(KeyValue::new("server.port", i64::from(port)));
            }
        }
        if resend_count > 0 {
            attributes.push(KeyValue::new(
                "http.request.resend_count",
                i64::from(resend_count),
            ));
        }
        let span = tracer
            .span_builder("POST")
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(tracer, &cx);
        Some(Self { span })
    }

    /// Adds this attempt's `traceparent` (and `tracestate`) to `headers`.
    pub fn inject(&self, headers: &mut HeaderMap) {
        let cx = Context::new().with_remote_span_context(self.span.span_context().clone());
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderSlots(headers));
    }

    /// Ends the span with the answer's status, or the error that took its
    /// place (`error_type`: the status, `timeout`, or `_OTHER`).
    pub fn end(mut self, status: Option<u16>, error: Option<&str>) {
        if let Some(status) = status {
            self.span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if let Some(error) = error {
            let kind = match status {
                Some(status) => status.to_string(),
                None if error.contains("timed out") => "timeout".to_owned(),
                None => "_OTHER".to_owned(),
            };
            self.span.set_attribute(KeyValue::new("error.type", kind));
            self.span.set_status(Status::error(error.to_owned()));
        }
        self.span.end();
    }
}

/// The text a span context is kept as beside an event: its `traceparent`,
/// then a line with its `tracestate` when it has one.
fn keep(context: &SpanContext) -> String {
    let cx = Context::new().with_remote_span_context(context.clone());
    let mut fields = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut fields);
    let parent = fields.remove("traceparent").unwrap_or_default();
    match fields
        .remove("tracestate")
        .filter(|state| !state.is_empty())
    {
        Some(state) => format!("{parent}\n{state}"),
        None => parent,
    }
}

/// A context kept by `keep`, read back; `None` with tracing off or when
/// the text is not one.
pub fn kept_parent(kept: &str) -> Option<SpanContext> {
    tracer()?;
    let (parent, state) = kept.split_once('\n').unwrap_or((kept, ""));
    let fields = HashMap::from([
        ("traceparent".to_owned(), parent.to_owned()),
        ("tracestate".to_owned(), state.to_owned()),
    ]);
    let cx = TraceContextPropagator::new().extract(&fields);
    let context = cx.span().span_context().clone();
    context.is_valid().then_some(context)
}

/// A request's headers, read by the propagator.
struct HeaderText<'a>(&'a HeaderMap);

impl Extractor for HeaderText<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// A request's headers, written by the propagator.
struct HeaderSlots<'a>(&'a mut HeaderMap);

impl Injector for HeaderSlots<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::try_from(value),
        ) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outbox_events_intake_ids_are_its_own_and_stable() {
        let event = Uuid::now_v7();
        let (trace, span) = outbox_intake_ids(event);
        assert_eq!(trace.to_bytes(), *event.as_bytes());
        assert_eq!(outbox_intake_ids(event), (trace, span));
        assert_ne!(outbox_intake_ids(Uuid::now_v7()).1, span);
        assert_ne!(span, SpanId::INVALID);
    }

    #[test]
    fn a_kept_context_carries_its_trace_state() {
        let context = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("a trace id"),
            SpanId::from_hex("00f067aa0ba902b7").expect("a span id"),
            TraceFlags::SAMPLED,
            true,
            TraceState::from_key_value([("vendor", "value")]).expect("a trace state"),
        );
        let kept = keep(&context);
        assert_eq!(
            kept,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nvendor=value"
        );
    }
}
