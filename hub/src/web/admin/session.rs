//! Who may see the admin page: the session that logging in with an
//! operator key opens ([`super::login`]), and the CSRF token of every form.
//!
//! The cookie holds a random token; the hub keeps a digest of it with the
//! session ([`crate::storage::events::AdminSessions`], beside the event
//! log), so a session works on every replica and after a restart, and ends
//! when logging out, when an operator ends it (or all of them, through the
//! operator API or `websub admin-sessions`), when it expires, or when the
//! key it was opened with is no longer an operator key. The CSRF token is
//! another digest of the same token, so a page can only post what a page
//! of this session rendered, and neither digest opens a session.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use sha2::Digest;
use subtle::ConstantTimeEq;

use crate::storage::events::AdminSession;
use crate::web::api::{ApiError, ApiState};
use crate::web::auth::{KeyId, KeyRing};

/// The session cookie's name.
pub(super) const COOKIE: &str = "websub_admin";

/// How long a session lasts from logging in: a working day, after which
/// the key is asked for again.
pub(super) const LIFETIME: chrono::TimeDelta = chrono::TimeDelta::hours(12);

/// What each digest of a token starts with, so that the one kept can never
/// pass for the one a form carries.
const SESSION_PURPOSE: &[u8] = b"websub admin session\0";
const CSRF_PURPOSE: &[u8] = b"websub admin csrf\0";

/// The most of a `User-Agent` kept with a session.
const USER_AGENT_CHARS: usize = 200;

/// The form field the CSRF token travels in.
pub(super) const CSRF_FIELD: &str = "csrf";

/// A logged-in operator.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// The session's id, to end it by.
    pub(super) id: String,
    /// The token every form of this session carries.
    pub(super) csrf: String,
}

fn digest(purpose: &[u8], token: &str) -> String {
    hex::encode(sha2::Sha256::digest([purpose, token.as_bytes()].concat()))
}

/// The CSRF token of the session whose cookie is `token`.
fn csrf_of(token: &str) -> String {
    digest(CSRF_PURPOSE, token)
}

/// Opens a session for the operator who logged in with key `key_id`: kept,
/// then its cookie's value.
pub(super) async fn open(
    state: &ApiState,
    key_id: KeyId,
    headers: &HeaderMap,
) -> Result<String, ApiError> {
    let token = hex::encode(rand::random::<[u8; 32]>());
    let now = state.clock.now();
    let session = AdminSession {
        id: hex::encode(rand::random::<[u8; 8]>()),
        key_id: key_id.0,
        created_at: now,
        expires_at: now + LIFETIME,
        user_agent: headers
            .get(header::USER_AGENT)
            .and_then(|value| value.to_str().ok())
            .map(|agent| agent.chars().take(USER_AGENT_CHARS).collect()),
    };
    state
        .events
        .open_session(&session, &digest(SESSION_PURPOSE, &token), now)
        .await
        .map_err(|error| unavailable(&error))?;
    tracing::info!(session = %session.id, key = %session.key_id, "admin session opened");
    Ok(token)
}

fn unavailable(error: &crate::storage::events::EventLogError) -> ApiError {
    tracing::warn!(%error, "admin sessions unavailable");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the admin sessions cannot be read or written now; try again shortly",
    )
}

/// The `Set-Cookie` of a session: sent over HTTPS only (browsers treat
/// `http://127.0.0.1` and `http://localhost` as secure too), out of reach of
/// scripts, never on a request another site starts, and only under `/admin`.
pub(super) fn set_cookie(value: &str, max_age: i64) -> HeaderValue {
    HeaderValue::try_from(format!(
        "{COOKIE}={value}; Path=/admin; Max-Age={max_age}; Secure; HttpOnly; SameSite=Strict"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("websub_admin=; Path=/admin; Max-Age=0"))
}

/// The operator keys, or the 403 of a hub without any.
pub(super) fn key(state: &ApiState) -> Result<&KeyRing, ApiError> {
    state.keys.operate.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "this hub has no operator key configured (operator-keys or internal-api-key), \
             so the admin page is closed",
        )
    })
}

/// The session of a page request; without one, the way to the login.
pub(super) async fn require(state: &ApiState, headers: &HeaderMap) -> Result<Session, ApiError> {
    let ring = key(state)?;
    let Some(token) = crate::web::cookie(headers, COOKIE) else {
        return Err(ApiError::login());
    };
    let found = state
        .events
        .session(&digest(SESSION_PURPOSE, token), state.clock.now())
        .await
        .map_err(|error| unavailable(&error))?;
    match found {
        Some(session) if ring.holds(&KeyId(session.key_id.clone())) => Ok(Session {
            id: session.id,
            csrf: csrf_of(token),
        }),
        Some(session) => {
            // Its key was removed: the session ends with it.
            let _ = state.events.end_session(&session.id).await;
            tracing::info!(session = %session.id, "admin session ended: its key was removed");
            Err(ApiError::login())
        }
        None => Err(ApiError::login()),
    }
}

/// The session of a form post, whose CSRF token must be the session's.
pub(super) async fn require_form(
    state: &ApiState,
    headers: &HeaderMap,
    token: Option<&str>,
) -> Result<Session, ApiError> {
    let session = require(state, headers).await?;
    match token {
        Some(token) if bool::from(token.as_bytes().ct_eq(session.csrf.as_bytes())) => Ok(session),
        Some(_) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is not this session's; reload the page and try again",
        )),
        None => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the form carries no CSRF token; send it from the admin page",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_session_has_its_own_csrf_token_apart_from_its_kept_digest() {
        let first = hex::encode(rand::random::<[u8; 32]>());
        let second = hex::encode(rand::random::<[u8; 32]>());
        assert_ne!(csrf_of(&first), csrf_of(&second));
        assert_eq!(csrf_of(&first), csrf_of(&first));
        assert_ne!(csrf_of(&first), digest(SESSION_PURPOSE, &first));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; websub_admin=v.w.x"),
        );
        assert_eq!(crate::web::cookie(&headers, COOKIE), Some("v.w.x"));
        assert_eq!(crate::web::cookie(&HeaderMap::new(), COOKIE), None);
    }
}
