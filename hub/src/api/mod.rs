//! The HTTP adapter: routes, request parsing and error mapping. Handlers
//! parse, call the domain (subscriptions, intake, the event log), and map
//! its errors to 4xx/5xx answers with a reason; they hold no logic of their
//! own.
//!
//! - `/`: the WebSub hub endpoint (subscribe, unsubscribe, publish);
//! - `/topics/…`: topics the hub itself publishes (outbox feeds), answering
//!   discovery;
//! - `/api/v1/operator/…`: the operator API ([`operator`]);
//! - `/healthz`, `/metrics`.

mod operator;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use tracing::{debug, error};

use crate::clock::Clock;
use crate::dispatch::{Dispatcher, link_header};
use crate::events::EventLog;
use crate::intake::{DEFAULT_CONTENT_TYPE, Intake, IntakeError};
use crate::protocol::{self, HubRequest};
use crate::verify::Subscriptions;
use websub_store::SubscriptionStore;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The subscription workflow.
    pub subscriptions: Subscriptions,
    /// Content intake.
    pub intake: Intake,
    /// The subscription store, read by the APIs.
    pub store: Arc<dyn SubscriptionStore>,
    /// The event log, read by the APIs.
    pub events: Arc<dyn EventLog>,
    /// The dispatcher, woken when the APIs make records due.
    pub dispatcher: Dispatcher,
    /// The hub's clock.
    pub clock: Arc<dyn Clock>,
    /// The hub URL announced in `rel="hub"`.
    pub public_url: Arc<str>,
    /// The internal API key, when configured.
    pub internal_api_key: Option<Arc<str>>,
    /// The header the internal key travels in.
    pub internal_api_key_header: Arc<str>,
    /// The largest form accepted.
    pub max_form_bytes: usize,
    /// The largest content accepted.
    pub max_content_bytes: usize,
    /// Renders `/metrics`, when the binary installed a recorder.
    pub metrics: Option<PrometheusHandle>,
}

/// The hub's routes (see the module docs).
pub fn router(state: ApiState) -> Router {
    let body_limit = state.max_content_bytes.max(state.max_form_bytes);
    Router::new()
        .route("/", post(hub_endpoint).get(about))
        .route("/topics/{*name}", get(topic))
        .nest("/api/v1/operator", operator::routes())
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// An answer that is not a success: a status and a plain-text reason.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    reason: String,
}

impl ApiError {
    /// An error answer.
    pub fn new(status: StatusCode, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            error!(status = self.status.as_u16(), reason = %self.reason, "request failed");
        } else {
            debug!(status = self.status.as_u16(), reason = %self.reason, "request refused");
        }
        let mut reason = self.reason;
        reason.push('\n');
        (
            self.status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            reason,
        )
            .into_response()
    }
}

async fn about() -> &'static str {
    "This is a WebSub hub. POST hub.mode=subscribe|unsubscribe|publish here.\n"
}

/// A topic the hub publishes itself (an outbox feed's): the discovery
/// headers, with the latest content when there is any.
async fn topic(State(state): State<ApiState>, uri: axum::http::Uri) -> Result<Response, ApiError> {
    let path = uri.path().trim_start_matches('/');
    let topic = format!("{}{path}", state.public_url);
    let link = link_header(&state.public_url, &topic);
    let latest = state.events.latest(&topic).await.map_err(|error| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the event log failed: {error}"),
        )
    })?;
    Ok(match latest {
        Some(event) => (
            [
                (header::LINK, link),
                (header::CONTENT_TYPE, event.content_type),
            ],
            event.body,
        )
            .into_response(),
        None => (StatusCode::NO_CONTENT, [(header::LINK, link)]).into_response(),
    })
}

async fn metrics(State(state): State<ApiState>) -> Response {
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => ApiError::new(StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

async fn hub_endpoint(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if let Some(topic) = fat_ping_topic(query.as_deref())? {
        return fat_ping(&state, topic, &headers, body).await;
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "expected a form (application/x-www-form-urlencoded), got {:?}",
                content_type
            ),
        ));
    }
    if body.len() > state.max_form_bytes {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the form is larger than {} bytes", state.max_form_bytes),
        ));
    }
    match protocol::parse_form(&body)
        .map_err(|error| ApiError::new(error.status(), error.to_string()))?
    {
        HubRequest::Subscription(request) => {
            state
                .subscriptions
                .check(&request)
                .await
                .map_err(|error| ApiError::new(StatusCode::BAD_REQUEST, error.to_string()))?;
            state.subscriptions.accept(request);
            Ok((StatusCode::ACCEPTED, "verification of intent pending\n").into_response())
        }
        HubRequest::Publish(request) => {
            for topic in &request.topics {
                state
                    .subscriptions
                    .check_topic(topic)
                    .await
                    .map_err(|error| ApiError::new(StatusCode::BAD_REQUEST, error.to_string()))?;
            }
            state.intake.ping(request.topics);
            Ok((StatusCode::ACCEPTED, "publish accepted\n").into_response())
        }
    }
}

/// The topic of a fat ping (`?hub.mode=publish&hub.topic=T`), if this is one.
fn fat_ping_topic(query: Option<&str>) -> Result<Option<String>, ApiError> {
    let Some(query) = query else {
        return Ok(None);
    };
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).map_err(|error| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("bad query string: {error}"),
        )
    })?;
    let mode = pairs.iter().find(|(key, _)| key == "hub.mode");
    if mode.is_none_or(|(_, mode)| mode != "publish") {
        return Ok(None);
    }
    let topics: Vec<&String> = pairs
        .iter()
        .filter(|(key, _)| key == "hub.topic" || key == "hub.url")
        .map(|(_, value)| value)
        .collect();
    match topics.as_slice() {
        [topic] => protocol::parse_topic(topic)
            .map(Some)
            .map_err(|error| ApiError::new(error.status(), error.to_string())),
        [] => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "a fat ping needs hub.topic in the query string",
        )),
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "a fat ping carries content for exactly one hub.topic",
        )),
    }
}

async fn fat_ping(
    state: &ApiState,
    topic: String,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    authorize_internal(state, headers)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or(DEFAULT_CONTENT_TYPE)
        .to_owned();
    match state.intake.record(topic, content_type, body).await {
        Ok(event) => Ok((
            StatusCode::ACCEPTED,
            format!("recorded event {}\n", event.id),
        )
            .into_response()),
        Err(IntakeError::TooLarge { limit }) => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the content is larger than {limit} bytes"),
        )),
        Err(error) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the event could not be recorded: {error}"),
        )),
    }
}

/// Requires the internal API key: 401 without it, 403 with a wrong one.
pub fn authorize_internal(state: &ApiState, headers: &HeaderMap) -> Result<(), ApiError> {
    let name = &*state.internal_api_key_header;
    let Some(expected) = &state.internal_api_key else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "this hub has no internal API key configured, so internal requests are refused",
        ));
    };
    let Some(given) = headers.get(name) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            format!("missing {name} header"),
        ));
    };
    if !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("wrong {name}"),
        ));
    }
    Ok(())
}

/// Compares in time that depends on the lengths only.
fn constant_time_eq(left: &[u8], right: &[u8]) -> bool {
    if left.len() != right.len() {
        return false;
    }
    left.iter()
        .zip(right)
        .fold(0u8, |difference, (a, b)| difference | (a ^ b))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fat_pings_are_recognised_by_their_query() {
        assert!(matches!(fat_ping_topic(None), Ok(None)));
        assert!(matches!(fat_ping_topic(Some("a=b")), Ok(None)));
        assert!(matches!(
            fat_ping_topic(Some("hub.mode=publish&hub.topic=https%3A%2F%2Fpub.example%2Ffeed")),
            Ok(Some(topic)) if topic == "https://pub.example/feed"
        ));
        assert!(fat_ping_topic(Some("hub.mode=publish")).is_err());
        assert!(fat_ping_topic(Some("hub.mode=publish&hub.topic=nota-url")).is_err());
    }

    #[test]
    fn constant_time_eq_compares_bytes() {
        assert!(constant_time_eq(b"same", b"same"));
        assert!(!constant_time_eq(b"same", b"sane"));
        assert!(!constant_time_eq(b"same", b"same!"));
    }
}
