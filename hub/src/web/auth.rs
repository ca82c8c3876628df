//! Who is calling: users by a signed token, services and operators by a
//! key of the role they act in.
//!
//! - [`UserTokens`] checks a user's JWT: HS256 only (a token naming any
//!   other algorithm, `none` included, is refused before its signature is
//!   looked at), signed with the shared key, with an `exp` that is required
//!   and enforced, and a non-empty `sub` that becomes the [`User`]'s id.
//! - [`KeyRing`] checks the key a caller sends in a header against the
//!   keys of one [`Role`] (each at least [`MIN_INTERNAL_KEY_CHARS`]
//!   characters, every one compared in constant time, so neither which key
//!   matched nor how much of it shows in the time taken). A role holds
//!   several keys so that one can be replaced without downtime: the new
//!   key is added, callers move to it, the old one is removed.
//! - [`KeyRings`] are the rings of one hub, from its configuration: the
//!   single internal key, where set, is a key of every role but metrics.
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
/// The shortest key of any role accepted.
pub const MIN_INTERNAL_KEY_CHARS: usize = 32;
/// The largest user token header value read, in bytes. Real tokens are a
/// few hundred bytes; 8 KiB is also the largest header line many proxies
/// pass, so a larger token could not work behind one anyway.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

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
    /// The key itself, for the values the hub signs on users' behalf (the
    /// portal's links); it never leaves this type.
    secret: Arc<[u8]>,
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
        let decoding = DecodingKey::from_secret(key.as_bytes())
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
                key: decoding,
                secret: Arc::from(key.as_bytes()),
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

    /// HMAC-SHA256 of `message` under the user token key: values the hub
    /// hands a user and takes back later (a portal link, its session), on
    /// any replica, without storing them.
    pub fn sign(&self, message: &[u8]) -> [u8; 32] {
        use hmac::{Hmac, KeyInit, Mac};
        let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&self.inner.secret)
            .expect("HMAC takes a key of any length");
        mac.update(message);
        mac.finalize().into_bytes().into()
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

/// What a key lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Fat pings: content published with the request.
    Publish,
    /// The operator API and the admin page.
    Operate,
    /// Reading `/metrics`.
    Metrics,
}

impl Role {
    /// The setting that lists the role's keys.
    pub fn setting(self) -> &'static str {
        match self {
            Self::Publish => "publish-keys",
            Self::Operate => "operator-keys",
            Self::Metrics => "metrics-keys",
        }
    }
}

/// Which key of a ring a caller used: a digest of it, never the key. A
/// session opened with a key ends when that key leaves the ring.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyId(pub String);

impl KeyId {
    fn of(key: &str) -> Self {
        use sha2::Digest;
        let digest = sha2::Sha256::digest([b"websub key id\0", key.as_bytes()].concat());
        Self(hex::encode(&digest[..8]))
    }
}

/// Checks the keys of one role. Cheap to clone.
#[derive(Clone)]
pub struct KeyRing {
    keys: Arc<[(Arc<str>, KeyId)]>,
    header: HeaderName,
    role: Role,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("role", &self.role)
            .field("keys", &self.keys.len())
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl KeyRing {
    /// A checker of `keys` for `role`, read from `header`; `None` when
    /// there are no keys (duplicates count once).
    ///
    /// Fails with [`AuthError::InvalidConfig`] on a key shorter than
    /// [`MIN_INTERNAL_KEY_CHARS`] characters or a header name that is not
    /// one.
    pub fn new<'a>(
        keys: impl IntoIterator<Item = &'a str>,
        header: &str,
        role: Role,
    ) -> Result<Option<Self>, AuthError> {
        let mut ring: Vec<(Arc<str>, KeyId)> = Vec::new();
        for key in keys {
            let chars = key.chars().count();
            if chars < MIN_INTERNAL_KEY_CHARS {
                return Err(AuthError::InvalidConfig(format!(
                    "a key of {} is {chars} characters; at least \
                     {MIN_INTERNAL_KEY_CHARS} are required",
                    role.setting()
                )));
            }
            if !ring.iter().any(|(known, _)| **known == *key) {
                ring.push((Arc::from(key), KeyId::of(key)));
            }
        }
        if ring.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self {
            keys: ring.into(),
            header: header_name(header, "internal API key")?,
            role,
        }))
    }

    /// The header the key is read from.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// The role the ring's keys act in.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Which key `headers` carry: [`AuthError::MissingKey`] or
    /// [`AuthError::WrongKey`] when none of the ring's.
    pub fn check(&self, headers: &HeaderMap) -> Result<KeyId, AuthError> {
        let given = headers.get(&self.header).ok_or(AuthError::MissingKey)?;
        self.matches(given.as_bytes()).ok_or(AuthError::WrongKey)
    }

    /// Like [`KeyRing::check`], and also taking the key as a bearer
    /// credential in `Authorization` (how scrapers such as Prometheus send
    /// one).
    pub fn check_or_bearer(&self, headers: &HeaderMap) -> Result<KeyId, AuthError> {
        match self.check(headers) {
            Err(AuthError::MissingKey) => {
                let given = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|value| value.to_str().ok())
                    .and_then(bearer)
                    .ok_or(AuthError::MissingKey)?;
                self.matches(given.as_bytes()).ok_or(AuthError::WrongKey)
            }
            checked => checked,
        }
    }

    /// Which of the ring's keys `given` is (typed into a form rather than
    /// sent in the header).
    pub fn matches(&self, given: &[u8]) -> Option<KeyId> {
        // Every key is compared, each in a time that depends on the
        // lengths only: the time says nothing of which key, if any, matched.
        let mut found = None;
        for (key, id) in self.keys.iter() {
            if bool::from(given.ct_eq(key.as_bytes())) {
                found = Some(id.clone());
            }
        }
        found
    }

    /// Whether the key `id` names is still one of the ring's.
    pub fn holds(&self, id: &KeyId) -> bool {
        self.keys.iter().any(|(_, known)| known == id)
    }
}

/// The key rings of one hub. A role without keys refuses every caller,
/// except metrics, which is open without them.
#[derive(Debug, Clone, Default)]
pub struct KeyRings {
    /// The keys of fat pings.
    pub publish: Option<KeyRing>,
    /// The keys of the operator API and the admin page.
    pub operate: Option<KeyRing>,
    /// The keys of `/metrics`.
    pub metrics: Option<KeyRing>,
}

impl KeyRings {
    /// The rings `config` sets: each role's own keys, and the internal key
    /// in the publishing and operating rings.
    pub fn of(config: &crate::HubConfig) -> Result<Self, AuthError> {
        let header = &config.internal_api_key_header;
        let with_internal = |keys: &[String]| -> Vec<String> {
            config
                .internal_api_key
                .iter()
                .chain(keys)
                .cloned()
                .collect()
        };
        let ring =
            |keys: Vec<String>, role| KeyRing::new(keys.iter().map(String::as_str), header, role);
        Ok(Self {
            publish: ring(with_internal(&config.publish_keys), Role::Publish)?,
            operate: ring(with_internal(&config.operator_keys), Role::Operate)?,
            metrics: ring(config.metrics_keys.clone(), Role::Metrics)?,
        })
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
