//! Sending events again, behind the internal key: `POST
//! /api/v1/operator/redeliver` sends one event again to one subscription or
//! to every subscription of its topic, and `POST /api/v1/operator/replay`
//! sends a topic's events since a time again to one subscription. Each is a
//! redelivery in the log (a new delivery record per subscriber), so the
//! records of earlier rounds keep their history.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;
use websub_store::StoreError;

use super::history::{parse_event_id, parse_time};
use super::openapi::{BadRequest, NoInternalKey, Unavailable, WrongKey};
use super::{ApiError, ApiState, authorize_operator};
use crate::storage::events::{LoggedEvent, REPLAY_LIMIT, Replayed};

/// A JSON request body, read after the key is checked.
pub(super) fn json_body<T: DeserializeOwned>(body: &[u8], expected: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|error| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("expected {expected}: {error}"),
        )
    })
}

/// Which event to send again, and to whom.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RedeliverRequest {
    /// The event (an original, or a redelivery of one).
    event_id: String,
    /// One subscription of the event's topic (its callback URL); absent:
    /// every subscription the topic has now, except disabled endpoints.
    subscriber: Option<String>,
}

/// The redelivery recorded.
#[derive(Debug, Serialize, ToSchema)]
struct RedeliverAnswer {
    /// The redelivery's own id: list or show its records by it.
    redelivery: Uuid,
    /// The event sent again; subscribers receive this id.
    event_id: Uuid,
    /// Who it goes to.
    subscribers: Vec<String>,
    /// Subscriptions left out because their endpoint is disabled.
    disabled: Vec<String>,
}

/// Sends an event again: to one subscription, or to all of its topic's.
///
/// A new delivery record per subscriber, due now; the earlier records stay
/// as they are.
#[utoipa::path(
    post,
    path = "/redeliver",
    operation_id = "redeliver_event",
    tag = "operator",
    request_body(content = RedeliverRequest, description = "The event, and optionally one \
        subscriber."),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "Recorded; the dispatcher is woken.", body = RedeliverAnswer),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 404, description = "No such event (never recorded, or purged), or no such \
            subscription of its topic.", content_type = "text/plain", body = String),
        (status = 409, description = "The subscriber's endpoint is disabled, or the topic has \
            no subscription to send to.", content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
async fn redeliver(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<RedeliverAnswer>, ApiError> {
    authorize_operator(&state, &headers)?;
    let request: RedeliverRequest = json_body(
        &body,
        "a JSON object with event_id and optionally subscriber",
    )?;
    let event_id = parse_event_id(&request.event_id)?;
    let event = event_in_log(&state, event_id).await?;
    let endpoints = state.dispatcher.endpoints();
    let (subscribers, disabled) = match request.subscriber {
        Some(subscriber) => {
            subscription_of(&state, &event.topic, &subscriber).await?;
            (vec![subscriber], Vec::new())
        }
        None => {
            let subscriptions = state.store.list_by_topic(&event.topic).await?;
            subscriptions
                .into_iter()
                .map(|subscription| subscription.callback)
                .partition(|callback| !endpoints.is_disabled(callback))
        }
    };
    if subscribers.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "topic {} has no subscription to send event {event_id} to ({} disabled)",
                event.topic,
                disabled.len()
            ),
        ));
    }
    let targets: Vec<&str> = subscribers.iter().map(String::as_str).collect();
    let redelivery = record_redelivery(&state, event_id, &targets).await?;
    Ok(Json(RedeliverAnswer {
        redelivery,
        event_id: event.delivered_id(),
        subscribers,
        disabled,
    }))
}

/// The event `event_id`: 404 when the log does not hold it.
pub(crate) async fn event_in_log(
    state: &ApiState,
    event_id: Uuid,
) -> Result<LoggedEvent, ApiError> {
    state.events.event(event_id).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no event {event_id} in the log (never recorded, or purged)"),
        )
    })
}

/// Records a redelivery of `event_id` to `subscribers` (checked already)
/// and wakes the dispatcher for it; the redelivery's id.
pub(crate) async fn record_redelivery(
    state: &ApiState,
    event_id: Uuid,
    subscribers: &[&str],
) -> Result<Uuid, ApiError> {
    let redelivery = state
        .events
        .redeliver(event_id, subscribers, state.clock.now())
        .await?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("event {event_id} was purged meanwhile"),
            )
        })?;
    state.dispatcher.wake();
    Ok(redelivery)
}

/// Checks that `callback` holds a subscription to `topic` whose endpoint is
/// enabled.
pub(crate) async fn subscription_of(
    state: &ApiState,
    topic: &str,
    callback: &str,
) -> Result<(), ApiError> {
    match state.store.get(topic, callback).await {
        Ok(_) => {}
        Err(StoreError::UnknownSubscription { .. }) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("topic {topic} has no subscription with callback {callback}"),
            ));
        }
        Err(error) => return Err(ApiError::from(error)),
    }
    if state.dispatcher.endpoints().is_disabled(callback) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("endpoint {callback} is disabled; enable it before sending to it"),
        ));
    }
    Ok(())
}

/// Which events to send again, and to whom.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    /// The topic.
    topic: String,
    /// The subscription's callback URL.
    subscriber: String,
    /// Events recorded at or after this time (RFC 3339).
    since: String,
    /// At most this many events (1 to 10 000; 10 000 when absent).
    limit: Option<usize>,
}

/// What the replay recorded.
#[derive(Debug, Serialize, ToSchema)]
struct ReplayAnswer {
    /// How many events are sent again.
    replayed: usize,
    /// The redeliveries' ids, oldest event first.
    redeliveries: Vec<Uuid>,
    /// When more events follow than one request replays: the time to
    /// replay from next.
    resume_since: Option<DateTime<Utc>>,
}

/// Sends a topic's events since a time again to one subscription.
///
/// At most 10 000 events per request, oldest first; `resume_since` says
/// where to go on. Events past the hub's retention are gone, and a `since`
/// before it is refused.
#[utoipa::path(
    post,
    path = "/replay",
    operation_id = "replay_topic",
    tag = "operator",
    request_body(content = ReplayRequest, description = "The topic, the subscription and the \
        time to replay from."),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "Recorded; the dispatcher is woken.", body = ReplayAnswer),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 404, description = "No such subscription.", content_type = "text/plain",
            body = String),
        (status = 409, description = "The subscriber's endpoint is disabled.",
            content_type = "text/plain", body = String),
        (status = 410, description = "`since` is past the hub's retention: those events are \
            purged.", content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
async fn replay(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<ReplayAnswer>, ApiError> {
    authorize_operator(&state, &headers)?;
    let request: ReplayRequest = json_body(
        &body,
        "a JSON object with topic, subscriber, since and optionally limit",
    )?;
    let since = parse_time("since", Some(&request.since))?.unwrap_or_default();
    let limit = replay_limit(request.limit)?;
    let replayed = replay_since(&state, &request.topic, &request.subscriber, since, limit).await?;
    Ok(Json(ReplayAnswer {
        replayed: replayed.redeliveries.len(),
        redeliveries: replayed.redeliveries,
        resume_since: replayed.resume_since,
    }))
}

/// Sends `topic`'s events since `since` again to `subscriber`, at most
/// `limit` of them, once the subscription is checked and `since` is within
/// the hub's retention (410 when not); wakes the dispatcher for them.
pub(crate) async fn replay_since(
    state: &ApiState,
    topic: &str,
    subscriber: &str,
    since: DateTime<Utc>,
    limit: usize,
) -> Result<Replayed, ApiError> {
    let now = state.clock.now();
    if let Some(retention) = state.retention
        && let Ok(retention) = chrono::Duration::from_std(retention)
        && since < now - retention
    {
        let format = |time: DateTime<Utc>| time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        return Err(ApiError::new(
            StatusCode::GONE,
            format!(
                "since {} is past the hub's retention of {}: events recorded before {} are \
                 purged; replay from a later time",
                format(since),
                crate::config::text::format_duration(state.retention.unwrap_or_default()),
                format(now - retention),
            ),
        ));
    }
    subscription_of(state, topic, subscriber).await?;
    let replayed = state
        .events
        .replay(topic, subscriber, since, limit, now)
        .await?;
    if !replayed.redeliveries.is_empty() {
        state.dispatcher.wake();
    }
    Ok(replayed)
}

pub(super) fn routes() -> super::openapi::ApiRoutes {
    super::openapi::ApiRoutes::new()
        .route(utoipa_axum::routes!(redeliver))
        .route(utoipa_axum::routes!(replay))
        .route(utoipa_axum::routes!(webhook_replay))
}

/// Which outbox webhook rows to send again.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct WebhookReplayRequest {
    /// The webhook's name.
    subscriber: String,
    /// Its rows of events recorded at or after this time (RFC 3339).
    since: Option<String>,
    /// Or its row of this one event.
    event_id: Option<String>,
    /// At most this many rows per feed (1 to 10 000; 10 000 when absent).
    limit: Option<usize>,
}

/// How many rows were re-opened.
#[derive(Debug, Serialize, ToSchema)]
struct WebhookReplayAnswer {
    /// Rows re-opened, over every feed.
    reopened: u64,
}

/// Sends an outbox webhook's events again: its rows of one event, or of the
/// events since a time, re-opened due now with a fresh retry budget.
///
/// The rows are the producer's (one per event and webhook), so a webhook's
/// rounds are told apart by its attempts, which the hub keeps
/// (`GET /webhooks/attempts`). Rows in flight are left alone.
#[utoipa::path(
    post,
    path = "/webhooks/replay",
    operation_id = "replay_webhook",
    tag = "operator",
    request_body(content = WebhookReplayRequest, description = "The webhook, and since when \
        or which event."),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "Re-opened; the feeds' dispatchers are woken.",
            body = WebhookReplayAnswer),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
async fn webhook_replay(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<WebhookReplayAnswer>, ApiError> {
    authorize_operator(&state, &headers)?;
    let request: WebhookReplayRequest = json_body(
        &body,
        "a JSON object with subscriber, and since or event_id",
    )?;
    let since = parse_time("since", request.since.as_deref())?;
    let event_id = request
        .event_id
        .as_deref()
        .map(parse_event_id)
        .transpose()?;
    if since.is_none() == event_id.is_none() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "give one of since and event_id",
        ));
    }
    let limit = replay_limit(request.limit)?;
    let reopened = state
        .feeds
        .resend(request.subscriber.trim(), since, event_id, limit)
        .await
        .map_err(ApiError::producer_failed)?;
    Ok(Json(WebhookReplayAnswer { reopened }))
}

/// A replay's `limit`: 1 to [`REPLAY_LIMIT`], that when absent.
fn replay_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(REPLAY_LIMIT);
    if (1..=REPLAY_LIMIT).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("limit must be from 1 to {REPLAY_LIMIT}, got {limit}"),
        ))
    }
}
