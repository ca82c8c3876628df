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
use utoipa::{IntoParams, ToSchema};

use super::openapi::{
    BadRequest, NoInternalKey, NoSubscriberApi, TokenTooLarge, Unauthenticated, Unavailable,
    WrongKey,
};
use super::{ApiError, ApiState, authorize_operator, caller};
use crate::protocol::Mode;
use crate::storage::backlog::{FetchState, IntentState, Listing};

/// The most rows one listing returns, whatever `limit` asks.
pub(super) const MAX_LISTED: usize = 1000;
/// How many rows a listing returns by default.
pub(super) const DEFAULT_LISTED: usize = 100;

/// A listing's query: `state=pending|failed` (both when absent) and `limit`.
// Both are read as text, so that a bad value gets this API's plain-text
// reason rather than the extractor's.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct BacklogQuery {
    /// Only those still due, or only those given up; both when absent.
    #[param(inline, value_type = Option<ListedState>)]
    state: Option<String>,
    /// The most to list.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000, default = 100)]
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

/// Where a listed request stands: `pending` while it is due, `failed` once
/// given up.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum ListedState {
    Pending,
    Failed,
}

impl ListedState {
    fn of(next_attempt_at: Option<DateTime<Utc>>) -> Self {
        if next_attempt_at.is_some() {
            Self::Pending
        } else {
            Self::Failed
        }
    }
}

/// What a verification of intent is for: the `hub.mode` requested.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum IntentMode {
    Subscribe,
    Unsubscribe,
}

impl From<Mode> for IntentMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Subscribe => Self::Subscribe,
            Mode::Unsubscribe => Self::Unsubscribe,
        }
    }
}

/// A verification of intent waiting or given up.
#[derive(Debug, Serialize, ToSchema)]
struct IntentView {
    mode: IntentMode,
    /// The topic URL.
    topic: String,
    /// The callback URL verified.
    callback: String,
    /// The user who asked, when the request carried a user token.
    owner: Option<String>,
    state: ListedState,
    /// When the request was accepted.
    requested_at: DateTime<Utc>,
    /// How many verification attempts failed so far.
    attempts: u32,
    /// When the next attempt is due; `null` once given up.
    next_attempt_at: Option<DateTime<Utc>>,
    /// Why the latest attempt failed.
    last_error: Option<String>,
}

impl From<IntentState> for IntentView {
    fn from(intent: IntentState) -> Self {
        Self {
            mode: intent.mode.into(),
            topic: intent.topic,
            callback: intent.callback,
            owner: intent.owner,
            state: ListedState::of(intent.next_attempt_at),
            requested_at: intent.requested_at,
            attempts: intent.attempts,
            next_attempt_at: intent.next_attempt_at,
            last_error: intent.last_error,
        }
    }
}

/// A topic fetch waiting or given up.
#[derive(Debug, Serialize, ToSchema)]
struct FetchView {
    /// The topic URL to fetch.
    topic: String,
    state: ListedState,
    /// When the publish ping asking for it was accepted.
    requested_at: DateTime<Utc>,
    /// How many fetch attempts failed so far.
    attempts: u32,
    /// When the next attempt is due; `null` once given up.
    next_attempt_at: Option<DateTime<Utc>>,
    /// Why the latest attempt failed.
    last_error: Option<String>,
}

impl From<FetchState> for FetchView {
    fn from(fetch: FetchState) -> Self {
        Self {
            topic: fetch.topic,
            state: ListedState::of(fetch.next_attempt_at),
            requested_at: fetch.requested_at,
            attempts: fetch.attempts,
            next_attempt_at: fetch.next_attempt_at,
            last_error: fetch.last_error,
        }
    }
}

async fn list_intents(
    state: &ApiState,
    query: &BacklogQuery,
    owner: Option<&str>,
) -> Result<Vec<IntentView>, ApiError> {
    let listing = Listing {
        failed: query.failed()?,
        owner,
        search: None,
    };
    let limit = parse_limit(query.limit.as_deref())?;
    let intents = state
        .subscriptions
        .backlog()
        .intents(listing, limit)
        .await?;
    Ok(intents.into_iter().map(IntentView::from).collect())
}

/// Every verification of intent waiting or given up, newest first.
#[utoipa::path(
    get,
    path = "/verifications",
    operation_id = "list_verifications",
    tag = "operator",
    params(BacklogQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The verifications.", body = [IntentView]),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn operator_intents(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<BacklogQuery>,
) -> Result<Response, ApiError> {
    authorize_operator(&state, &headers)?;
    Ok(Json(list_intents(&state, &query, None).await?).into_response())
}

/// The caller's verifications of intent waiting or given up, newest first.
///
/// What became of a subscribe or unsubscribe answered 202.
#[utoipa::path(
    get,
    path = "/verifications",
    operation_id = "own_verifications",
    tag = "subscriber",
    params(BacklogQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The caller's verifications.", body = [IntentView]),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 404, response = NoSubscriberApi),
        (status = 431, response = TokenTooLarge),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn own_intents(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<BacklogQuery>,
) -> Result<Response, ApiError> {
    let user = caller(&state, &headers)?;
    Ok(Json(list_intents(&state, &query, Some(&user.id)).await?).into_response())
}

/// Every topic fetch waiting or given up, newest first.
///
/// A fetch is what a publish ping asked for: the hub fetches the topic's
/// content and records it as an event.
#[utoipa::path(
    get,
    path = "/fetches",
    operation_id = "list_fetches",
    tag = "operator",
    params(BacklogQuery),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The topic fetches.", body = [FetchView]),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn fetches(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<BacklogQuery>,
) -> Result<Response, ApiError> {
    authorize_operator(&state, &headers)?;
    let listing = Listing {
        failed: query.failed()?,
        owner: None,
        search: None,
    };
    let limit = parse_limit(query.limit.as_deref())?;
    let fetches = state.intake.backlog().fetches(listing, limit).await?;
    Ok(Json(fetches.into_iter().map(FetchView::from).collect::<Vec<_>>()).into_response())
}

#[cfg(test)]
mod tests {
    use utoipa::IntoParams;
    use utoipa::openapi::path::Parameter;

    use super::*;
    use crate::web::api::operator::FailedQuery;

    /// The bounds `#[param(...)]` documents, written as literals because
    /// the attribute takes no constants, are the ones enforced.
    #[test]
    fn the_documented_limit_is_the_enforced_one() {
        for parameters in [
            BacklogQuery::into_params(|| None),
            FailedQuery::into_params(|| None),
        ] {
            let limit = parameters
                .iter()
                .find(|parameter| parameter.name == "limit")
                .map(|parameter: &Parameter| serde_json::to_value(&parameter.schema))
                .and_then(Result::ok)
                .unwrap_or_default();
            assert_eq!(limit["minimum"], 1, "{limit}");
            assert_eq!(limit["maximum"], MAX_LISTED, "{limit}");
            assert_eq!(limit["default"], DEFAULT_LISTED, "{limit}");
            assert!(parse_limit(Some(&MAX_LISTED.to_string())).is_ok());
            assert!(parse_limit(Some(&(MAX_LISTED + 1).to_string())).is_err());
            assert!(parse_limit(Some("0")).is_err());
            assert!(matches!(parse_limit(None), Ok(DEFAULT_LISTED)));
        }
    }
}
