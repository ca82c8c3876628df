//! The metrics the hub keeps, exported over OTLP too when the standard
//! `OTEL_*` variables name a collector: the one `metrics` recorder of the
//! process hands every update to the Prometheus recorder (`/metrics`, as
//! always) and to an OpenTelemetry meter, whose periodic reader exports
//! from a thread of its own (`OTEL_METRIC_EXPORT_INTERVAL`, a minute by
//! default). Without a collector the Prometheus recorder is installed
//! alone and nothing else is done per update.
//!
//! Counters become OTLP sums, histograms keep the buckets `/metrics` has,
//! and gauges (which the hub moves up and down as well as sets) are kept
//! here per series and reported at their value.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

use super::otlp::{self, Exporting, OtlpError};
use crate::delivery::client::Trust;

/// Installs the process's `metrics` recorder: the hub's Prometheus one
/// ([`super::prometheus`]), and beside it the OTLP export when the
/// environment (`var`) names a collector
/// (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`,
/// unless `OTEL_SDK_DISABLED=true` or `OTEL_METRICS_EXPORTER=none`).
/// Returns the handle `/metrics` renders with.
///
/// Call it off the async runtime (`spawn_blocking`), as the exporter's
/// client is a blocking one.
pub fn install(
    var: &dyn Fn(&str) -> Option<String>,
    trust: &Trust,
) -> Result<(PrometheusHandle, Option<Exporting>), OtlpError> {
    let prometheus = super::prometheus().build_recorder();
    let handle = prometheus.handle();
    let Some(collector) = otlp::collector(var, "METRICS", trust)? else {
        metrics::set_global_recorder(prometheus).map_err(|_| OtlpError::Started)?;
        return Ok((handle, None));
    };
    let exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_http_client(collector.client)
        .with_timeout(collector.timeout)
        .build()
        .map_err(|error| OtlpError::Exporter(error.to_string()))?;
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter).build())
        .with_resource(otlp::resource(var))
        .build();
    let both = Both {
        prometheus,
        meter: provider.meter("websub-hub"),
        counters: Mutex::default(),
        gauges: Mutex::default(),
        histograms: Mutex::default(),
    };
    metrics::set_global_recorder(both).map_err(|_| OtlpError::Started)?;
    Ok((
        handle,
        Some(Exporting::new("metrics", move || provider.shutdown())),
    ))
}

/// The recorder that updates both.
#[derive(Debug)]
struct Both {
    prometheus: PrometheusRecorder,
    meter: Meter,
    /// The handles made so far, one per series: the hub names a metric at
    /// each update (`metrics::counter!`), and making its OTLP instrument
    /// every time would cost the delivery path. A gauge's handle also
    /// keeps its value, which the hub moves up and down while an OTLP
    /// gauge is only ever set.
    counters: Mutex<HashMap<Key, Counter>>,
    gauges: Mutex<HashMap<Key, Gauge>>,
    histograms: Mutex<HashMap<Key, Histogram>>,
}

/// The handle of `key` among `handles`, made by `make` the first time.
fn kept<H: Clone>(handles: &Mutex<HashMap<Key, H>>, key: &Key, make: impl FnOnce() -> H) -> H {
    let mut handles = handles
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(handle) = handles.get(key) {
        return handle.clone();
    }
    let handle = make();
    handles.insert(key.clone(), handle.clone());
    handle
}

/// A series' labels as OTLP attributes.
fn attributes(key: &Key) -> Vec<KeyValue> {
    key.labels()
        .map(|label| KeyValue::new(label.key().to_owned(), label.value().to_owned()))
        .collect()
}

fn described(name: &str) -> String {
    super::help(name).unwrap_or_default().to_owned()
}

impl Recorder for Both {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        kept(&self.counters, key, || {
            let name = key.name().to_owned();
            let otlp = self
                .meter
                .u64_counter(name.clone())
                .with_description(described(&name))
                .build();
            Counter::from_arc(Arc::new(BothCounter {
                prometheus: self.prometheus.register_counter(key, metadata),
                otlp,
                attributes: attributes(key),
            }))
        })
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        kept(&self.gauges, key, || {
            let name = key.name().to_owned();
            let otlp = self
                .meter
                .f64_gauge(name.clone())
                .with_description(described(&name))
                .build();
            Gauge::from_arc(Arc::new(BothGauge {
                prometheus: self.prometheus.register_gauge(key, metadata),
                otlp,
                value: GaugeValue::default(),
                attributes: attributes(key),
            }))
        })
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        kept(&self.histograms, key, || {
            let name = key.name().to_owned();
            let mut otlp = self
                .meter
                .f64_histogram(name.clone())
                .with_description(described(&name))
                .with_boundaries(super::buckets(&name).to_vec());
            if name.ends_with("_seconds") {
                otlp = otlp.with_unit("s");
            }
            Histogram::from_arc(Arc::new(BothHistogram {
                prometheus: self.prometheus.register_histogram(key, metadata),
                otlp: otlp.build(),
                attributes: attributes(key),
            }))
        })
    }
}

struct BothCounter {
    prometheus: Counter,
    otlp: opentelemetry::metrics::Counter<u64>,
    attributes: Vec<KeyValue>,
}

impl CounterFn for BothCounter {
    fn increment(&self, value: u64) {
        self.prometheus.increment(value);
        self.otlp.add(value, &self.attributes);
    }

    fn absolute(&self, value: u64) {
        // An OTLP sum only adds; the hub's counters are only incremented.
        self.prometheus.absolute(value);
    }
}

/// A gauge series' value, as `f64` bits.
#[derive(Debug, Default)]
struct GaugeValue(AtomicU64);

impl GaugeValue {
    /// Applies `change` to the value and returns the new one.
    fn update(&self, change: impl Fn(f64) -> f64) -> f64 {
        let mut now = self.0.load(Ordering::Acquire);
        loop {
            let next = change(f64::from_bits(now));
            match self.0.compare_exchange_weak(
                now,
                next.to_bits(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return next,
                Err(seen) => now = seen,
            }
        }
    }
}

struct BothGauge {
    prometheus: Gauge,
    otlp: opentelemetry::metrics::Gauge<f64>,
    value: GaugeValue,
    attributes: Vec<KeyValue>,
}

impl GaugeFn for BothGauge {
    fn increment(&self, value: f64) {
        self.prometheus.increment(value);
        let now = self.value.update(|was| was + value);
        self.otlp.record(now, &self.attributes);
    }

    fn decrement(&self, value: f64) {
        self.prometheus.decrement(value);
        let now = self.value.update(|was| was - value);
        self.otlp.record(now, &self.attributes);
    }

    fn set(&self, value: f64) {
        self.prometheus.set(value);
        self.value.update(|_| value);
        self.otlp.record(value, &self.attributes);
    }
}

struct BothHistogram {
    prometheus: Histogram,
    otlp: opentelemetry::metrics::Histogram<f64>,
    attributes: Vec<KeyValue>,
}

impl HistogramFn for BothHistogram {
    fn record(&self, value: f64) {
        self.prometheus.record(value);
        self.otlp.record(value, &self.attributes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_value_moves_both_ways_and_is_set() {
        let value = GaugeValue::default();
        assert!((value.update(|was| was + 2.5) - 2.5).abs() < f64::EPSILON);
        assert!((value.update(|was| was - 1.0) - 1.5).abs() < f64::EPSILON);
        assert!((value.update(|_| 7.0) - 7.0).abs() < f64::EPSILON);
    }
}
