//! The backlog's views: the verifications of intent and the topic fetches
//! the hub has accepted and not yet done, or given up. The operator lists
//! every one (behind the internal key); a subscriber lists their own
//! verifications (by user token), to learn what became of a subscribe
//! answered 202.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiState, authorize_internal, caller};
use crate::backlog::{BacklogError, FetchState, IntentState, Listing};

/// The most rows one listing returns, whatever `limit` asks.
pub(super) const MAX_LISTED: usize = 1000;
/// How many rows a listing returns by default.
pub(super) const DEFAULT_LISTED: usize = 100;

/// A listing's query: `state=pending|failed` (both when absent) and `limit`.
#[derive(Debug, Deserialize)]
pub(super) struct BacklogQuery {
    state: Option<String>,
    limit: Option<String>,
}

impl BacklogQuery {
    fn failed(&self) -> Result<Option<bool>, ApiError> {
        match self.state.as_deref() {
            None => Ok(None),
            Some("pending") => Ok(Some(false)),
            Some("failed") => Ok(Some(true)),
            Some(other) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("state must be pending or failed, got {other:?}"),
            )),
        }
    }
}

/// The `limit` query parameter: a whole number from 1 to [`MAX_LISTED`].
pub(super) fn parse_limit(limit: Option<&str>) -> Result<usize, ApiError> {
    match limit {
        None => Ok(DEFAULT_LISTED),
        Some(text) => match text.parse::<usize>() {
            Ok(limit) if (1..=MAX_LISTED).contains(&limit) => Ok(limit),
            _ => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("limit must be a whole number from 1 to {MAX_LISTED}, got {text:?}"),
            )),
        },
    }
}

/// `pending` while it is due, `failed` once given up.
fn state_name(next_attempt_at: Option<DateTime<Utc>>) -> &'static str {
    if next_attempt_at.is_some() {
        "pending"
    } else {
        "failed"
    }
}

/// A verification of intent waiting or given up.
#[derive(Debug, Serialize)]
struct IntentView {
    mode: &'static str,
    topic: String,
    callback: String,
    owner: Option<String>,
    state: &'static str,
    requested_at: DateTime<Utc>,
    attempts: u32,
    next_attempt_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
}

impl From<IntentState> for IntentView {
    fn from(intent: IntentState) -> Self {
        Self {
            mode: intent.mode.as_str(),
            topic: intent.topic,
            callback: intent.callback,
            owner: intent.owner,
            state: state_name(intent.next_attempt_at),
            requested_at: intent.requested_at,
            attempts: intent.attempts,
            next_attempt_at: intent.next_attempt_at,
            last_error: intent.last_error,
        }
    }
}

/// A topic fetch waiting or given up.
#[derive(Debug, Serialize)]
struct FetchView {
    topic: String,
    state: &'static str,
    requested_at: DateTime<Utc>,
    attempts: u32,
    next_attempt_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
}

impl From<FetchState> for FetchView {
    fn from(fetch: FetchState) -> Self {
        Self {
            topic: fetch.topic,
            state: state_name(fetch.next_attempt_at),
            requested_at: fetch.requested_at,
            attempts: fetch.attempts,
            next_attempt_at: fetch.next_attempt_at,
            last_error: fetch.last_error,
        }
    }
}

fn backlog_unavailable(error: BacklogError) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the backlog failed: {error}"),
    )
}

async fn list_intents(
    state: &ApiState,
    query: &BacklogQuery,
    owner: Option<&str>,
) -> Result<Vec<IntentView>, ApiError> {
    let listing = Listing {
        failed: query.failed()?,
        owner,
    };
    let limit = parse_limit(query.limit.as_deref())?;
    let intents = state
        .subscriptions
        .backlog()
        .intents(listing, limit)
        .await
        .map_err(backlog_unavailable)?;
    Ok(intents.into_iter().map(IntentView::from).collect())
}

/// `GET /api/v1/operator/verifications`: every intent waiting or failed.
pub(super) async fn operator_intents(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<BacklogQuery>,
) -> Result<Response, ApiError> {
    authorize_internal(&state, &headers)?;
    Ok(Json(list_intents(&state, &query, None).await?).into_response())
}

/// `GET /api/v1/verifications`: the caller's own intents waiting or failed.
pub(super) async fn own_intents(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<BacklogQuery>,
) -> Response {
    let user = match caller(&state, &headers) {
        Ok(user) => user,
        Err(refusal) => return refusal.into_response(),
    };
    match list_intents(&state, &query, Some(&user.id)).await {
        Ok(listed) => Json(listed).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `GET /api/v1/operator/fetches`: every topic fetch waiting or failed.
pub(super) async fn fetches(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<BacklogQuery>,
) -> Result<Response, ApiError> {
    authorize_internal(&state, &headers)?;
    let listing = Listing {
        failed: query.failed()?,
        owner: None,
    };
    let limit = parse_limit(query.limit.as_deref())?;
    let fetches = state
        .intake
        .backlog()
        .fetches(listing, limit)
        .await
        .map_err(backlog_unavailable)?;
    Ok(Json(fetches.into_iter().map(FetchView::from).collect::<Vec<_>>()).into_response())
}
