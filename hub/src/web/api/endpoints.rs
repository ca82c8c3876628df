//! Endpoint health for operators, behind the internal key: the WebSub
//! callbacks and outbox webhooks that have been failing or are disabled at
//! `GET /api/v1/operator/endpoints`, `POST …/endpoints/disable` and
//! `…/endpoints/enable` to steer one, `GET …/endpoints/changes`, the
//! history of their state changes, and `GET …/webhooks/attempts`, the
//! attempts of one webhook delivery. The decisions themselves are the
//! delivery core's ([`crate::delivery::health`]).

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::backlog::parse_limit;
use super::history::{AttemptView, DeliveryQuery};
use super::openapi::{ApiRoutes, BadRequest, NoInternalKey, Unavailable, WrongKey};
use super::redeliver::json_body;
use super::{ApiError, ApiState, authorize_operator};
use crate::delivery::{Channel, Endpoints};
use crate::protocol::Mode;
use crate::storage::events::{ChangeFilter, DeliveryFilter, EndpointChange, EndpointRecord};

pub(super) fn routes() -> ApiRoutes {
    ApiRoutes::new()
        .route(utoipa_axum::routes!(endpoints))
        .route(utoipa_axum::routes!(disable))
        .route(utoipa_axum::routes!(enable))
        .route(utoipa_axum::routes!(changes))
        .route(utoipa_axum::routes!(webhook_attempts))
}

/// The health of `channel`'s endpoints: the WebSub scheduler's own, or a
/// view of the webhooks' in the log (each feed's dispatcher reads changes
/// within [`crate::delivery::health::HEALTH_REFRESH`]).
pub(crate) fn endpoints_of(state: &ApiState, channel: Channel) -> Endpoints {
    match channel {
        Channel::WebSub => state.dispatcher.endpoints().clone(),
        other => Endpoints::new(state.events.clone(), other, 0),
    }
}

/// The `channel` parameter: `websub` or `webhook`.
pub(crate) fn parse_channel(text: Option<&str>) -> Result<Option<Channel>, ApiError> {
    match text {
        None => Ok(None),
        Some("websub") => Ok(Some(Channel::WebSub)),
        Some("webhook") => Ok(Some(Channel::Webhook)),
        Some(other) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("channel must be websub or webhook, got {other:?}"),
        )),
    }
}

/// How many to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct EndpointsQuery {
    /// `websub` (callbacks) or `webhook` (outbox webhooks); both when
    /// absent.
    channel: Option<String>,
    /// At most this many of each channel (1 to 1000; 100 when absent).
    limit: Option<String>,
}

/// Endpoints that failed since their last delivery, or are disabled;
/// disabled first.
#[utoipa::path(
    get,
    path = "/endpoints",
    operation_id = "list_endpoints",
    tag = "operator",
    params(EndpointsQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The troubled endpoints.", body = [EndpointRecord]),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
async fn endpoints(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<EndpointsQuery>,
) -> Result<Json<Vec<EndpointRecord>>, ApiError> {
    authorize_operator(&state, &headers)?;
    let limit = parse_limit(query.limit.as_deref())?;
    let channels = match parse_channel(query.channel.as_deref())? {
        Some(channel) => vec![channel],
        None => vec![Channel::WebSub, Channel::Webhook],
    };
    let mut listed = Vec::new();
    for channel in channels {
        listed.extend(endpoints_of(&state, channel).list(limit).await?);
    }
    Ok(Json(listed))
}

/// Which changes to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ChangesQuery {
    /// `websub` (callbacks), `webhook` (outbox webhooks) or `operator`
    /// (the operator webhook); every channel when absent.
    channel: Option<String>,
    /// Only this endpoint's: a callback URL, or a webhook's name or URL.
    endpoint: Option<String>,
    /// At most this many (1 to 1000; 100 when absent).
    limit: Option<String>,
}

/// The history of endpoint state changes (failing, open, recovered,
/// disabled, enabled), newest first, with where each stands with the
/// operator webhook.
#[utoipa::path(
    get,
    path = "/endpoints/changes",
    operation_id = "list_endpoint_changes",
    tag = "operator",
    params(ChangesQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The changes, newest first.", body = [EndpointChange]),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
async fn changes(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<ChangesQuery>,
) -> Result<Json<Vec<EndpointChange>>, ApiError> {
    authorize_operator(&state, &headers)?;
    let limit = parse_limit(query.limit.as_deref())?;
    let channel = match query.channel.as_deref() {
        Some("operator") => Some(Channel::Operator),
        other => parse_channel(other)?,
    };
    let endpoint = query
        .endpoint
        .as_deref()
        .map(str::trim)
        .filter(|endpoint| !endpoint.is_empty());
    let filter = ChangeFilter {
        channel: channel.map(Channel::label),
        endpoint,
    };
    let listed = state.events.changes().list_changes(filter, limit).await?;
    Ok(Json(listed))
}

/// The endpoint to steer.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct EndpointRequest {
    /// The callback URL, or the webhook's name.
    endpoint: String,
    /// `websub` (the default) or `webhook`.
    channel: Option<String>,
    /// Why it is disabled (for `disable`; shown wherever it is listed).
    reason: Option<String>,
    /// For `enable` of a WebSub callback: first ask the callback to confirm
    /// one of its subscriptions (a verification GET with a fresh challenge)
    /// and enable it only if it answers with the challenge.
    probe: Option<bool>,
}

/// Whether the call changed anything.
#[derive(Debug, Serialize, ToSchema)]
struct EndpointAnswer {
    /// The endpoint.
    endpoint: String,
    /// Whether it is disabled now.
    disabled: bool,
    /// False when it already was as asked.
    changed: bool,
}

const ENDPOINT_BODY: &str = "a JSON object with endpoint and optionally reason";

fn endpoint_of(request: &EndpointRequest) -> Result<(Channel, &str), ApiError> {
    let channel = parse_channel(request.channel.as_deref())?.unwrap_or(Channel::WebSub);
    let endpoint = request.endpoint.trim();
    if endpoint.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "endpoint must name a callback URL or a webhook",
        ));
    }
    Ok((channel, endpoint))
}

/// Disables an endpoint: its new deliveries are recorded as skipped, and
/// none is sent, until it is enabled.
#[utoipa::path(
    post,
    path = "/endpoints/disable",
    operation_id = "disable_endpoint",
    tag = "operator",
    request_body(content = EndpointRequest, description = "The endpoint and why."),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "Disabled.", body = EndpointAnswer),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
async fn disable(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<EndpointAnswer>, ApiError> {
    authorize_operator(&state, &headers)?;
    let request: EndpointRequest = json_body(&body, ENDPOINT_BODY)?;
    let (channel, endpoint) = endpoint_of(&request)?;
    let reason = request
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|reason| !reason.is_empty())
        .unwrap_or("disabled by an operator");
    let changed = endpoints_of(&state, channel)
        .disable(endpoint, reason, state.clock.now())
        .await?;
    Ok(Json(EndpointAnswer {
        endpoint: endpoint.to_owned(),
        disabled: true,
        changed,
    }))
}

/// Enables an endpoint again, its failures cleared. Deliveries skipped
/// while it was disabled stay skipped: replay them.
#[utoipa::path(
    post,
    path = "/endpoints/enable",
    operation_id = "enable_endpoint",
    tag = "operator",
    request_body(content = EndpointRequest, description = "The endpoint."),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "Enabled.", body = EndpointAnswer),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 409, description = "The probe found nothing to ask about, or the callback \
            did not confirm; it stays disabled.", content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
async fn enable(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<EndpointAnswer>, ApiError> {
    authorize_operator(&state, &headers)?;
    let request: EndpointRequest = json_body(&body, ENDPOINT_BODY)?;
    let (channel, endpoint) = endpoint_of(&request)?;
    if request.probe == Some(true) {
        probe(&state, channel, endpoint).await?;
    }
    let changed = endpoints_of(&state, channel)
        .enable(endpoint, state.clock.now())
        .await?;
    state.dispatcher.wake();
    Ok(Json(EndpointAnswer {
        endpoint: endpoint.to_owned(),
        disabled: false,
        changed,
    }))
}

/// Asks a WebSub callback to confirm the subscription of its latest
/// delivery: a verification of intent, as for a subscribe, with the lease it
/// has left.
async fn probe(state: &ApiState, channel: Channel, callback: &str) -> Result<(), ApiError> {
    let refused = |reason: String| ApiError::new(StatusCode::CONFLICT, reason);
    if channel != Channel::WebSub {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "only a WebSub callback can be probed",
        ));
    }
    let filter = DeliveryFilter {
        subscriber: Some(callback),
        ..DeliveryFilter::default()
    };
    let latest = state.events.list(filter, 1).await?;
    let Some(latest) = latest.into_iter().next() else {
        return Err(refused(format!(
            "{callback} has no delivery whose subscription a probe could ask about"
        )));
    };
    let subscription =
        state
            .store
            .get(&latest.topic, callback)
            .await
            .map_err(|error| match error {
                websub_store::StoreError::UnknownSubscription { .. } => refused(format!(
                    "{callback} cannot be probed: its subscription to {} is gone",
                    latest.topic
                )),
                error => error.into(),
            })?;
    let lease = subscription.expires_at.map(|expires_at| {
        u32::try_from((expires_at - state.clock.now()).num_seconds().max(1)).unwrap_or(u32::MAX)
    });
    state
        .subscriptions
        .verifier()
        .verify(Mode::Subscribe, &latest.topic, callback, lease)
        .await
        .map_err(|error| {
            refused(format!(
                "the probe of {callback} (its subscription to {}) failed: {error}; it stays \
                 disabled",
                latest.topic
            ))
        })
}

/// The attempts of one outbox webhook delivery, oldest first (its row is in
/// the producer's database).
#[utoipa::path(
    get,
    path = "/webhooks/attempts",
    operation_id = "list_webhook_attempts",
    tag = "operator",
    params(DeliveryQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "Its attempts, oldest first (none when it had none).",
            body = [AttemptView]),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
async fn webhook_attempts(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<DeliveryQuery>,
) -> Result<Json<Vec<AttemptView>>, ApiError> {
    authorize_operator(&state, &headers)?;
    let (event_id, subscriber) = query.required()?;
    let attempts = state.events.webhook_attempts(event_id, subscriber).await?;
    Ok(Json(attempts.into_iter().map(AttemptView::from).collect()))
}
