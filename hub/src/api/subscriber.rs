//! The subscriber API under `/api/v1/`, for the holder of a user token: the
//! caller's own subscriptions with how their deliveries are going, removal
//! of one of them (the owner is authenticated, so no verification of
//! intent), the caller's usage of the subscription quota, and the caller's
//! verifications waiting or failed.

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::operator::{SubscriptionView, store_failed};
use super::{ApiError, ApiState, caller};
use crate::auth::User;
use crate::events::DeliveryHealth;

/// How many of a topic's most recent events a subscription's delivery
/// health looks at.
const HEALTH_WINDOW: usize = 1000;

/// The subscriber routes, nested under `/api/v1`.
pub(super) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/subscriptions", get(list).delete(remove))
        .route("/usage", get(usage))
        .route("/verifications", get(super::backlog::own_intents))
}

/// How deliveries to one subscription are going.
#[derive(Debug, Serialize)]
struct HealthView {
    last_success: Option<DateTime<Utc>>,
    last_error: Option<String>,
    pending: u64,
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

#[derive(Debug, Serialize)]
struct OwnSubscription {
    #[serde(flatten)]
    subscription: SubscriptionView,
    delivery: HealthView,
}

async fn list(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let user = match caller(&state, &headers) {
        Ok(user) => user,
        Err(refusal) => return refusal.into_response(),
    };
    match list_own(&state, &user).await {
        Ok(listed) => Json(listed).into_response(),
        Err(error) => error.into_response(),
    }
}

async fn list_own(state: &ApiState, user: &User) -> Result<Vec<OwnSubscription>, ApiError> {
    let mut owned = state
        .store
        .list_by_owner(&user.id)
        .await
        .map_err(store_failed)?;
    owned.sort_by(|a, b| (&a.topic, &a.callback).cmp(&(&b.topic, &b.callback)));
    let mut listed = Vec::with_capacity(owned.len());
    for subscription in owned {
        let health = state
            .events
            .health(&subscription.topic, &subscription.callback, HEALTH_WINDOW)
            .await
            .map_err(|error| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the event log failed: {error}"),
                )
            })?;
        listed.push(OwnSubscription {
            subscription: SubscriptionView::from(subscription),
            delivery: HealthView::from(health),
        });
    }
    Ok(listed)
}

#[derive(Debug, Deserialize)]
struct Pair {
    topic: Option<String>,
    callback: Option<String>,
}

async fn remove(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(pair): Query<Pair>,
) -> Response {
    let user = match caller(&state, &headers) {
        Ok(user) => user,
        Err(refusal) => return refusal.into_response(),
    };
    let (Some(topic), Some(callback)) = (pair.topic, pair.callback) else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "name the subscription with the topic and callback query parameters",
        )
        .into_response();
    };
    let owned = match state.store.get(&topic, &callback).await {
        Ok(subscription) => subscription.owner.as_deref() == Some(user.id.as_str()),
        Err(websub_store::StoreError::UnknownSubscription { .. }) => false,
        Err(error) => return store_failed(error).into_response(),
    };
    // Someone else's subscription is as invisible as a missing one.
    if !owned {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "you hold no subscription of this callback to this topic",
        )
        .into_response();
    }
    match state.subscriptions.remove(&topic, &callback).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(error) => store_failed(error).into_response(),
    }
}

#[derive(Debug, Serialize)]
struct Usage {
    quota_type: Option<String>,
    used: u64,
    limit: Option<u64>,
    unlimited: bool,
}

async fn usage(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let user = match caller(&state, &headers) {
        Ok(user) => user,
        Err(refusal) => return refusal.into_response(),
    };
    let (quota_type, limit, unlimited) = match state.subscriptions.quota() {
        None => (None, None, true),
        Some(quota) => match quota.limit(quota.quota_type(), &user.id).await {
            Ok(found) if found.unlimited => (Some(found.quota_type), None, true),
            Ok(found) => (Some(found.quota_type), Some(found.limit), false),
            Err(error) => return error.into_response(),
        },
    };
    match state.store.count_by_owner(&user.id).await {
        Ok(used) => Json(Usage {
            quota_type,
            used,
            limit,
            unlimited,
        })
        .into_response(),
        Err(error) => store_failed(error).into_response(),
    }
}
