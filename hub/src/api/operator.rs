//! The operator API under `/api/v1/operator/`, behind the internal API key:
//! what the hub is holding (topics and their subscriptions) and what it
//! could not deliver (exhausted delivery records), with a way to retry them,
//! and what it has accepted but not yet done (see [`super::backlog`]).
//! JSON in, JSON out; errors are plain-text reasons like the hub endpoint's.

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{ApiError, ApiState, authorize_internal, backlog};
use crate::events::FailedFilter;
use websub_store::Subscription;

/// The operator routes, nested under `/api/v1/operator`.
pub(super) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/topics", get(topics))
        .route("/subscriptions", get(subscriptions))
        .route("/deliveries/failed", get(failed))
        .route("/deliveries/retry", post(retry))
        .route("/verifications", get(backlog::operator_intents))
        .route("/fetches", get(backlog::fetches))
}

/// A topic and how many subscriptions it has.
#[derive(Debug, Serialize)]
struct TopicSummary {
    topic: String,
    subscribers: usize,
}

async fn topics(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Json<Vec<TopicSummary>>, ApiError> {
    authorize_internal(&state, &headers)?;
    let mut summaries = Vec::new();
    for topic in state.store.topics().await.map_err(store_failed)? {
        let subscribers = state
            .store
            .list_by_topic(&topic)
            .await
            .map_err(store_failed)?
            .len();
        // A topic whose last subscription went between the two reads.
        if subscribers > 0 {
            summaries.push(TopicSummary { topic, subscribers });
        }
    }
    summaries.sort_by(|a, b| a.topic.cmp(&b.topic));
    Ok(Json(summaries))
}

#[derive(Debug, Deserialize)]
struct TopicQuery {
    topic: Option<String>,
}

/// A subscription as operators see it: everything but the secret.
#[derive(Debug, Serialize)]
pub(super) struct SubscriptionView {
    pub(super) topic: String,
    pub(super) callback: String,
    pub(super) owner: Option<String>,
    pub(super) has_secret: bool,
    pub(super) lease_seconds: Option<u32>,
    pub(super) created_at: DateTime<Utc>,
    pub(super) verified_at: DateTime<Utc>,
    pub(super) expires_at: Option<DateTime<Utc>>,
}

impl From<Subscription> for SubscriptionView {
    fn from(subscription: Subscription) -> Self {
        Self {
            topic: subscription.topic,
            callback: subscription.callback,
            owner: subscription.owner,
            has_secret: subscription.secret.is_some(),
            lease_seconds: subscription.lease_seconds,
            created_at: subscription.created_at,
            verified_at: subscription.verified_at,
            expires_at: subscription.expires_at,
        }
    }
}

async fn subscriptions(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<TopicQuery>,
) -> Result<Json<Vec<SubscriptionView>>, ApiError> {
    authorize_internal(&state, &headers)?;
    let Some(topic) = query.topic else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "missing the topic query parameter",
        ));
    };
    let mut listed: Vec<SubscriptionView> = state
        .store
        .list_by_topic(&topic)
        .await
        .map_err(store_failed)?
        .into_iter()
        .map(SubscriptionView::from)
        .collect();
    listed.sort_by(|a, b| a.callback.cmp(&b.callback));
    Ok(Json(listed))
}

#[derive(Debug, Deserialize)]
struct FailedQuery {
    topic: Option<String>,
    subscriber: Option<String>,
    limit: Option<String>,
}

/// An exhausted delivery record.
#[derive(Debug, Serialize)]
struct FailedView {
    event_id: Uuid,
    topic: String,
    subscriber: String,
    created_at: DateTime<Utc>,
    attempts: u32,
    last_error: Option<String>,
}

async fn failed(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<FailedQuery>,
) -> Result<Json<Vec<FailedView>>, ApiError> {
    authorize_internal(&state, &headers)?;
    let limit = backlog::parse_limit(query.limit.as_deref())?;
    let filter = FailedFilter {
        topic: query.topic.as_deref(),
        subscriber: query.subscriber.as_deref(),
    };
    let failed = state
        .events
        .failed(filter, limit)
        .await
        .map_err(events_failed)?;
    Ok(Json(
        failed
            .into_iter()
            .map(|record| FailedView {
                event_id: record.event_id,
                topic: record.topic,
                subscriber: record.subscriber,
                created_at: record.created_at,
                attempts: record.retry_count,
                last_error: record.last_error,
            })
            .collect(),
    ))
}

/// Which failed records to retry; both absent retries every one.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryRequest {
    topic: Option<String>,
    subscriber: Option<String>,
}

#[derive(Debug, Serialize)]
struct RetryAnswer {
    retried: u64,
}

async fn retry(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<RetryAnswer>, ApiError> {
    authorize_internal(&state, &headers)?;
    let request: RetryRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RetryRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|error| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("expected a JSON object with optional topic and subscriber: {error}"),
            )
        })?
    };
    let filter = FailedFilter {
        topic: request.topic.as_deref(),
        subscriber: request.subscriber.as_deref(),
    };
    let retried = state
        .events
        .retry_failed(filter, state.clock.now())
        .await
        .map_err(events_failed)?;
    if retried > 0 {
        state.dispatcher.wake();
    }
    Ok(Json(RetryAnswer { retried }))
}

pub(super) fn store_failed(error: websub_store::StoreError) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the subscription store failed: {error}"),
    )
}

fn events_failed(error: crate::events::EventLogError) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the event log failed: {error}"),
    )
}
