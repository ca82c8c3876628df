//! The subscriber portal under `/portal`: server-rendered pages where a
//! subscriber sees its own subscriptions and nobody else's — each one's
//! state, lease, verification requests, deliveries and their attempts —
//! and acts on them: send a delivery again, replay since a time, pause and
//! resume, rotate the secret. The same rules as the subscriber API: what
//! another subscriber holds is answered as missing.
//!
//! A subscriber comes in with a link an operator issues
//! (`POST /api/v1/operator/portal-links`, `websub portal-link`), or by
//! typing its user token at `/portal/login`. Either opens a session: a
//! cookie holding the subscriber and an expiry, signed with the user token
//! key (so the hub keeps nothing, every replica accepts it, and a link
//! lasts no longer than the operator said). Every form carries a CSRF
//! token derived from the cookie. Without a user token key the portal
//! answers 404, as the subscriber API does.

mod pages;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::web::api::{ApiError, ApiState};
use crate::web::auth::UserTokens;

/// The session cookie's name.
const COOKIE: &str = "websub_portal";

/// How long a session opened with a user token lasts.
pub const LOGIN_LIFETIME: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// The longest a link may last.
pub const MAX_LINK_LIFETIME: chrono::TimeDelta = chrono::TimeDelta::days(7);

/// What each signature starts with, so that a link's MAC can never pass
/// for a CSRF token.
const LINK_PURPOSE: &[u8] = b"websub portal link\0";
const CSRF_PURPOSE: &[u8] = b"websub portal csrf\0";

/// The largest form a portal action sends.
const FORM_LIMIT: usize = 16 * 1024;

/// The portal's routes (see the module docs).
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/portal", get(pages::overview))
        .route("/portal/enter", get(pages::enter))
        .route("/portal/login", get(pages::login_form).post(pages::login))
        .route("/portal/logout", post(pages::logout))
        .route("/portal/subscription", get(pages::subscription))
        .route("/portal/delivery", get(pages::delivery))
        .route("/portal/resend", post(pages::resend))
        .route("/portal/replay", post(pages::replay))
        .route("/portal/pause", post(pages::pause))
        .route("/portal/resume", post(pages::resume))
        .route("/portal/secret", post(pages::rotate_secret))
        .layer(DefaultBodyLimit::max(FORM_LIMIT))
        .layer(axum::middleware::map_response(crate::web::guard_pages))
        .with_state(state)
}

/// What a link (and the session it opens) says: who, until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: i64,
}

/// A portal session: the subscriber, and the CSRF token of its forms.
#[derive(Debug, Clone)]
pub(crate) struct Visitor {
    /// The subscriber (a user token's `sub`).
    pub(crate) id: String,
    /// The token every form of this session carries.
    pub(crate) csrf: String,
}

/// The user token checker, or the 404 of a hub without a portal.
fn tokens(state: &ApiState) -> Result<&UserTokens, ApiError> {
    state.user_tokens.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "this hub has no user token key, so it has no subscriber portal",
        )
    })
}

/// A signed value saying `sub` may use the portal until `expires`.
pub(crate) fn issue(tokens: &UserTokens, sub: &str, expires: DateTime<Utc>) -> String {
    let claims = Claims {
        sub: sub.to_owned(),
        exp: expires.timestamp(),
    };
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap_or_default());
    let mac = URL_SAFE_NO_PAD.encode(tokens.sign(&[LINK_PURPOSE, payload.as_bytes()].concat()));
    format!("{payload}.{mac}")
}

/// Who `value` lets in at `now`, and until when, if it is a value this key
/// signed and it has not expired.
fn verify(tokens: &UserTokens, value: &str, now: DateTime<Utc>) -> Option<(String, DateTime<Utc>)> {
    let (payload, mac) = value.split_once('.')?;
    let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
    let expected = tokens.sign(&[LINK_PURPOSE, payload.as_bytes()].concat());
    if !bool::from(mac.ct_eq(&expected)) {
        return None;
    }
    let claims: Claims = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    let expires = DateTime::from_timestamp(claims.exp, 0)?;
    // A value reaching further than a link may was not issued here.
    (now < expires && expires <= now + MAX_LINK_LIFETIME && !claims.sub.is_empty())
        .then_some((claims.sub, expires))
}

fn csrf_of(tokens: &UserTokens, value: &str) -> String {
    hex::encode(tokens.sign(&[CSRF_PURPOSE, value.as_bytes()].concat()))
}

/// The `Set-Cookie` of a session: HTTPS only (browsers treat loopback as
/// secure), out of scripts' reach, never sent by another site's request,
/// only under `/portal`.
fn set_cookie(value: &str, max_age: i64) -> HeaderValue {
    HeaderValue::try_from(format!(
        "{COOKIE}={value}; Path=/portal; Max-Age={max_age}; Secure; HttpOnly; SameSite=Strict"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("websub_portal=; Path=/portal; Max-Age=0"))
}

/// The way to the login, for a request without a session.
fn to_login() -> ApiError {
    ApiError::new(StatusCode::SEE_OTHER, "log in first")
        .with_header(header::LOCATION, HeaderValue::from_static("/portal/login"))
}

/// The visitor of a page request; without a session, the way to the login.
async fn require(state: &ApiState, headers: &HeaderMap) -> Result<Visitor, ApiError> {
    let tokens = tokens(state)?;
    let value = crate::web::cookie(headers, COOKIE).ok_or_else(to_login)?;
    let (id, _) = verify(tokens, value, state.clock.now()).ok_or_else(to_login)?;
    Ok(Visitor {
        id,
        csrf: csrf_of(tokens, value),
    })
}

/// The visitor of a form post, whose CSRF token must be the session's.
async fn require_form(
    state: &ApiState,
    headers: &HeaderMap,
    token: Option<&str>,
) -> Result<Visitor, ApiError> {
    let visitor = require(state, headers).await?;
    match token {
        Some(token) if bool::from(token.as_bytes().ct_eq(visitor.csrf.as_bytes())) => Ok(visitor),
        _ => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is not this session's; reload the page and try again",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> UserTokens {
        UserTokens::new("the user token key", "Authorization").expect("a key")
    }

    #[test]
    fn a_link_lets_its_subscriber_in_until_it_expires() {
        let now = Utc::now();
        let link = issue(&tokens(), "alice", now + chrono::TimeDelta::hours(1));
        assert_eq!(
            verify(&tokens(), &link, now).map(|(sub, _)| sub).as_deref(),
            Some("alice")
        );
        assert_eq!(
            verify(&tokens(), &link, now + chrono::TimeDelta::hours(2)),
            None
        );
        let other = UserTokens::new("another key", "Authorization").expect("a key");
        assert_eq!(verify(&other, &link, now), None, "another hub's key");
        let (payload, mac) = link.split_once('.').expect("dotted");
        let forged = URL_SAFE_NO_PAD.encode(br#"{"sub":"bob","exp":9999999999}"#);
        assert_eq!(verify(&tokens(), &format!("{forged}.{mac}"), now), None);
        assert_eq!(verify(&tokens(), payload, now), None);
        let too_long = issue(
            &tokens(),
            "alice",
            now + MAX_LINK_LIFETIME + chrono::TimeDelta::hours(1),
        );
        assert_eq!(verify(&tokens(), &too_long, now), None);
        assert_ne!(csrf_of(&tokens(), &link), mac);
    }
}
