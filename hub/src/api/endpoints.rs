//! Endpoint health for operators, behind the internal key: the endpoints
//! that have been failing or are disabled at `GET
//! /api/v1/operator/endpoints`, and `POST …/endpoints/disable` and
//! `…/endpoints/enable` to steer one. The decisions themselves are the
//! delivery core's ([`crate::delivery::health`]).

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::backlog::parse_limit;
use super::openapi::{ApiRoutes, BadRequest, NoInternalKey, Unavailable, WrongKey};
use super::operator::events_failed;
use super::redeliver::json_body;
use super::{ApiError, ApiState, authorize_internal};
use crate::events::EndpointRecord;

pub(super) fn routes() -> ApiRoutes {
    ApiRoutes::new()
        .route(utoipa_axum::routes!(endpoints))
        .route(utoipa_axum::routes!(disable))
        .route(utoipa_axum::routes!(enable))
}

/// How many to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct EndpointsQuery {
    /// At most this many (1 to 1000; 100 when absent).
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
    authorize_internal(&state, &headers)?;
    let limit = parse_limit(query.limit.as_deref())?;
    let listed = state
        .dispatcher
        .endpoints()
        .list(limit)
        .await
        .map_err(events_failed)?;
    Ok(Json(listed))
}

/// The endpoint to steer.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct EndpointRequest {
    /// The callback URL.
    endpoint: String,
    /// Why it is disabled (for `disable`; shown wherever it is listed).
    reason: Option<String>,
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

fn endpoint_of(request: &EndpointRequest) -> Result<&str, ApiError> {
    let endpoint = request.endpoint.trim();
    if endpoint.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "endpoint must name a callback URL",
        ));
    }
    Ok(endpoint)
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
    authorize_internal(&state, &headers)?;
    let request: EndpointRequest = json_body(&body, ENDPOINT_BODY)?;
    let endpoint = endpoint_of(&request)?;
    let reason = request
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|reason| !reason.is_empty())
        .unwrap_or("disabled by an operator");
    let changed = state
        .dispatcher
        .endpoints()
        .disable(endpoint, reason, state.clock.now())
        .await
        .map_err(events_failed)?;
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
        (status = 503, response = Unavailable),
    ),
)]
async fn enable(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<EndpointAnswer>, ApiError> {
    authorize_internal(&state, &headers)?;
    let request: EndpointRequest = json_body(&body, ENDPOINT_BODY)?;
    let endpoint = endpoint_of(&request)?;
    let changed = state
        .dispatcher
        .endpoints()
        .enable(endpoint, state.clock.now())
        .await
        .map_err(events_failed)?;
    state.dispatcher.wake();
    Ok(Json(EndpointAnswer {
        endpoint: endpoint.to_owned(),
        disabled: false,
        changed,
    }))
}
