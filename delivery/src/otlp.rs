//! What the two OTLP exports (`traces`, `meters`) share: whether the
//! standard `OTEL_*` variables name a collector for a signal, the protocol
//! and timeout they ask for, and the client that sends, a blocking one
//! (the SDK exports from threads of its own, never from the runtime that
//! deliveries share) on the hub's rustls.

use std::time::Duration;

use crate::client::Trust;

/// How long one export may take, unless `OTEL_EXPORTER_OTLP_TIMEOUT` (or
/// the signal's own) says.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// An export's provider (traces' or metrics'), kept by whoever started
/// it: shutting it down exports what is left and stops.
pub struct Exporting {
    signal: &'static str,
    shutdown: Box<dyn FnOnce() -> opentelemetry_sdk::error::OTelSdkResult + Send>,
}

impl Exporting {
    /// The export of `signal` ("trace", "metrics"), stopped by `shutdown`.
    pub fn new(
        signal: &'static str,
        shutdown: impl FnOnce() -> opentelemetry_sdk::error::OTelSdkResult + Send + 'static,
    ) -> Self {
        Self {
            signal,
            shutdown: Box::new(shutdown),
        }
    }

    /// Exports what is left (within the export timeout) and stops.
    pub fn shutdown(self) {
        if let Err(error) = (self.shutdown)() {
            tracing::warn!(%error, signal = self.signal, "an OTLP exporter did not shut down cleanly");
        }
    }
}

impl std::fmt::Debug for Exporting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporting")
            .field("signal", &self.signal)
            .finish_non_exhaustive()
    }
}

/// Why an export could not start.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// A protocol other than http/protobuf was asked for.
    #[error("{name}={value}: websubd exports OTLP over http/protobuf only")]
    Protocol {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
    },
    /// A variable that is not a number the hub takes.
    #[error("{name}={value}: {expected}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// The exporter or its client could not be built.
    #[error("cannot export over OTLP: {0}")]
    Exporter(String),
    /// The export was started already in this process.
    #[error("the OTLP export was started already")]
    Started,
}

/// A collector named for one signal: the client to send with, and its
/// timeout.
#[derive(Debug)]
pub struct Collector {
    pub client: reqwest::blocking::Client,
    pub timeout: Duration,
}

/// The variables `var` gives, blank ones as unset.
pub fn set(var: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    var(name).filter(|value| !value.trim().is_empty())
}

/// The collector of `signal` (`TRACES`, `METRICS`): named by
/// `OTEL_EXPORTER_OTLP_{signal}_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`,
/// unless `OTEL_SDK_DISABLED=true` or `OTEL_{signal}_EXPORTER=none`; `None`
/// when there is none.
pub fn collector(
    var: &dyn Fn(&str) -> Option<String>,
    signal: &str,
    trust: &Trust,
) -> Result<Option<Collector>, OtlpError> {
    let disabled = set(var, "OTEL_SDK_DISABLED")
        .is_some_and(|value| value.eq_ignore_ascii_case("true"))
        || set(var, &format!("OTEL_{signal}_EXPORTER"))
            .is_some_and(|value| value.eq_ignore_ascii_case("none"));
    let endpoint = set(var, &format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"))
        .or_else(|| set(var, "OTEL_EXPORTER_OTLP_ENDPOINT"));
    if disabled || endpoint.is_none() {
        return Ok(None);
    }
    for name in [
        format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"),
        "OTEL_EXPORTER_OTLP_PROTOCOL".to_owned(),
    ] {
        if let Some(value) = set(var, &name)
            && value != "http/protobuf"
        {
            return Err(OtlpError::Protocol { name, value });
        }
    }
    let timeout = set(var, &format!("OTEL_EXPORTER_OTLP_{signal}_TIMEOUT"))
        .or_else(|| set(var, "OTEL_EXPORTER_OTLP_TIMEOUT"))
        .and_then(|millis| millis.parse().ok())
        .map_or(EXPORT_TIMEOUT, Duration::from_millis);
    let client = crate::client::collector_client(timeout, trust)
        .map_err(|error| OtlpError::Exporter(error.to_string()))?;
    Ok(Some(Collector { client, timeout }))
}

/// The resource every signal is exported under: the standard detectors
/// (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the service named
/// `websubd` unless they say otherwise.
pub fn resource(var: &dyn Fn(&str) -> Option<String>) -> opentelemetry_sdk::Resource {
    let resource = opentelemetry_sdk::Resource::builder();
    if set(var, "OTEL_SERVICE_NAME").is_none() {
        resource.with_service_name("websubd").build()
    } else {
        resource.build()
    }
}
