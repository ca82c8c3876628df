//! Outbox webhooks' deliveries for operators, behind the internal key:
//! `GET /api/v1/operator/webhooks/deliveries` lists the feeds' webhook rows
//! (the producers' own) with their state, by webhook, state and time.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use serde::Deserialize;
use utoipa::IntoParams;

use super::history::Window;
use super::openapi::{ApiRoutes, BadRequest, NoInternalKey, Unavailable, WrongKey};
use super::{ApiError, ApiState, authorize_operator};
use crate::delivery::outbox::{WebhookDelivery, WebhookFilter};

pub(super) fn routes() -> ApiRoutes {
    ApiRoutes::new().route(utoipa_axum::routes!(webhook_deliveries))
}

/// Which webhook rows; every filter is optional.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct WebhookQuery {
    /// Only this webhook's.
    subscriber: Option<String>,
    /// `pending`, `delivered`, `failed` or `skipped`.
    state: Option<String>,
    /// Events committed at or after this time (RFC 3339).
    since: Option<String>,
    /// Events committed before this time (RFC 3339).
    until: Option<String>,
    /// At most this many (1 to 1000; 100 when absent).
    limit: Option<String>,
}

/// The outbox feeds' webhook rows, newest event first.
#[utoipa::path(
    get,
    path = "/webhooks/deliveries",
    operation_id = "list_webhook_deliveries",
    tag = "operator",
    params(WebhookQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The matching rows, over every feed.",
            body = [WebhookDelivery]),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
async fn webhook_deliveries(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<WebhookQuery>,
) -> Result<Json<Vec<WebhookDelivery>>, ApiError> {
    authorize_operator(&state, &headers)?;
    let window = Window::parse(
        query.state.as_deref(),
        query.since.as_deref(),
        query.until.as_deref(),
        query.limit.as_deref(),
    )?;
    let filter = WebhookFilter {
        subscriber: query.subscriber.as_deref(),
        state: window.state,
        since: window.since,
        until: window.until,
    };
    let limit = window.limit;
    let listed = state
        .feeds
        .webhook_deliveries(filter, limit)
        .await
        .map_err(ApiError::producer_failed)?;
    Ok(Json(listed))
}
