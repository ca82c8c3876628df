//! Who is calling: users by a signed token, other services by the internal
//! API key.
//!
//! - [`UserTokens`] checks a user's JWT: HS256 only (a token naming any
//!   other algorithm, `none` included, is refused before its signature is
//!   looked at), signed with the shared key, with an `exp` that is required
//!   and enforced, and a non-empty `sub` that becomes the [`User`]'s id.
//! - [`InternalKey`] checks the key another service sends in a header
//!   (at least [`MIN_INTERNAL_KEY_CHARS`] characters, compared in constant
//!   time).
//!
//! Failures are [`AuthError`]s, answered (as the API's one error answer)
//! with a 401 and a plain-text reason (a 431 for a token over
//! [`MAX_TOKEN_BYTES`], a 500 for a configuration that cannot work). The size is checked before anything
//! is decoded: a token's claims end up in store queries and in the URL of
//! the subscriptions service, and a huge one, even correctly signed, would
//! fail there instead, as an error of the hub's. The hub's routes
//! call the checkers themselves rather than through extractors: a hub
//! without a key answers differently (404 for the subscriber API, 403 for
//! internal requests) from a caller without credentials.

use std::fmt;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use subtle::ConstantTimeEq;

/// The user token header when none is configured (`Bearer` scheme).
pub const DEFAULT_USER_TOKEN_HEADER: &str = "Authorization";
/// The internal key header when none is configured.
pub const DEFAULT_INTERNAL_API_KEY_HEADER: &str = "X-Internal-API-Key";
/// The shortest internal key accepted.
pub const MIN_INTERNAL_KEY_CHARS: usize = 32;
/// The largest user token header value read, in bytes. Real tokens are a
/// few hundred bytes; 8 KiB is also the largest header line many proxies
/// pass, so a larger token could not work behind one anyway.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// The authentication settings. A plain value: [`AuthConfig::default`] and
/// set fields. (The hub reads them, with every other setting, through
/// [`crate::config::Settings`].)
#[derive(Clone)]
pub struct AuthConfig {
    /// The HS256 key user tokens are signed with; without it, no user can
    /// authenticate.
    pub user_token_key: Option<String>,
    /// The header user tokens travel in.
    pub user_token_header: String,
    /// The key other services send; without it, internal requests are
    /// refused.
    pub internal_api_key: Option<String>,
    /// The header the internal key travels in.
    pub internal_api_key_header: String,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            user_token_key: None,
            user_token_header: DEFAULT_USER_TOKEN_HEADER.to_owned(),
            internal_api_key: None,
            internal_api_key_header: DEFAULT_INTERNAL_API_KEY_HEADER.to_owned(),
        }
    }
}

// The keys stay out of logs.
impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |key: &Option<String>| key.as_ref().map(|_| "<redacted>");
        f.debug_struct("AuthConfig")
            .field("user_token_key", &redacted(&self.user_token_key))
            .field("user_token_header", &self.user_token_header)
            .field("internal_api_key", &redacted(&self.internal_api_key))
            .field("internal_api_key_header", &self.internal_api_key_header)
            .finish()
    }
}

impl AuthConfig {
    /// The user token checker, or `None` when no key is configured.
    pub fn user_tokens(&self) -> Result<Option<UserTokens>, AuthError> {
        self.user_token_key
            .as_deref()
            .map(|key| UserTokens::new(key, &self.user_token_header))
            .transpose()
    }

    /// The internal key checker, or `None` when no key is configured.
    pub fn internal_key(&self) -> Result<Option<InternalKey>, AuthError> {
        self.internal_api_key
            .as_deref()
            .map(|key| InternalKey::new(key, &self.internal_api_key_header))
            .transpose()
    }
}

/// Why a caller was not authenticated, or why the settings cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No user token in the request (or not with the `Bearer` scheme).
    #[error("missing bearer token")]
    MissingToken,
    /// The token is not a well-formed JWT with the claims we read.
    #[error("malformed token")]
    MalformedToken,
    /// The token header is longer than [`MAX_TOKEN_BYTES`].
    #[error("the token is larger than {MAX_TOKEN_BYTES} bytes")]
    TokenTooLarge,
    /// The token has no `exp` claim; tokens that never expire are refused.
    #[error("the token has no expiry")]
    MissingExpiry,
    /// The token's `exp` has passed.
    #[error("the token has expired")]
    ExpiredToken,
    /// The signature does not match the key.
    #[error("the token's signature is invalid")]
    BadSignature,
    /// The token names an algorithm other than HS256.
    #[error("the token's algorithm is not HS256")]
    WrongAlgorithm,
    /// The token has no (or an empty) `sub` claim.
    #[error("the token names no subject")]
    MissingSubject,
    /// No internal key in the request.
    #[error("missing internal API key")]
    MissingKey,
    /// The internal key does not match.
    #[error("wrong internal API key")]
    WrongKey,
    /// The settings cannot work (a key too short, a bad header name).
    #[error("invalid authentication configuration: {0}")]
    InvalidConfig(String),
}

impl AuthError {
    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidConfig(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::TokenTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            _ => StatusCode::UNAUTHORIZED,
        }
    }

    /// The `WWW-Authenticate` challenge of the answer: `Bearer`, on a 401
    /// about the user token (RFC 6750: with no error code when no
    /// credentials were sent).
    pub fn challenge(&self) -> Option<HeaderValue> {
        match self {
            Self::MissingKey | Self::WrongKey | Self::InvalidConfig(_) | Self::TokenTooLarge => {
                None
            }
            Self::MissingToken => Some(HeaderValue::from_static("Bearer")),
            _ => Some(HeaderValue::from_static("Bearer error=\"invalid_token\"")),
        }
    }
}

/// An authenticated user.
#[derive(Clone, PartialEq, Eq)]
pub struct User {
    /// The token's `sub` claim.
    pub id: String,
    /// The token's `subscription` claim, as sent (any JSON value), when
    /// present and not `null`.
    pub subscription: Option<serde_json::Value>,
    /// The token itself, e.g. to call another service on the user's behalf.
    pub token: String,
}

// The token stays out of logs.
impl fmt::Debug for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("id", &self.id)
            .field("subscription", &self.subscription)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// The claims read from a user token; `exp` is checked by the decoder.
#[derive(Deserialize)]
struct Claims {
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    subscription: Option<serde_json::Value>,
}

/// Checks user tokens. Cheap to clone.
#[derive(Clone)]
pub struct UserTokens {
    inner: Arc<TokensInner>,
}

struct TokensInner {
    key: DecodingKey,
    validation: Validation,
    header: HeaderName,
    /// With `Authorization` the `Bearer` scheme is required; a custom
    /// header may carry the bare token too.
    bearer_required: bool,
}

impl fmt::Debug for UserTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserTokens")
            .field("header", &self.inner.header)
            .finish_non_exhaustive()
    }
}

impl UserTokens {
    /// A checker of HS256 tokens signed with `key`, read from `header`.
    ///
    /// Fails with [`AuthError::InvalidConfig`] on an empty key or a header
    /// name that is not one.
    pub fn new(key: &str, header: &str) -> Result<Self, AuthError> {
        if key.is_empty() {
            return Err(AuthError::InvalidConfig(
                "the user token key is empty".to_owned(),
            ));
        }
        let header = header_name(header, "user token")?;
        let key = DecodingKey::from_secret(key.as_bytes())
            .map_err(|error| AuthError::InvalidConfig(format!("user token key: {error}")))?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp"]);
        validation.validate_exp = true;
        // Tokens come from a service on the same clocks; an expired token is
        // expired.
        validation.leeway = 0;
        // No audience is configured; one in the token is not ours to judge.
        validation.validate_aud = false;
        Ok(Self {
            inner: Arc::new(TokensInner {
                key,
                validation,
                bearer_required: header == header::AUTHORIZATION,
                header,
            }),
        })
    }

    /// The header the token is read from.
    pub fn header(&self) -> &HeaderName {
        &self.inner.header
    }

    /// The user whose token `headers` carry.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<User, AuthError> {
        let value = headers
            .get(&self.inner.header)
            .ok_or(AuthError::MissingToken)?;
        if value.len() > MAX_TOKEN_BYTES {
            return Err(AuthError::TokenTooLarge);
        }
        let value = value
            .to_str()
            .map_err(|_| AuthError::MalformedToken)?
            .trim();
        let token = match bearer(value) {
            Some(token) => token,
            None if self.inner.bearer_required => return Err(AuthError::MissingToken),
            None => value,
        };
        if token.is_empty() {
            return Err(AuthError::MissingToken);
        }
        check_algorithm(token)?;
        let data = jsonwebtoken::decode::<Claims>(token, &self.inner.key, &self.inner.validation)
            .map_err(|error| match error.kind() {
            ErrorKind::InvalidSignature => AuthError::BadSignature,
            ErrorKind::ExpiredSignature => AuthError::ExpiredToken,
            ErrorKind::MissingRequiredClaim(claim) if claim == "exp" => AuthError::MissingExpiry,
            ErrorKind::InvalidAlgorithm | ErrorKind::UnsupportedAlgorithm => {
                AuthError::WrongAlgorithm
            }
            _ => AuthError::MalformedToken,
        })?;
        let id = data
            .claims
            .sub
            .filter(|sub| !sub.is_empty())
            .ok_or(AuthError::MissingSubject)?;
        Ok(User {
            id,
            subscription: data.claims.subscription.filter(|value| !value.is_null()),
            token: token.to_owned(),
        })
    }
}

/// The token of a `Bearer` credential (scheme case-insensitive).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

/// Refuses a token whose header names anything but HS256, before the
/// decoder sees it: `none` and unknown algorithms are not even names the
/// decoder can parse, and they deserve the same answer as HS512.
fn check_algorithm(token: &str) -> Result<(), AuthError> {
    #[derive(Deserialize)]
    struct Header {
        alg: Option<String>,
    }
    let mut parts = token.split('.');
    let (Some(encoded), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AuthError::MalformedToken);
    };
    let json = URL_SAFE_NO_PAD
        .decode(encoded)
        .map_err(|_| AuthError::MalformedToken)?;
    let header: Header = serde_json::from_slice(&json).map_err(|_| AuthError::MalformedToken)?;
    match header.alg.as_deref() {
        Some("HS256") => Ok(()),
        Some(_) => Err(AuthError::WrongAlgorithm),
        None => Err(AuthError::MalformedToken),
    }
}

/// Checks the internal API key. Cheap to clone.
#[derive(Clone)]
pub struct InternalKey {
    key: Arc<str>,
    header: HeaderName,
}

impl fmt::Debug for InternalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InternalKey")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl InternalKey {
    /// A checker of `key` in `header`.
    ///
    /// Fails with [`AuthError::InvalidConfig`] on a key shorter than
    /// [`MIN_INTERNAL_KEY_CHARS`] characters or a header name that is not
    /// one.
    pub fn new(key: &str, header: &str) -> Result<Self, AuthError> {
        let chars = key.chars().count();
        if chars < MIN_INTERNAL_KEY_CHARS {
            return Err(AuthError::InvalidConfig(format!(
                "the internal API key is {chars} characters; at least \
                 {MIN_INTERNAL_KEY_CHARS} are required"
            )));
        }
        Ok(Self {
            key: Arc::from(key),
            header: header_name(header, "internal API key")?,
        })
    }

    /// The header the key is read from.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// Whether `headers` carry the key: [`AuthError::MissingKey`] or
    /// [`AuthError::WrongKey`] otherwise.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), AuthError> {
        let given = headers.get(&self.header).ok_or(AuthError::MissingKey)?;
        if self.matches(given.as_bytes()) {
            Ok(())
        } else {
            Err(AuthError::WrongKey)
        }
    }

    /// Whether `given` is the key (typed into a form rather than sent in
    /// the header).
    pub fn matches(&self, given: &[u8]) -> bool {
        // Time depends on the lengths only, never on where they differ.
        bool::from(given.ct_eq(self.key.as_bytes()))
    }

    /// HMAC-SHA256 of `message` under the key: values the hub hands out
    /// (the admin page's session cookie) and takes back later, on any
    /// replica and after a restart, without storing them. The key never
    /// leaves this type.
    pub fn sign(&self, message: &[u8]) -> [u8; 32] {
        use hmac::{Hmac, KeyInit, Mac};
        let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(self.key.as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(message);
        mac.finalize().into_bytes().into()
    }
}

fn header_name(name: &str, what: &str) -> Result<HeaderName, AuthError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| AuthError::InvalidConfig(format!("the {what} header {name:?} is not valid")))
}

/// Issues an HS256 user token for `sub`, valid for `ttl` from now (a
/// negative `ttl` gives an expired token), with the `subscription` claim
/// when given. For tests.
///
/// # Panics
/// When the key is empty.
#[cfg(feature = "testing")]
pub fn issue_token(
    key: &str,
    sub: &str,
    subscription: Option<serde_json::Value>,
    ttl: chrono::TimeDelta,
) -> String {
    let exp = (chrono::Utc::now() + ttl).timestamp();
    let mut claims = serde_json::json!({ "sub": sub, "exp": exp });
    if let (Some(subscription), Some(object)) = (subscription, claims.as_object_mut()) {
        object.insert("subscription".to_owned(), subscription);
    }
    let key = jsonwebtoken::EncodingKey::from_secret(key.as_bytes()).expect("an HMAC key");
    jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::HS256), &claims, &key)
        .expect("HS256 signs any claims")
}
