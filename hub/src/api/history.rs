//! The operator's view of one WebSub delivery: its record and the history
//! of its attempts, at `GET /api/v1/operator/delivery?event_id=…&subscriber=…`.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::openapi::{BadRequest, NoInternalKey, Unavailable, WrongKey};
use super::operator::events_failed;
use super::{ApiError, ApiState, authorize_internal};
use crate::events::{Attempt, DeliveryRecord};

/// Which delivery: both are required, and read after the key is checked so
/// that a request without it is refused as such.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct DeliveryQuery {
    /// The event's id.
    event_id: Option<String>,
    /// The subscriber: the subscription's callback URL.
    subscriber: Option<String>,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DeliveryState {
    /// Due, retrying or in flight.
    Pending,
    /// The subscriber answered 2xx.
    Delivered,
    /// Closed without a delivery: the subscription went away (a 410, an
    /// expired lease, an unsubscribe).
    Dropped,
    /// Out of retries; an operator may retry it.
    Failed,
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
    authorize_internal(&state, &headers)?;
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
    let bad = |reason: &str| ApiError::new(StatusCode::BAD_REQUEST, reason.to_owned());
    let event_id = event_id.ok_or_else(|| bad("event_id is required"))?;
    let event_id = Uuid::try_parse(event_id)
        .map_err(|_| bad(&format!("event_id {event_id:?} is not a UUID")))?;
    let subscriber = subscriber.ok_or_else(|| bad("subscriber is required"))?;
    let record = state
        .events
        .delivery(event_id, subscriber)
        .await
        .map_err(events_failed)?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("event {event_id} has no delivery to {subscriber}"),
            )
        })?;
    let attempts = state
        .events
        .attempts(event_id, subscriber)
        .await
        .map_err(events_failed)?;
    Ok((record, attempts))
}

impl DeliveryState {
    /// Where `record` stands, with its `attempts` telling a delivery from a
    /// drop (both are processed).
    pub(crate) fn of(record: &DeliveryRecord, attempts: &[Attempt]) -> Self {
        let delivered_last = attempts.last().is_some_and(|last| last.error.is_none());
        match (record.processed_at, record.next_attempt_at) {
            (Some(_), _) if delivered_last => Self::Delivered,
            (Some(_), _) => Self::Dropped,
            (None, None) => Self::Failed,
            (None, Some(_)) => Self::Pending,
        }
    }

    /// Its name, as the JSON spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Dropped => "dropped",
            Self::Failed => "failed",
        }
    }
}

fn view(record: DeliveryRecord, attempts: Vec<Attempt>) -> DeliveryView {
    let state = DeliveryState::of(&record, &attempts);
    DeliveryView {
        event_id: record.event_id,
        subscriber: record.subscriber,
        state,
        retry_count: record.retry_count,
        last_error: record.last_error,
        processed_at: record.processed_at,
        next_attempt_at: record.next_attempt_at,
        attempts: attempts
            .into_iter()
            .map(|attempt| AttemptView {
                at: attempt.at,
                duration_ms: attempt.duration_micros as f64 / 1000.0,
                status: attempt.status,
                error: attempt.error,
                response: String::from_utf8_lossy(&attempt.response).into_owned(),
            })
            .collect(),
    }
}
