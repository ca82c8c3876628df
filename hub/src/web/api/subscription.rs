//! The operator's hold on one subscription, named by its topic and callback:
//! `GET /api/v1/operator/subscription` shows it with how its deliveries are
//! going, `DELETE /api/v1/operator/subscriptions` removes it at once (no
//! verification of intent: the operator holds the internal key). Removing
//! a subscription that is not there answers 404, so that a mistyped topic
//! or callback is noticed rather than silently "removed".

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use websub_store::{StoreError, Subscription};

use super::openapi::{BadRequest, NoInternalKey, Unavailable, WrongKey};
use super::operator::SubscriptionView;
use super::subscriber::{HEALTH_WINDOW, HealthView};
use super::{ApiError, ApiState, authorize_operator};

/// Which subscription: both are required, and read after the key is
/// checked so that a request without it is refused as such.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct SubscriptionQuery {
    /// The topic URL.
    #[param(required = true)]
    topic: Option<String>,
    /// The callback URL.
    #[param(required = true)]
    callback: Option<String>,
}

impl SubscriptionQuery {
    pub(super) fn pair(self) -> Result<(String, String), ApiError> {
        match (self.topic, self.callback) {
            (Some(topic), Some(callback)) => Ok((topic, callback)),
            _ => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "name the subscription with the topic and callback query parameters",
            )),
        }
    }
}

/// A subscription with how its deliveries are going.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SubscriptionHealth {
    #[serde(flatten)]
    subscription: SubscriptionView,
    /// Over the topic's most recent 1000 events.
    delivery: HealthView,
}

/// The subscription, or the 404 that says it is not there.
pub(crate) async fn find(
    state: &ApiState,
    topic: &str,
    callback: &str,
) -> Result<Subscription, ApiError> {
    match state.store.get(topic, callback).await {
        Ok(subscription) => Ok(subscription),
        Err(StoreError::UnknownSubscription { .. }) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("{callback} holds no subscription to {topic}"),
        )),
        Err(error) => Err(ApiError::from(error)),
    }
}

/// The subscription of `callback` to `topic` if `owner` holds it; someone
/// else's is as invisible as a missing one (the same 404).
pub(crate) async fn find_own(
    state: &ApiState,
    owner: &str,
    topic: &str,
    callback: &str,
) -> Result<Subscription, ApiError> {
    let not_yours = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "you hold no subscription of this callback to this topic",
        )
    };
    match find(state, topic, callback).await {
        Ok(found) if found.owner.as_deref() == Some(owner) => Ok(found),
        Ok(_) => Err(not_yours()),
        Err(error) if error.status == StatusCode::NOT_FOUND => Err(not_yours()),
        Err(error) => Err(error),
    }
}

/// One subscription, with how its deliveries are going.
#[utoipa::path(
    get,
    path = "/subscription",
    operation_id = "show_subscription",
    tag = "operator",
    params(SubscriptionQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The subscription (never its secret) and its delivery \
            health over the topic's last 1000 events.", body = SubscriptionHealth),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 404, description = "The callback holds no subscription to the topic.",
            content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn show(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<SubscriptionQuery>,
) -> Result<Json<SubscriptionHealth>, ApiError> {
    authorize_operator(&state, &headers)?;
    let (topic, callback) = query.pair()?;
    let subscription = find(&state, &topic, &callback).await?;
    let health = state
        .events
        .health(&topic, &callback, HEALTH_WINDOW)
        .await?;
    Ok(Json(SubscriptionHealth {
        subscription: SubscriptionView::of(subscription, &state),
        delivery: HealthView::from(health),
    }))
}

/// Removes one subscription at once, without verification of intent.
///
/// Its deliveries still pending are dropped as for an unsubscribe.
#[utoipa::path(
    delete,
    path = "/subscriptions",
    operation_id = "delete_subscription",
    tag = "operator",
    params(SubscriptionQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 204, description = "Removed."),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 404, description = "The callback holds no subscription to the topic \
            (nothing was removed).", content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn delete(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<SubscriptionQuery>,
) -> Result<StatusCode, ApiError> {
    authorize_operator(&state, &headers)?;
    let (topic, callback) = query.pair()?;
    find(&state, &topic, &callback).await?;
    state.subscriptions.remove(&topic, &callback).await?;
    Ok(StatusCode::NO_CONTENT)
}
