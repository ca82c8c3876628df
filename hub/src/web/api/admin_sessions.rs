//! The admin page's sessions, for operators: listed at
//! `GET /api/v1/operator/admin-sessions`, ended one by one
//! (`DELETE …/admin-sessions/{id}`) or all at once
//! (`DELETE …/admin-sessions`). The sessions themselves are kept by
//! [`crate::storage::events::AdminSessions`].

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Serialize;
use utoipa::ToSchema;

use super::openapi::{ApiRoutes, NoInternalKey, Unavailable, WrongKey};
use super::{ApiError, ApiState, authorize_operator};
use crate::storage::events::AdminSession;

/// The operator API's routes for admin sessions.
pub(super) fn routes() -> ApiRoutes {
    use utoipa_axum::routes;
    ApiRoutes::new()
        .route(routes!(list, end_all))
        .route(routes!(end))
}

/// Every admin session that has not ended, newest first.
#[utoipa::path(
    get,
    path = "/admin-sessions",
    operation_id = "list_admin_sessions",
    tag = "operator",
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The live sessions.", body = [AdminSession]),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn list(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Json<Vec<AdminSession>>, ApiError> {
    authorize_operator(&state, &headers)?;
    Ok(Json(state.events.sessions(state.clock.now()).await?))
}

/// How many sessions were ended.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Ended {
    ended: u64,
}

/// Ends every admin session: each browser must log in again.
#[utoipa::path(
    delete,
    path = "/admin-sessions",
    operation_id = "end_admin_sessions",
    tag = "operator",
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "Every session ended.", body = Ended),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn end_all(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Json<Ended>, ApiError> {
    authorize_operator(&state, &headers)?;
    let ended = state.events.end_sessions().await?;
    tracing::info!(ended, "admin sessions ended by an operator");
    Ok(Json(Ended { ended }))
}

/// Ends one admin session: its browser must log in again.
#[utoipa::path(
    delete,
    path = "/admin-sessions/{id}",
    operation_id = "end_admin_session",
    tag = "operator",
    params(("id" = String, Path, description = "The session's id, as listed.")),
    security(("internal_api_key" = [])),
    responses(
        (status = 204, description = "Ended."),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 404, description = "No live session has this id.",
            content_type = "text/plain", body = String),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn end(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    authorize_operator(&state, &headers)?;
    if state.events.end_session(&id).await? {
        tracing::info!(session = %id, "admin session ended by an operator");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no admin session has the id {id:?}"),
        ))
    }
}
