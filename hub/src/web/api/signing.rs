//! How a subscriber's deliveries are signed, set through the subscriber
//! API at `PUT /api/v1/subscriptions/signing`: the scheme (WebSub's
//! `X-Hub-Signature`, or Standard Webhooks), and a new secret with an
//! overlap during which the old one signs too (under Standard Webhooks; the
//! single `X-Hub-Signature` carries the new one's). Kept by
//! [`crate::storage::events::SubscriptionSigning`], in force at once on
//! this replica and within seconds on the others.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::openapi::{BadRequest, TokenTooLarge, Unauthenticated, Unavailable};
use super::subscription::{SubscriptionQuery, find_own};
use super::{ApiError, ApiState, caller};
use crate::signature::standard_key;
use crate::storage::events::{Signing, SigningScheme};

/// The longest overlap a rotation may ask for.
const MAX_OVERLAP_SECONDS: u64 = 7 * 24 * 3600;

/// The overlap when a rotation names none: a day.
const DEFAULT_OVERLAP_SECONDS: u64 = 24 * 3600;

/// What to change.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SigningRequest {
    /// The scheme from now on; the subscription's current one when absent.
    scheme: Option<SigningScheme>,
    /// A new secret (`whsec_…` under Standard Webhooks); the old one keeps
    /// signing beside it for `overlap_seconds`.
    secret: Option<String>,
    /// How long the old secret signs too, in seconds (at most a week; a
    /// day when absent).
    overlap_seconds: Option<u64>,
}

/// How the subscription is signed now.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SigningView {
    topic: String,
    callback: String,
    scheme: SigningScheme,
    /// Until when the secret replaced last still signs too; absent when
    /// none does.
    previous_secret_until: Option<DateTime<Utc>>,
}

/// Sets how one of the caller's subscriptions is signed: its scheme, and
/// a new secret with an overlap.
///
/// Under Standard Webhooks (`webhook-id`, `webhook-timestamp`,
/// `webhook-signature`) every delivery during the overlap carries a
/// signature with each secret, so a receiver holding either verifies it.
/// WebSub's `X-Hub-Signature` carries one, the new secret's: accept both
/// on the receiving side meanwhile (the subscriber helper does, given
/// both).
#[utoipa::path(
    put,
    path = "/subscriptions/signing",
    operation_id = "set_own_subscription_signing",
    tag = "subscriber",
    params(SubscriptionQuery),
    request_body = SigningRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "How it is signed now.", body = SigningView),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthenticated),
        (status = 404, description = "The caller holds no subscription of this callback to \
            this topic (another subscriber's is answered the same), or this hub has no \
            subscriber API.", body = String, content_type = "text/plain"),
        (status = 431, response = TokenTooLarge),
        (status = 503, response = Unavailable),
    ),
)]
pub(super) async fn own(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<SubscriptionQuery>,
    request: Result<Json<SigningRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<SigningView>, ApiError> {
    let user = caller(&state, &headers)?;
    let (topic, callback) = query.pair()?;
    let Json(request) = request.map_err(|rejection| {
        bad(format!(
            "the body must be JSON like {{\"scheme\": \"standard-webhooks\", \"secret\": …}}: {}",
            rejection.body_text()
        ))
    })?;
    let subscription = find_own(&state, &user.id, &topic, &callback).await?;
    let (scheme, previous_secret_until) = change(
        &state,
        subscription,
        request.scheme,
        request.secret,
        request.overlap_seconds,
    )
    .await?;
    Ok(Json(SigningView {
        topic,
        callback,
        scheme,
        previous_secret_until,
    }))
}

/// Sets `subscription`'s scheme (its current one when `None`) and, given a
/// new `secret`, keeps the old one signing beside it for `overlap` seconds
/// (a day when `None`): the scheme now, and until when a previous secret
/// signs too. The API's and the portal's one way to change signing.
pub(crate) async fn change(
    state: &ApiState,
    mut subscription: websub_store::Subscription,
    scheme: Option<SigningScheme>,
    secret: Option<String>,
    overlap: Option<u64>,
) -> Result<(SigningScheme, Option<DateTime<Utc>>), ApiError> {
    let now = state.clock.now();
    let current = state.dispatcher.signing_of(&subscription);
    let scheme = scheme
        .or(current.as_ref().map(|signing| signing.scheme))
        .unwrap_or_default();
    let overlap = overlap.unwrap_or(DEFAULT_OVERLAP_SECONDS);
    if overlap > MAX_OVERLAP_SECONDS {
        return Err(bad(format!(
            "overlap_seconds must be at most {MAX_OVERLAP_SECONDS} (a week)"
        )));
    }
    let mut previous = current
        .and_then(|signing| signing.previous)
        .filter(|(_, until)| now < *until);
    if let Some(secret) = &secret {
        if secret.is_empty() || secret.len() > 200 {
            return Err(bad("secret must be 1 to 200 bytes".to_owned()));
        }
        let until = now + chrono::TimeDelta::seconds(i64::try_from(overlap).unwrap_or(i64::MAX));
        previous = subscription.secret.take().map(|old| (old, until));
        subscription.secret = Some(secret.clone());
    }
    if scheme == SigningScheme::StandardWebhooks {
        let Some(secret) = subscription.secret.as_deref() else {
            return Err(bad(
                "Standard Webhooks signs with a secret: give one (whsec_…)".to_owned(),
            ));
        };
        standard_key(secret).map_err(|reason| bad(format!("the secret {reason}")))?;
    }
    // The setting first: should the new secret not be kept, the old one
    // still signs beside it.
    let signing = Signing {
        topic: subscription.topic.clone(),
        callback: subscription.callback.clone(),
        scheme,
        previous: previous.clone(),
        since: now,
    };
    state.dispatcher.set_signing(signing).await?;
    if secret.is_some() {
        state.subscriptions.replace(&subscription).await?;
    }
    Ok((scheme, previous.map(|(_, until)| until)))
}

fn bad(reason: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, reason)
}
