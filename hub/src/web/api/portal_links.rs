//! Links into the subscriber portal, issued by operators at
//! `POST /api/v1/operator/portal-links`: a URL that lets one subscriber
//! into its own portal pages until it expires ([`crate::web::portal`]).

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::openapi::{ApiRoutes, BadRequest, NoInternalKey, WrongKey};
use super::redeliver::json_body;
use super::{ApiError, ApiState, authorize_operator};
use crate::web::portal::{MAX_LINK_LIFETIME, issue};

/// The operator API's route for portal links.
pub(super) fn routes() -> ApiRoutes {
    ApiRoutes::new().route(utoipa_axum::routes!(create))
}

/// Whom the link is for, and for how long.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewLink {
    /// The subscriber: the `sub` of its user tokens, the owner of its
    /// subscriptions.
    subscriber: String,
    /// How long the link lets it in, in seconds (an hour when absent, a
    /// week at most).
    ttl_seconds: Option<i64>,
}

/// A link into the portal.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct PortalLink {
    /// Open it in a browser: it signs the subscriber in.
    url: String,
    /// When it stops working.
    expires_at: DateTime<Utc>,
}

/// Issues a link that lets one subscriber into its portal pages, signed
/// with the user token key and expiring.
#[utoipa::path(
    post,
    path = "/portal-links",
    operation_id = "create_portal_link",
    tag = "operator",
    request_body(content = NewLink, description = "The subscriber and how long."),
    security(("internal_api_key" = [])),
    responses(
        (status = 201, description = "The link.", body = PortalLink),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 404, description = "This hub has no user token key, so no portal.",
            content_type = "text/plain", body = String),
    ),
)]
pub(super) async fn create(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<PortalLink>), ApiError> {
    authorize_operator(&state, &headers)?;
    let request: NewLink = json_body(&body, r#"{"subscriber": …, "ttl_seconds": n}"#)?;
    let Some(tokens) = &state.user_tokens else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "this hub has no user token key, so it has no subscriber portal",
        ));
    };
    if request.subscriber.is_empty() || request.subscriber.len() > 256 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "subscriber must be 1 to 256 bytes",
        ));
    }
    let ttl = chrono::TimeDelta::seconds(request.ttl_seconds.unwrap_or(3600));
    if ttl <= chrono::TimeDelta::zero() || ttl > MAX_LINK_LIFETIME {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "ttl_seconds must be between 1 and 604800 (a week)",
        ));
    }
    let expires_at = state.clock.now() + ttl;
    let value = issue(tokens, &request.subscriber, expires_at);
    tracing::info!(subscriber = %request.subscriber, %expires_at, "portal link issued");
    let query = serde_urlencoded::to_string([("link", value.as_str())]).unwrap_or_default();
    Ok((
        StatusCode::CREATED,
        Json(PortalLink {
            url: format!("{}portal/enter?{query}", state.public_url),
            expires_at,
        }),
    ))
}
