//! Ordered delivery, asked for through the APIs: a subscription's events
//! one at a time, strictly in the order the hub recorded them (see the
//! README's "Ordered delivery"). The operator sets it on any subscription
//! (`PUT /api/v1/operator/subscription/delivery`), a subscriber on its own
//! (`PUT /api/v1/subscriptions/delivery`). Both answer with the
//! subscription as it now stands.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use utoipa::ToSchema;

use super::openapi::{
    BadRequest, NoInternalKey, TokenTooLarge, Unauthenticated, Unavailable, WrongKey,
};
use super::operator::SubscriptionView;
use super::subscription::{SubscriptionQuery, find, find_own};
use super::{ApiError, ApiState, authorize_operator, caller};

/// How a subscription's events are delivered.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DeliveryOrder {
    /// `true`: one at a time, strictly in recording order; an event that
    /// fails holds the ones after it until it is delivered. `false`: all at
    /// once, the default.
    ordered: bool,
}

/// Sets ordered delivery on one subscription.
///
/// Events recorded from now on follow the setting; records already written
/// keep the way they were written with. Other replicas follow within five
/// seconds.
#[utoipa::path(
    put,
    path = "/subscription/delivery",
    operation_id = "set_subscription_delivery",
    tag = "operator",
    params(SubscriptionQuery),
    request_body = DeliveryOrder,
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The subscription as it now stands.", body = SubscriptionView),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 404, description = "The callback holds no subscription to the topic.",
            content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn operator(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<SubscriptionQuery>,
    order: Result<Json<DeliveryOrder>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<SubscriptionView>, ApiError> {
    authorize_operator(&state, &headers)?;
    let (topic, callback) = query.pair()?;
    let Json(order) = order.map_err(bad_body)?;
    let subscription = find(&state, &topic, &callback).await?;
    set(&state, &topic, &callback, order.ordered).await?;
    Ok(Json(SubscriptionView::of(subscription, &state)))
}

/// Sets ordered delivery on one of the caller's subscriptions.
///
/// Events recorded from now on follow the setting; records already written
/// keep the way they were written with.
#[utoipa::path(
    put,
    path = "/subscriptions/delivery",
    operation_id = "set_own_subscription_delivery",
    tag = "subscriber",
    params(SubscriptionQuery),
    request_body = DeliveryOrder,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The subscription as it now stands.", body = SubscriptionView),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "The caller holds no subscription of this callback to \
            this topic (another subscriber's is answered the same), or this hub has no \
            subscriber API.", body = String, content_type = "text/plain"),
        (status = 431, response = TokenTooLarge),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn own(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<SubscriptionQuery>,
    order: Result<Json<DeliveryOrder>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<SubscriptionView>, ApiError> {
    let user = caller(&state, &headers)?;
    let (topic, callback) = query.pair()?;
    let Json(order) = order.map_err(bad_body)?;
    let subscription = find_own(&state, &user.id, &topic, &callback).await?;
    set(&state, &topic, &callback, order.ordered).await?;
    Ok(Json(SubscriptionView::of(subscription, &state)))
}

async fn set(state: &ApiState, topic: &str, callback: &str, ordered: bool) -> Result<(), ApiError> {
    state
        .dispatcher
        .set_ordered(topic, callback, ordered)
        .await
        .map_err(ApiError::from)
}

fn bad_body(rejection: axum::extract::rejection::JsonRejection) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        format!(
            "the body must be JSON like {{\"ordered\": true}}: {}",
            rejection.body_text()
        ),
    )
}
