//! Saying no, for operators: the deny list at
//! `GET|POST /api/v1/operator/denials` and `DELETE …/denials/{id}`
//! (patterns of topics and callbacks whose subscribe requests are denied,
//! [`crate::intake::deny`]), and `POST …/subscriptions/deny`, which removes
//! one subscription and tells its callback why (`hub.mode=denied`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::openapi::{ApiRoutes, BadRequest, NoInternalKey, Unavailable, WrongKey};
use super::redeliver::json_body;
use super::subscription::find;
use super::{ApiError, ApiState, authorize_operator};
use crate::intake::deny::{check_reason, compile};
use crate::storage::events::denials::MAX_DENIALS;
use crate::storage::events::{Denial, DeniedField};

/// The operator API's routes for denial.
pub(super) fn routes() -> ApiRoutes {
    use utoipa_axum::routes;
    ApiRoutes::new()
        .route(routes!(list, add))
        .route(routes!(remove))
        .route(routes!(deny_subscription))
}

/// A pattern to deny.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewDenial {
    /// What the pattern is matched against.
    field: DeniedField,
    /// A whole URL, `*` matching any run of characters, case aside; not
    /// `*` alone.
    pattern: String,
    /// Sent to each denied callback as `hub.reason` (1 to 512 bytes).
    reason: String,
}

const NEW_DENIAL: &str = r#"{"field": "topic"|"callback", "pattern": …, "reason": …}"#;

/// Every pattern of the deny list, oldest first.
#[utoipa::path(
    get,
    path = "/denials",
    operation_id = "list_denials",
    tag = "operator",
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The deny list.", body = [Denial]),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn list(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Json<Vec<Denial>>, ApiError> {
    authorize_operator(&state, &headers)?;
    Ok(Json(state.events.denials().await?))
}

/// Adds a pattern to the deny list (a pattern already listed for its field
/// takes the new reason). Subscribe requests it matches are denied from
/// then on: on this replica at once, on others within 5 s. Subscriptions
/// already held are untouched; deny them one by one.
#[utoipa::path(
    post,
    path = "/denials",
    operation_id = "add_denial",
    tag = "operator",
    request_body(content = NewDenial, description = "The pattern and why."),
    security(("internal_api_key" = [])),
    responses(
        (status = 201, description = "Listed.", body = Denial),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 409, description = "The list holds 1 000 patterns already.",
            content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn add(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Denial>), ApiError> {
    authorize_operator(&state, &headers)?;
    let request: NewDenial = json_body(&body, NEW_DENIAL)?;
    let listed = deny_pattern(&state, request.field, &request.pattern, &request.reason).await?;
    Ok((StatusCode::CREATED, Json(listed)))
}

/// Lists `pattern` for `field` with `reason` once both are checked (400
/// when not; 409 when the list is full), and has the next subscribe
/// request read the list again. The API's and the admin page's one way.
pub(crate) async fn deny_pattern(
    state: &ApiState,
    field: DeniedField,
    pattern: &str,
    reason: &str,
) -> Result<Denial, ApiError> {
    let bad = |error: crate::intake::deny::PatternError| {
        ApiError::new(StatusCode::BAD_REQUEST, error.to_string())
    };
    compile(pattern).map_err(bad)?;
    check_reason(reason).map_err(bad)?;
    let denial = Denial {
        id: hex::encode(rand::random::<[u8; 8]>()),
        field,
        pattern: pattern.to_owned(),
        reason: reason.trim().to_owned(),
        created_at: state.clock.now(),
    };
    let Some(listed) = state.events.add_denial(&denial).await? else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("the deny list holds {MAX_DENIALS} patterns already; remove one first"),
        ));
    };
    if let Some(denials) = state.subscriptions.denials() {
        denials.changed();
    }
    tracing::info!(id = %listed.id, field = listed.field.as_str(), pattern = %listed.pattern, "denial listed");
    Ok(listed)
}

/// Removes the pattern `id` (404 when there is none) and has the next
/// subscribe request read the list again.
pub(crate) async fn undeny_pattern(state: &ApiState, id: &str) -> Result<(), ApiError> {
    if !state.events.remove_denial(id).await? {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no denial has the id {id:?}"),
        ));
    }
    if let Some(denials) = state.subscriptions.denials() {
        denials.changed();
    }
    tracing::info!(%id, "denial removed");
    Ok(())
}

/// Removes a pattern from the deny list.
#[utoipa::path(
    delete,
    path = "/denials/{id}",
    operation_id = "remove_denial",
    tag = "operator",
    params(("id" = String, Path, description = "The pattern's id, as listed.")),
    security(("internal_api_key" = [])),
    responses(
        (status = 204, description = "Removed."),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 404, description = "No pattern has this id.",
            content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn remove(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    authorize_operator(&state, &headers)?;
    undeny_pattern(&state, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Which subscription to deny, and why.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DenySubscription {
    /// The topic URL.
    topic: String,
    /// The callback URL.
    callback: String,
    /// Sent to the callback as `hub.reason` (1 to 512 bytes).
    reason: String,
}

/// What denying a subscription did.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Denied {
    topic: String,
    callback: String,
    /// Whether the callback acknowledged the notice (a 2xx): it is sent
    /// once, and the subscription is removed either way.
    notified: bool,
}

const DENY_SUBSCRIPTION: &str = r#"{"topic": …, "callback": …, "reason": …}"#;

/// Denies one subscription: removes it at once and sends its callback
/// `hub.mode=denied` with `hub.topic` and `hub.reason`, as the WebSub
/// Recommendation describes. Its pending deliveries are dropped as for an
/// unsubscribe. To keep it from subscribing again, list a pattern too.
#[utoipa::path(
    post,
    path = "/subscriptions/deny",
    operation_id = "deny_subscription",
    tag = "operator",
    request_body(content = DenySubscription, description = "The subscription and why."),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "Removed, and the callback told.", body = Denied),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 404, description = "The callback holds no subscription to the topic.",
            content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn deny_subscription(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Denied>, ApiError> {
    authorize_operator(&state, &headers)?;
    let request: DenySubscription = json_body(&body, DENY_SUBSCRIPTION)?;
    check_reason(&request.reason)
        .map_err(|error| ApiError::new(StatusCode::BAD_REQUEST, error.to_string()))?;
    find(&state, &request.topic, &request.callback).await?;
    let notified = state
        .subscriptions
        .deny(&request.topic, &request.callback, request.reason.trim())
        .await?;
    Ok(Json(Denied {
        topic: request.topic,
        callback: request.callback,
        notified,
    }))
}
