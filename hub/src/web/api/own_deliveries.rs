//! The subscriber API's view of deliveries, at `GET /api/v1/deliveries`:
//! the delivery records of the caller's own subscriptions, newest first,
//! and nobody else's.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;

use super::history::Window;
use super::openapi::{BadRequest, NoSubscriberApi, TokenTooLarge, Unauthenticated, Unavailable};
use super::{ApiError, ApiState, caller};
use crate::storage::events::{DeliveryFilter, DeliverySummary};
use crate::web::auth::User;

/// How many of the caller's subscriptions one request looks through; more
/// must be narrowed down by topic or callback.
const SUBSCRIPTIONS_LOOKED_AT: usize = 50;

/// Which of the caller's deliveries; every filter is optional.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct OwnQuery {
    /// Deliveries of the caller's subscriptions to this topic.
    topic: Option<String>,
    /// Deliveries to this callback of the caller's.
    callback: Option<String>,
    /// `pending`, `delivered`, `dropped`, `failed` or `skipped`.
    state: Option<String>,
    /// Events recorded at or after this time (RFC 3339).
    since: Option<String>,
    /// Events recorded before this time (RFC 3339).
    until: Option<String>,
    /// At most this many (1 to 1000; 100 when absent).
    limit: Option<String>,
}

/// The deliveries of the caller's subscriptions, newest event first.
#[utoipa::path(
    get,
    path = "/deliveries",
    operation_id = "list_own_deliveries",
    tag = "subscriber",
    params(OwnQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The matching delivery records.", body = [DeliverySummary]),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 404, response = NoSubscriberApi),
        (status = 431, response = TokenTooLarge),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn own_deliveries(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<OwnQuery>,
) -> Result<Response, ApiError> {
    let user = caller(&state, &headers)?;
    Ok(Json(list_own(&state, &user, &query).await?).into_response())
}

async fn list_own(
    state: &ApiState,
    user: &User,
    query: &OwnQuery,
) -> Result<Vec<DeliverySummary>, ApiError> {
    let window = Window::parse(
        query.state.as_deref(),
        query.since.as_deref(),
        query.until.as_deref(),
        query.limit.as_deref(),
    )?;
    let Window {
        state: wanted,
        since,
        until,
        limit,
    } = window;
    let owned = state.store.list_by_owner(&user.id).await?;
    let matching: Vec<_> = owned
        .iter()
        .filter(|held| {
            query
                .topic
                .as_deref()
                .is_none_or(|topic| held.topic == topic)
        })
        .filter(|held| {
            query
                .callback
                .as_deref()
                .is_none_or(|callback| held.callback == callback)
        })
        .collect();
    if matching.len() > SUBSCRIPTIONS_LOOKED_AT {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{} of your subscriptions match; name a topic or a callback to look at \
                 {SUBSCRIPTIONS_LOOKED_AT} or fewer",
                matching.len()
            ),
        ));
    }
    let mut listed = Vec::new();
    for held in matching {
        let filter = DeliveryFilter {
            topic: Some(&held.topic),
            subscriber: Some(&held.callback),
            state: wanted,
            since,
            until,
            ..DeliveryFilter::default()
        };
        listed.extend(state.events.list(filter, limit).await?);
    }
    listed.sort_by(|a, b| {
        (b.created_at, b.event_id, &a.subscriber).cmp(&(a.created_at, a.event_id, &b.subscriber))
    });
    listed.truncate(limit);
    Ok(listed)
}
