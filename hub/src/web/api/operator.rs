//! The operator API under `/api/v1/operator/`, behind the internal API key:
//! what the hub is holding (topics and their subscriptions) and what it
//! could not deliver (exhausted delivery records), with a way to retry them,
//! and what it has accepted but not yet done (see [`super::backlog`]).
//! JSON in, JSON out; errors are plain-text reasons like the hub endpoint's.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;
use uuid::Uuid;

use super::openapi::{ApiRoutes, BadRequest, NoInternalKey, Unavailable, WrongKey};
use super::{ApiError, ApiState, authorize_operator, backlog};
use crate::storage::events::FailedFilter;
use websub_store::Subscription;

/// This module's operator routes; `operator_routes` in [`super`] gathers
/// them with the others. A route is its handler's `#[utoipa::path]` (see
/// [`super::openapi`]).
pub(super) fn routes() -> ApiRoutes {
    ApiRoutes::new()
        .route(routes!(topics))
        .route(routes!(subscriptions))
        .route(routes!(failed))
        .route(routes!(retry))
}

/// A topic and how many subscriptions it has.
#[derive(Debug, Serialize, ToSchema)]
struct TopicSummary {
    /// The topic URL.
    topic: String,
    /// How many subscriptions it has (at least one).
    subscribers: usize,
}

/// Every topic with at least one subscription.
#[utoipa::path(
    get,
    path = "/topics",
    operation_id = "list_topics",
    tag = "operator",
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The topics, in order.", body = [TopicSummary]),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
async fn topics(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Json<Vec<TopicSummary>>, ApiError> {
    authorize_operator(&state, &headers)?;
    let mut summaries = Vec::new();
    for topic in state.store.topics().await? {
        let subscribers = state.store.list_by_topic(&topic).await?.len();
        // A topic whose last subscription went between the two reads.
        if subscribers > 0 {
            summaries.push(TopicSummary { topic, subscribers });
        }
    }
    summaries.sort_by(|a, b| a.topic.cmp(&b.topic));
    Ok(Json(summaries))
}

/// Which topic's subscriptions to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct TopicQuery {
    /// The topic URL.
    #[param(required = true)]
    topic: Option<String>,
}

/// A subscription as operators see it: everything but the secret.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SubscriptionView {
    /// The topic URL.
    pub(super) topic: String,
    /// The callback URL deliveries are POSTed to.
    pub(super) callback: String,
    /// The user holding it, when it was requested with a user token.
    pub(super) owner: Option<String>,
    /// Whether deliveries are signed (`X-Hub-Signature`).
    pub(super) has_secret: bool,
    /// The lease granted, in seconds; `null` for a permanent subscription.
    pub(super) lease_seconds: Option<u32>,
    /// When it was first verified.
    pub(super) created_at: DateTime<Utc>,
    /// When it was last verified.
    pub(super) verified_at: DateTime<Utc>,
    /// When it expires; `null` for a permanent subscription.
    pub(super) expires_at: Option<DateTime<Utc>>,
    /// Whether its events go out one at a time, strictly in the order the
    /// hub recorded them (ordered delivery); `false`, the default, lets
    /// them go out at once.
    pub(super) ordered: bool,
}

impl SubscriptionView {
    /// `subscription` as the APIs show it, with whether it asked for
    /// ordered delivery.
    pub(super) fn of(subscription: Subscription, state: &ApiState) -> Self {
        Self {
            ordered: state.dispatcher.is_ordered(&subscription),
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

/// The subscriptions of one topic.
#[utoipa::path(
    get,
    path = "/subscriptions",
    operation_id = "list_topic_subscriptions",
    tag = "operator",
    params(TopicQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The topic's subscriptions, by callback.",
            body = [SubscriptionView]),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
async fn subscriptions(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<TopicQuery>,
) -> Result<Json<Vec<SubscriptionView>>, ApiError> {
    authorize_operator(&state, &headers)?;
    let Some(topic) = query.topic else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "missing the topic query parameter",
        ));
    };
    let mut listed: Vec<SubscriptionView> = state
        .store
        .list_by_topic(&topic)
        .await?
        .into_iter()
        .map(|subscription| SubscriptionView::of(subscription, &state))
        .collect();
    listed.sort_by(|a, b| a.callback.cmp(&b.callback));
    Ok(Json(listed))
}

/// Which failed deliveries to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct FailedQuery {
    /// Only this topic's.
    topic: Option<String>,
    /// Only this subscriber's (its callback URL).
    subscriber: Option<String>,
    /// The most to list.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000, default = 100)]
    limit: Option<String>,
}

/// An exhausted delivery record.
#[derive(Debug, Serialize, ToSchema)]
struct FailedView {
    /// The event that was not delivered.
    event_id: Uuid,
    /// The event's topic.
    topic: String,
    /// The subscriber's callback URL.
    subscriber: String,
    /// When the event was recorded.
    created_at: DateTime<Utc>,
    /// How many attempts failed.
    attempts: u32,
    /// Why the last attempt failed.
    last_error: Option<String>,
}

/// Deliveries that ran out of retries, newest first.
#[utoipa::path(
    get,
    path = "/deliveries/failed",
    operation_id = "list_failed_deliveries",
    tag = "operator",
    params(FailedQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The failed deliveries.", body = [FailedView]),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
async fn failed(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<FailedQuery>,
) -> Result<Json<Vec<FailedView>>, ApiError> {
    authorize_operator(&state, &headers)?;
    let limit = backlog::parse_limit(query.limit.as_deref())?;
    let filter = FailedFilter {
        topic: query.topic.as_deref(),
        subscriber: query.subscriber.as_deref(),
        event_id: None,
    };
    let failed = state.events.failed(filter, limit).await?;
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
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RetryRequest {
    /// Only this topic's.
    topic: Option<String>,
    /// Only this subscriber's (its callback URL).
    subscriber: Option<String>,
}

/// How many failed records were re-opened.
#[derive(Debug, Serialize, ToSchema)]
struct RetryAnswer {
    /// How many failed records were re-opened.
    retried: u64,
}

/// Re-opens failed deliveries with a fresh retry budget.
///
/// The dispatcher is woken for them. No body, `null` or `{}` retries every
/// failed delivery.
#[utoipa::path(
    post,
    path = "/deliveries/retry",
    operation_id = "retry_failed_deliveries",
    tag = "operator",
    request_body(content = Option<RetryRequest>, description = "Which failed deliveries to \
        retry."),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "Re-opened.", body = RetryAnswer),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 413, description = "The body is larger than the hub accepts.", body = String,
            content_type = "text/plain"),
        (status = 503, response = Unavailable),
    ),
)]
async fn retry(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<RetryAnswer>, ApiError> {
    authorize_operator(&state, &headers)?;
    let request: RetryRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RetryRequest::default()
    } else {
        serde_json::from_slice::<Option<RetryRequest>>(&body)
            .map(Option::unwrap_or_default)
            .map_err(|error| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("expected a JSON object with optional topic and subscriber: {error}"),
                )
            })?
    };
    let filter = FailedFilter {
        topic: request.topic.as_deref(),
        subscriber: request.subscriber.as_deref(),
        event_id: None,
    };
    let retried = retry_failed(&state, filter).await?;
    Ok(Json(RetryAnswer { retried }))
}

/// Re-opens the failed deliveries `filter` matches and wakes the dispatcher
/// for them; how many were re-opened.
pub(crate) async fn retry_failed(
    state: &ApiState,
    filter: FailedFilter<'_>,
) -> Result<u64, ApiError> {
    let retried = state.events.retry_failed(filter, state.clock.now()).await?;
    if retried > 0 {
        state.dispatcher.wake();
    }
    Ok(retried)
}
