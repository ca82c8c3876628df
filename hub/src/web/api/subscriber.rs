//! The subscriber API under `/api/v1/`, for the holder of a user token: the
//! caller's own subscriptions with how their deliveries are going, removal
//! of one of them (the owner is authenticated, so no verification of
//! intent), the caller's usage of the subscription quota, and the caller's
//! verifications waiting or failed.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::openapi::{
    ApiRoutes, BadRequest, NoSubscriberApi, TokenTooLarge, Unauthenticated, Unavailable,
};
use super::operator::SubscriptionView;
use super::{ApiError, ApiState, caller};
use crate::intake::quota::ErrorBody;
use crate::storage::events::DeliveryHealth;
use crate::web::auth::User;

/// How many of a topic's most recent events a subscription's delivery
/// health looks at.
pub(super) const HEALTH_WINDOW: usize = 1000;

/// The subscriber routes, nested under `/api/v1`.
pub(super) fn routes() -> ApiRoutes {
    ApiRoutes::new()
        .route(routes!(list))
        .route(routes!(remove))
        .route(routes!(super::delivery_order::own))
        .route(routes!(super::signing::own))
        .route(routes!(usage))
        .route(routes!(super::backlog::own_intents))
        .route(routes!(super::own_deliveries::own_deliveries))
}

/// How deliveries to one subscription are going, over the topic's most
/// recent 1000 events.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct HealthView {
    /// When a delivery last succeeded.
    last_success: Option<DateTime<Utc>>,
    /// Why the latest failed attempt failed.
    last_error: Option<String>,
    /// Deliveries still to be attempted or retried.
    pending: u64,
    /// Deliveries that ran out of retries.
    failed: u64,
}

impl From<DeliveryHealth> for HealthView {
    fn from(health: DeliveryHealth) -> Self {
        Self {
            last_success: health.last_success,
            last_error: health.last_error,
            pending: health.pending,
            failed: health.failed,
        }
    }
}

/// One of the caller's subscriptions, with how its deliveries are going.
#[derive(Debug, Serialize, ToSchema)]
struct OwnSubscription {
    #[serde(flatten)]
    subscription: SubscriptionView,
    delivery: HealthView,
}

/// The caller's subscriptions.
#[utoipa::path(
    get,
    path = "/subscriptions",
    operation_id = "list_own_subscriptions",
    tag = "subscriber",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The caller's subscriptions, by topic then callback.",
            body = [OwnSubscription]),
        (status = 401, response = Unauthenticated),
        (status = 404, response = NoSubscriberApi),
        (status = 431, response = TokenTooLarge),
        (status = 503, response = Unavailable),
    ),
)]
async fn list(State(state): State<ApiState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let user = caller(&state, &headers)?;
    Ok(Json(list_own(&state, &user).await?).into_response())
}

async fn list_own(state: &ApiState, user: &User) -> Result<Vec<OwnSubscription>, ApiError> {
    let mut owned = state.store.list_by_owner(&user.id).await?;
    owned.sort_by(|a, b| (&a.topic, &a.callback).cmp(&(&b.topic, &b.callback)));
    let mut listed = Vec::with_capacity(owned.len());
    for subscription in owned {
        let health = state
            .events
            .health(&subscription.topic, &subscription.callback, HEALTH_WINDOW)
            .await?;
        listed.push(OwnSubscription {
            subscription: SubscriptionView::of(subscription, state),
            delivery: HealthView::from(health),
        });
    }
    Ok(listed)
}

/// The subscription to remove; both are needed.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct Pair {
    /// The topic URL.
    #[param(required = true)]
    topic: Option<String>,
    /// The callback URL.
    #[param(required = true)]
    callback: Option<String>,
}

/// Removes one of the caller's subscriptions at once.
///
/// The owner is authenticated, so there is no verification of intent.
#[utoipa::path(
    delete,
    path = "/subscriptions",
    operation_id = "remove_own_subscription",
    tag = "subscriber",
    params(Pair),
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Removed."),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "The caller holds no subscription of this callback to \
            this topic (another subscriber's is answered the same), or this hub has no \
            subscriber API.", body = String, content_type = "text/plain"),
        (status = 431, response = TokenTooLarge),
        (status = 503, response = Unavailable),
    ),
)]
async fn remove(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(pair): Query<Pair>,
) -> Result<StatusCode, ApiError> {
    let user = caller(&state, &headers)?;
    let (Some(topic), Some(callback)) = (pair.topic, pair.callback) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "name the subscription with the topic and callback query parameters",
        ));
    };
    super::subscription::find_own(&state, &user.id, &topic, &callback).await?;
    state.subscriptions.remove(&topic, &callback).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The caller's usage of the subscription quota.
#[derive(Debug, Serialize, ToSchema)]
struct Usage {
    /// The quota type counted, or `null` when the hub enforces no quota.
    quota_type: Option<String>,
    /// How many subscriptions the caller holds.
    used: u64,
    /// The caller's limit, or `null` when unlimited.
    limit: Option<u64>,
    /// Whether the caller may hold any number.
    unlimited: bool,
}

/// The caller's usage of the subscription quota.
#[utoipa::path(
    get,
    path = "/usage",
    operation_id = "own_usage",
    tag = "subscriber",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "What the caller holds and may hold.", body = Usage),
        (status = 401, response = Unauthenticated),
        (status = 403, description = "The caller's tier has no quota of this type \
            (`quota_not_allowed`).", body = ErrorBody),
        (status = 404, response = NoSubscriberApi),
        (status = 431, response = TokenTooLarge),
        (status = 500, description = "The quota is misconfigured (`quota_misconfigured`).",
            body = ErrorBody),
        (status = 502, description = "The subscriptions service answered without a usable \
            quota (`quota_resource_not_found`, `quota_unexpected_response`).", body = ErrorBody),
        (status = 503, description = "The subscriptions service did not answer \
            (`quota_unavailable`, as JSON), or the subscription store failed (a plain-text \
            reason).", content(
            (ErrorBody = "application/json"),
            (String = "text/plain"),
        )),
    ),
)]
async fn usage(State(state): State<ApiState>, headers: HeaderMap) -> Result<Json<Usage>, ApiError> {
    let user = caller(&state, &headers)?;
    let (quota_type, limit, unlimited) = match state.subscriptions.quota() {
        None => (None, None, true),
        Some(quota) => {
            let found = quota.limit(quota.quota_type(), &user.id).await?;
            let limit = (!found.unlimited).then_some(found.limit);
            (Some(found.quota_type), limit, found.unlimited)
        }
    };
    let used = state.store.count_by_owner(&user.id).await?;
    Ok(Json(Usage {
        quota_type,
        used,
        limit,
        unlimited,
    }))
}
