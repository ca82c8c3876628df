//! Who may see the admin page: the session cookie that logging in with the
//! internal key sets ([`super::login`]), and the CSRF token of every form.
//!
//! The cookie holds its own expiry and a random nonce, signed with the
//! internal key (HMAC-SHA256): nothing is stored, so a session survives a
//! restart and works on every replica sharing the key, and changing the key
//! ends every session. The CSRF token is the same key's HMAC of the
//! cookie's value, so a page can only post what a page of this session
//! rendered. Logging out drops the cookie from the browser; a copy taken
//! before stays valid until it expires, which the bounded lifetime limits.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use chrono::{DateTime, Utc};
use subtle::ConstantTimeEq;

use crate::web::api::{ApiError, ApiState};
use crate::web::auth::InternalKey;

/// The session cookie's name.
pub(super) const COOKIE: &str = "websub_admin";

/// How long a session lasts from logging in: a working day, after which
/// the key is asked for again.
pub(super) const LIFETIME: chrono::TimeDelta = chrono::TimeDelta::hours(12);

/// What every signed value starts with, so that a session's MAC can never
/// pass for a CSRF token or for anything else the key signs.
const SESSION_PURPOSE: &[u8] = b"websub admin session\0";
const CSRF_PURPOSE: &[u8] = b"websub admin csrf\0";

/// The form field the CSRF token travels in.
pub(super) const CSRF_FIELD: &str = "csrf";

/// A logged-in operator.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// The token every form of this session carries.
    pub(super) csrf: String,
}

/// The cookie value of a session expiring at `expires`: expiry, nonce and
/// their MAC, dot-separated.
pub(super) fn issue(key: &InternalKey, expires: DateTime<Utc>) -> String {
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    let signed = format!("{}.{nonce}", expires.timestamp());
    let mac = hex::encode(key.sign(&[SESSION_PURPOSE, signed.as_bytes()].concat()));
    format!("{signed}.{mac}")
}

/// Whether `value` is a cookie this key issued that has not expired at
/// `now`.
fn valid(key: &InternalKey, value: &str, now: DateTime<Utc>) -> bool {
    let Some((signed, mac)) = value.rsplit_once('.') else {
        return false;
    };
    let Ok(mac) = hex::decode(mac) else {
        return false;
    };
    let expected = key.sign(&[SESSION_PURPOSE, signed.as_bytes()].concat());
    if !bool::from(mac.ct_eq(&expected)) {
        return false;
    }
    let Some(expires) = signed
        .split_once('.')
        .and_then(|(expires, _)| expires.parse::<i64>().ok())
        .and_then(|seconds| DateTime::from_timestamp(seconds, 0))
    else {
        return false;
    };
    // A cookie reaching further than one lifetime was not issued by this
    // code; refuse it rather than trust it for longer.
    now < expires && expires <= now + LIFETIME
}

/// The CSRF token of the session whose cookie is `value`.
fn csrf_of(key: &InternalKey, value: &str) -> String {
    hex::encode(key.sign(&[CSRF_PURPOSE, value.as_bytes()].concat()))
}

/// The value of the session cookie among the request's cookies.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE).then_some(value)
        })
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

/// The internal key, or the 403 of a hub without one.
pub(super) fn key(state: &ApiState) -> Result<&InternalKey, ApiError> {
    state.internal_key.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "this hub has no internal API key configured, so the admin page is closed",
        )
    })
}

/// The session of a page request; without one, the way to the login.
pub(super) fn require(state: &ApiState, headers: &HeaderMap) -> Result<Session, ApiError> {
    let key = key(state)?;
    match cookie(headers) {
        Some(value) if valid(key, value, state.clock.now()) => Ok(Session {
            csrf: csrf_of(key, value),
        }),
        _ => Err(ApiError::login()),
    }
}

/// The session of a form post, whose CSRF token must be the session's.
pub(super) fn require_form(
    state: &ApiState,
    headers: &HeaderMap,
    token: Option<&str>,
) -> Result<Session, ApiError> {
    let session = require(state, headers)?;
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

    fn key() -> InternalKey {
        InternalKey::new("an-internal-api-key-of-at-least-32-characters", "X-Key")
            .expect("a valid key")
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).expect("a time")
    }

    #[test]
    fn a_session_is_valid_until_it_expires() {
        let now = at(1_700_000_000);
        let value = issue(&key(), now + LIFETIME);
        assert!(valid(&key(), &value, now));
        assert!(valid(
            &key(),
            &value,
            now + LIFETIME - chrono::TimeDelta::seconds(1)
        ));
        assert!(!valid(&key(), &value, now + LIFETIME));
    }

    #[test]
    fn a_session_of_another_key_or_altered_is_refused() {
        let now = at(1_700_000_000);
        let value = issue(&key(), now + LIFETIME);
        let other = InternalKey::new("another-internal-api-key-of-32-characters", "X-Key")
            .expect("a valid key");
        assert!(!valid(&other, &value, now));
        let (expires, rest) = value.split_once('.').expect("dotted");
        let later = expires.parse::<i64>().expect("seconds") + 3600;
        assert!(!valid(&key(), &format!("{later}.{rest}"), now));
        assert!(!valid(&key(), "", now));
        assert!(!valid(&key(), "1.2.3", now));
    }

    #[test]
    fn a_session_reaching_past_one_lifetime_is_refused() {
        let now = at(1_700_000_000);
        let value = issue(&key(), now + LIFETIME + chrono::TimeDelta::seconds(1));
        assert!(!valid(&key(), &value, now));
    }

    #[test]
    fn each_session_has_its_own_csrf_token() {
        let now = at(1_700_000_000);
        let first = issue(&key(), now + LIFETIME);
        let second = issue(&key(), now + LIFETIME);
        assert_ne!(first, second, "the nonce tells them apart");
        assert_ne!(csrf_of(&key(), &first), csrf_of(&key(), &second));
        assert_eq!(csrf_of(&key(), &first), csrf_of(&key(), &first));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; websub_admin=v.w.x"),
        );
        assert_eq!(cookie(&headers), Some("v.w.x"));
        assert_eq!(cookie(&HeaderMap::new()), None);
    }
}
