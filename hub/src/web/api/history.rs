//! The operator's view of WebSub deliveries: lists of delivery records by
//! topic, subscriber, state and time at `GET /api/v1/operator/deliveries`,
//! and one record with the history of its attempts at
//! `GET /api/v1/operator/delivery?event_id=…&subscriber=…`.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::backlog::parse_limit;
use super::openapi::{BadRequest, NoInternalKey, Unavailable, WrongKey};
use super::{ApiError, ApiState, authorize_operator};
use crate::storage::events::{
    Attempt, DeliveryFilter, DeliveryRecord, DeliveryState, DeliverySummary,
};

/// Which delivery: both are required, and read after the key is checked so
/// that a request without it is refused as such.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct DeliveryQuery {
    /// The event's id.
    event_id: Option<String>,
    /// The subscriber: the subscription's callback URL (or an outbox
    /// webhook's name).
    subscriber: Option<String>,
}

impl DeliveryQuery {
    /// Both, as required: 400 when either is missing or the id is not a
    /// UUID.
    pub(super) fn required(&self) -> Result<(Uuid, &str), ApiError> {
        required(self.event_id.as_deref(), self.subscriber.as_deref())
    }
}

fn required<'a>(
    event_id: Option<&str>,
    subscriber: Option<&'a str>,
) -> Result<(Uuid, &'a str), ApiError> {
    let bad = |reason: &str| ApiError::new(StatusCode::BAD_REQUEST, reason.to_owned());
    let event_id = parse_event_id(event_id.ok_or_else(|| bad("event_id is required"))?)?;
    let subscriber = subscriber.ok_or_else(|| bad("subscriber is required"))?;
    Ok((event_id, subscriber))
}

/// One attempt, as kept.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct AttemptView {
    /// When it started.
    at: DateTime<Utc>,
    /// How long it took, in milliseconds.
    duration_ms: f64,
    /// The answer's status; absent when none came (refused, timed out).
    status: Option<u16>,
    /// Why it failed, as the delivery recorded it; absent when delivered.
    error: Option<String>,
    /// The first KiB of the answer's body, as UTF-8 (invalid bytes
    /// replaced).
    response: String,
}

impl From<Attempt> for AttemptView {
    fn from(attempt: Attempt) -> Self {
        Self {
            at: attempt.at,
            duration_ms: attempt.duration_micros as f64 / 1000.0,
            status: attempt.status,
            error: attempt.error,
            response: String::from_utf8_lossy(&attempt.response).into_owned(),
        }
    }
}

/// One delivery with its attempts, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct DeliveryView {
    event_id: Uuid,
    /// The subscription's callback URL.
    subscriber: String,
    state: DeliveryState,
    /// Failed attempts counted against the retry limit.
    retry_count: u32,
    /// The last failure, kept after a later success.
    last_error: Option<String>,
    /// When it was delivered or dropped.
    processed_at: Option<DateTime<Utc>>,
    /// When it is due again, while pending.
    next_attempt_at: Option<DateTime<Utc>>,
    attempts: Vec<AttemptView>,
}

/// One WebSub delivery and every attempt it took.
#[utoipa::path(
    get,
    path = "/delivery",
    operation_id = "show_delivery",
    tag = "operator",
    params(DeliveryQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The delivery and its attempts, oldest first.",
            body = DeliveryView),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 404, description = "The event has no delivery to this subscriber.",
            content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn delivery(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<DeliveryQuery>,
) -> Result<Json<DeliveryView>, ApiError> {
    authorize_operator(&state, &headers)?;
    let (record, attempts) = find(
        &state,
        query.event_id.as_deref(),
        query.subscriber.as_deref(),
    )
    .await?;
    Ok(Json(view(record, attempts)))
}

/// The delivery of event `event_id` (as given, parsed here) to
/// `subscriber`, with its attempts: 400 when either is missing or the id is
/// not a UUID, 404 when the event has no such delivery.
pub(crate) async fn find(
    state: &ApiState,
    event_id: Option<&str>,
    subscriber: Option<&str>,
) -> Result<(DeliveryRecord, Vec<Attempt>), ApiError> {
    let (event_id, subscriber) = required(event_id, subscriber)?;
    let record = state
        .events
        .delivery(event_id, subscriber)
        .await?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("event {event_id} has no delivery to {subscriber}"),
            )
        })?;
    let attempts = state.events.attempts(event_id, subscriber).await?;
    Ok((record, attempts))
}

fn view(record: DeliveryRecord, attempts: Vec<Attempt>) -> DeliveryView {
    DeliveryView {
        event_id: record.event_id,
        subscriber: record.subscriber,
        state: record.state,
        retry_count: record.retry_count,
        last_error: record.last_error,
        processed_at: record.processed_at,
        next_attempt_at: record.next_attempt_at,
        attempts: attempts.into_iter().map(AttemptView::from).collect(),
    }
}

/// Which delivery records to list; every filter is optional, and read after
/// the key is checked.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ListQuery {
    /// Records of this event and of its redeliveries.
    event_id: Option<String>,
    /// Records of this topic's events.
    topic: Option<String>,
    /// Records of this subscriber (a callback URL).
    subscriber: Option<String>,
    /// `pending`, `delivered`, `dropped`, `failed` or `skipped`.
    state: Option<String>,
    /// Events recorded at or after this time (RFC 3339).
    since: Option<String>,
    /// Events recorded before this time (RFC 3339).
    until: Option<String>,
    /// At most this many (1 to 1000; 100 when absent).
    limit: Option<String>,
}

/// Delivery records, newest event first.
#[utoipa::path(
    get,
    path = "/deliveries",
    operation_id = "list_deliveries",
    tag = "operator",
    params(ListQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The matching delivery records.", body = [DeliverySummary]),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn deliveries(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Result<Json<Vec<DeliverySummary>>, ApiError> {
    authorize_operator(&state, &headers)?;
    let event_id = query.event_id.as_deref().map(parse_event_id).transpose()?;
    let window = Window::parse(
        query.state.as_deref(),
        query.since.as_deref(),
        query.until.as_deref(),
        query.limit.as_deref(),
    )?;
    let filter = DeliveryFilter {
        event_id,
        topic: query.topic.as_deref(),
        subscriber: query.subscriber.as_deref(),
        state: window.state,
        since: window.since,
        until: window.until,
    };
    let listed = state.events.list(filter, window.limit).await?;
    Ok(Json(listed))
}

/// What every list of deliveries is narrowed by besides whose: the
/// `state`, `since`, `until` and `limit` parameters, parsed.
pub(super) struct Window {
    pub(super) state: Option<DeliveryState>,
    pub(super) since: Option<DateTime<Utc>>,
    pub(super) until: Option<DateTime<Utc>>,
    pub(super) limit: usize,
}

impl Window {
    pub(super) fn parse(
        state: Option<&str>,
        since: Option<&str>,
        until: Option<&str>,
        limit: Option<&str>,
    ) -> Result<Self, ApiError> {
        Ok(Self {
            state: parse_state(state)?,
            since: parse_time("since", since)?,
            until: parse_time("until", until)?,
            limit: parse_limit(limit)?,
        })
    }
}

pub(super) fn parse_event_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::try_parse(text).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("event_id {text:?} is not a UUID"),
        )
    })
}

/// The `state` parameter, as [`DeliveryState`] spells it.
pub(crate) fn parse_state(text: Option<&str>) -> Result<Option<DeliveryState>, ApiError> {
    text.map(|text| {
        DeliveryState::parse(text).ok_or_else(|| {
            let known: Vec<&str> = DeliveryState::ALL.iter().map(|s| s.as_str()).collect();
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("state must be one of {}, got {text:?}", known.join(", ")),
            )
        })
    })
    .transpose()
}

/// A time parameter: RFC 3339, e.g. `2026-12-01T10:00:00Z`.
pub(crate) fn parse_time(
    name: &str,
    text: Option<&str>,
) -> Result<Option<DateTime<Utc>>, ApiError> {
    text.map(|text| {
        DateTime::parse_from_rfc3339(text)
            .map(|time| time.with_timezone(&Utc))
            .map_err(|error| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("{name} must be an RFC 3339 time such as 2026-12-01T10:00:00Z, got {text:?}: {error}"),
                )
            })
    })
    .transpose()
}
