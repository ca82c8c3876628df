//! Retention of the hub's own event log on demand, at
//! `POST /api/v1/operator/purge` with `{"older_than_seconds": N}`: the
//! events recorded more than N seconds ago are deleted with their delivery
//! records, as the hub's retention sweep does on its schedule. N is a whole
//! number of seconds from 1 to 50 years' worth; anything else is refused
//! with 400 rather than read as "everything" or "nothing".

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::openapi::{BadRequest, NoInternalKey, Unavailable, WrongKey};
use super::{ApiError, ApiState, authorize_operator};

/// The longest age a purge accepts: 50 years, in seconds. Longer is a
/// mistake (a unit confused), not a retention policy.
const MAX_OLDER_THAN_SECONDS: i64 = 50 * 365 * 24 * 3600;

/// What to purge.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PurgeRequest {
    /// Delete the events recorded longer ago than this many seconds.
    #[schema(minimum = 1, maximum = 1576800000)]
    older_than_seconds: i64,
}

/// What was purged.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct PurgeAnswer {
    /// How many events were deleted (their delivery records with them).
    deleted: u64,
    /// The events recorded before this instant were deleted.
    cutoff: DateTime<Utc>,
}

/// The age asked for, checked: whole seconds from 1 to
/// [`MAX_OLDER_THAN_SECONDS`].
fn older_than(body: &[u8]) -> Result<TimeDelta, ApiError> {
    let bad = |reason: String| ApiError::new(StatusCode::BAD_REQUEST, reason);
    let request: PurgeRequest = serde_json::from_slice(body).map_err(|error| {
        bad(format!(
            "expected a JSON object {{\"older_than_seconds\": N}}: {error}"
        ))
    })?;
    let seconds = request.older_than_seconds;
    if !(1..=MAX_OLDER_THAN_SECONDS).contains(&seconds) {
        return Err(bad(format!(
            "older_than_seconds must be from 1 to {MAX_OLDER_THAN_SECONDS} (50 years), got \
             {seconds}"
        )));
    }
    Ok(TimeDelta::seconds(seconds))
}

/// Deletes the events recorded longer ago than `older_than_seconds`, with
/// their delivery records.
///
/// Deliveries of those events still pending are dropped.
#[utoipa::path(
    post,
    path = "/purge",
    operation_id = "purge_events",
    tag = "operator",
    request_body(content = PurgeRequest, description = "How old an event must be to go."),
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "Purged.", body = PurgeAnswer),
        (status = 400, response = BadRequest),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
        (status = 413, description = "The body is larger than the hub accepts.", body = String,
            content_type = "text/plain"),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn purge(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<PurgeAnswer>, ApiError> {
    authorize_operator(&state, &headers)?;
    let cutoff = state.clock.now() - older_than(&body)?;
    let deleted = state.events.purge_before(cutoff).await?;
    tracing::info!(deleted, %cutoff, "event log purged on request");
    Ok(Json(PurgeAnswer { deleted, cutoff }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bounds `#[schema(...)]` documents, written as literals because
    /// the attribute takes no constants, are the ones enforced.
    #[test]
    fn the_documented_bounds_are_the_enforced_ones() {
        let schema = serde_json::to_value(<PurgeRequest as utoipa::PartialSchema>::schema())
            .expect("the schema serialises");
        let seconds = &schema["properties"]["older_than_seconds"];
        assert_eq!(seconds["minimum"], 1, "{schema}");
        assert_eq!(seconds["maximum"], MAX_OLDER_THAN_SECONDS, "{schema}");
    }

    #[test]
    fn only_a_sensible_age_is_accepted() {
        assert_eq!(
            older_than(br#"{"older_than_seconds": 86400}"#).ok(),
            Some(TimeDelta::days(1))
        );
        assert!(
            older_than(format!(r#"{{"older_than_seconds": {MAX_OLDER_THAN_SECONDS}}}"#).as_bytes())
                .is_ok()
        );
        for refused in [
            &br#"{"older_than_seconds": 0}"#[..],
            br#"{"older_than_seconds": -5}"#,
            br#"{"older_than_seconds": 1.5}"#,
            br#"{"older_than_seconds": "30d"}"#,
            br#"{"older_than_seconds": 9999999999999}"#,
            br#"{"older_than": 10}"#,
            b"",
            b"null",
        ] {
            assert!(
                older_than(refused).is_err(),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }
}
