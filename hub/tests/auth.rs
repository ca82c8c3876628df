//! User tokens and the internal key: what is admitted, what is refused and
//! with which answer, checked on header maps and through the hub's own
//! routes.

#![cfg(feature = "testing")]

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::IntoResponse;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::TimeDelta;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use tower::ServiceExt;
use websub_hub::HubConfig;
use websub_hub::web::api::ApiError;
use websub_hub::web::auth::{
    AuthError, DEFAULT_INTERNAL_API_KEY_HEADER, DEFAULT_USER_TOKEN_HEADER, KeyRing, KeyRings,
    MAX_TOKEN_BYTES, MIN_INTERNAL_KEY_CHARS, Role, UserTokens, issue_token,
};

const SECRET: &str = "the key user tokens are signed with";
const INTERNAL: &str = "an-internal-key-that-is-long-enough-0123";
const HOUR: TimeDelta = TimeDelta::hours(1);

fn tokens() -> UserTokens {
    UserTokens::new(SECRET, DEFAULT_USER_TOKEN_HEADER).expect("a valid configuration")
}

fn with(name: &str, value: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
        HeaderValue::from_str(value).expect("a header value"),
    );
    headers
}

fn bearer(token: &str) -> HeaderMap {
    with("authorization", &format!("Bearer {token}"))
}

/// A token signed by hand, for the shapes `issue_token` never makes.
fn signed(alg: Algorithm, key: &str, claims: &serde_json::Value) -> String {
    jsonwebtoken::encode(
        &Header::new(alg),
        claims,
        &EncodingKey::from_secret(key.as_bytes()).expect("a key"),
    )
    .expect("signs")
}

/// `message` (encoded header and claims) with its HS256 signature.
fn sign_raw(message: &str) -> String {
    let key = EncodingKey::from_secret(SECRET.as_bytes()).expect("a key");
    let signature =
        jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::HS256).expect("signs");
    format!("{message}.{signature}")
}

fn in_an_hour() -> i64 {
    (chrono::Utc::now() + HOUR).timestamp()
}

// ---------------------------------------------------------------------------
// User tokens
// ---------------------------------------------------------------------------

#[test]
fn a_valid_token_yields_its_user() {
    let token = issue_token(
        SECRET,
        "user-42",
        Some(json!({"tier": "supporter", "active": true})),
        HOUR,
    );
    let user = tokens().authenticate(&bearer(&token)).expect("valid");
    assert_eq!(user.id, "user-42");
    assert_eq!(
        user.subscription,
        Some(json!({"tier": "supporter", "active": true}))
    );
    assert_eq!(user.token, token);
    assert!(
        !format!("{user:?}").contains(&token),
        "Debug hides the token"
    );

    let plain = issue_token(SECRET, "user-7", Some(json!("pro")), HOUR);
    let user = tokens().authenticate(&bearer(&plain)).expect("valid");
    assert_eq!(user.subscription, Some(json!("pro")));

    let none = issue_token(SECRET, "user-8", None, HOUR);
    assert_eq!(
        tokens()
            .authenticate(&bearer(&none))
            .expect("valid")
            .subscription,
        None
    );
}

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    let token = issue_token(SECRET, "u", None, HOUR);
    let user = tokens()
        .authenticate(&with("Authorization", &format!("bearer {token}")))
        .expect("valid");
    assert_eq!(user.id, "u");
}

#[test]
fn a_missing_or_non_bearer_credential_is_missing_token() {
    let token = issue_token(SECRET, "u", None, HOUR);
    for headers in [
        HeaderMap::new(),
        with("authorization", &format!("Basic {token}")),
        // A bare token needs the Bearer scheme in Authorization.
        with("authorization", &token),
        with("authorization", "Bearer "),
        // The token in another header is not looked at.
        with("x-user-token", &token),
    ] {
        assert_eq!(
            tokens().authenticate(&headers).map(|user| user.id),
            Err(AuthError::MissingToken),
            "{headers:?}"
        );
    }
}

#[test]
fn a_malformed_token_is_refused() {
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = URL_SAFE_NO_PAD.encode(r#"{"sub":"u","exp":99999999999}"#);
    for token in [
        "not-a-jwt".to_owned(),
        "a.b".to_owned(),
        "a.b.c.d".to_owned(),
        "!!!.???.***".to_owned(),
        format!("{header}.{claims}"),
        // A header without alg.
        format!(
            "{}.{claims}.sig",
            URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT"}"#)
        ),
        // Claims that are not JSON, properly signed.
        sign_raw(&format!("{header}.{}", URL_SAFE_NO_PAD.encode("not json"))),
    ] {
        assert_eq!(
            tokens().authenticate(&bearer(&token)).map(|user| user.id),
            Err(AuthError::MalformedToken),
            "{token}"
        );
    }
    // Claims of the wrong type, properly signed.
    let numeric_sub = signed(
        Algorithm::HS256,
        SECRET,
        &json!({"sub": 42, "exp": in_an_hour()}),
    );
    assert_eq!(
        tokens().authenticate(&bearer(&numeric_sub)).map(|u| u.id),
        Err(AuthError::MalformedToken)
    );
}

#[test]
fn a_token_over_the_size_bound_is_refused_unread_even_when_signed() {
    // The subject pads the token; the signature is right.
    let sized = |bytes: usize| issue_token(SECRET, &"u".repeat(bytes), None, HOUR);
    let fits = sized(4 * 1024);
    assert!(format!("Bearer {fits}").len() <= MAX_TOKEN_BYTES);
    assert!(tokens().authenticate(&bearer(&fits)).is_ok());
    for bytes in [MAX_TOKEN_BYTES, 20 * 1024, 100 * 1024] {
        let token = sized(bytes);
        let refused = tokens().authenticate(&bearer(&token)).map(|user| user.id);
        assert_eq!(refused, Err(AuthError::TokenTooLarge), "{bytes}");
    }
    let response = ApiError::from(AuthError::TokenTooLarge).into_response();
    assert_eq!(
        response.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    assert!(response.headers().get(header::WWW_AUTHENTICATE).is_none());
}

#[test]
fn an_expired_token_is_refused() {
    let expired = issue_token(SECRET, "u", None, TimeDelta::seconds(-5));
    assert_eq!(
        tokens().authenticate(&bearer(&expired)).map(|u| u.id),
        Err(AuthError::ExpiredToken)
    );
}

#[test]
fn a_token_without_expiry_is_refused() {
    let forever = signed(Algorithm::HS256, SECRET, &json!({"sub": "u"}));
    assert_eq!(
        tokens().authenticate(&bearer(&forever)).map(|u| u.id),
        Err(AuthError::MissingExpiry)
    );
}

#[test]
fn a_token_signed_with_another_key_is_refused() {
    let forged = issue_token("some other key", "u", None, HOUR);
    assert_eq!(
        tokens().authenticate(&bearer(&forged)).map(|u| u.id),
        Err(AuthError::BadSignature)
    );
    // A valid token with the first character of its signature changed (the
    // last one may carry only padding bits).
    let valid = issue_token(SECRET, "u", None, HOUR);
    let at = valid.rfind('.').expect("a signature") + 1;
    let swapped = if valid[at..].starts_with('A') {
        "B"
    } else {
        "A"
    };
    let tampered = format!("{}{swapped}{}", &valid[..at], &valid[at + 1..]);
    assert_eq!(
        tokens().authenticate(&bearer(&tampered)).map(|u| u.id),
        Err(AuthError::BadSignature)
    );
}

#[test]
fn only_hs256_is_accepted() {
    let claims = json!({"sub": "u", "exp": in_an_hour()});
    // alg "none": no signature at all.
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    // Signed with the right key, but with another HMAC.
    let hs384 = signed(Algorithm::HS384, SECRET, &claims);
    let hs512 = signed(Algorithm::HS512, SECRET, &claims);
    // An HS256 signature under a header that claims RS256.
    let hs256 = signed(Algorithm::HS256, SECRET, &claims);
    let mut parts = hs256.splitn(2, '.');
    let (_, rest) = (parts.next(), parts.next().expect("claims and signature"));
    let rs256 = format!(
        "{}.{rest}",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","typ":"JWT"}"#)
    );
    for token in [none, hs384, hs512, rs256] {
        assert_eq!(
            tokens().authenticate(&bearer(&token)).map(|u| u.id),
            Err(AuthError::WrongAlgorithm),
            "{token}"
        );
    }
    assert!(tokens().authenticate(&bearer(&hs256)).is_ok());
}

#[test]
fn a_token_without_a_subject_is_refused() {
    for claims in [
        json!({"exp": in_an_hour()}),
        json!({"sub": "", "exp": in_an_hour()}),
        json!({"sub": null, "exp": in_an_hour()}),
    ] {
        let token = signed(Algorithm::HS256, SECRET, &claims);
        assert_eq!(
            tokens().authenticate(&bearer(&token)).map(|u| u.id),
            Err(AuthError::MissingSubject),
            "{claims}"
        );
    }
}

#[test]
fn a_custom_header_takes_a_bare_or_bearer_token() {
    let custom = UserTokens::new(SECRET, "X-User-Token").expect("valid");
    let token = issue_token(SECRET, "custom-user", None, HOUR);
    for value in [token.clone(), format!("Bearer {token}")] {
        assert_eq!(
            custom
                .authenticate(&with("x-user-token", &value))
                .map(|u| u.id),
            Ok("custom-user".to_owned())
        );
    }
    assert_eq!(
        custom.authenticate(&bearer(&token)).map(|u| u.id),
        Err(AuthError::MissingToken),
        "Authorization is not read when another header is configured"
    );
}

#[test]
fn user_tokens_need_a_key_and_a_valid_header() {
    assert!(matches!(
        UserTokens::new("", DEFAULT_USER_TOKEN_HEADER),
        Err(AuthError::InvalidConfig(_))
    ));
    assert!(matches!(
        UserTokens::new(SECRET, "bad header"),
        Err(AuthError::InvalidConfig(_))
    ));
}

// ---------------------------------------------------------------------------
// The internal key
// ---------------------------------------------------------------------------

fn ring(keys: &[&str]) -> KeyRing {
    KeyRing::new(
        keys.iter().copied(),
        DEFAULT_INTERNAL_API_KEY_HEADER,
        Role::Operate,
    )
    .expect("long enough")
    .expect("some keys")
}

#[test]
fn a_short_key_is_refused_at_construction() {
    let short = "x".repeat(MIN_INTERNAL_KEY_CHARS - 1);
    match KeyRing::new(
        [INTERNAL, short.as_str()],
        DEFAULT_INTERNAL_API_KEY_HEADER,
        Role::Publish,
    ) {
        Err(AuthError::InvalidConfig(reason)) => {
            assert!(
                reason.contains(&MIN_INTERNAL_KEY_CHARS.to_string()),
                "{reason}"
            );
            assert!(reason.contains("publish-keys"), "{reason}");
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }
    // Characters, not bytes: 32 two-byte characters are enough, 31 are not.
    let long = "é".repeat(32);
    let short = "é".repeat(31);
    assert!(
        KeyRing::new(
            [long.as_str()],
            DEFAULT_INTERNAL_API_KEY_HEADER,
            Role::Operate
        )
        .is_ok()
    );
    assert!(
        KeyRing::new(
            [short.as_str()],
            DEFAULT_INTERNAL_API_KEY_HEADER,
            Role::Operate
        )
        .is_err()
    );
    assert!(matches!(
        KeyRing::new([INTERNAL], "bad header", Role::Operate),
        Err(AuthError::InvalidConfig(_))
    ));
    assert!(
        KeyRing::new([], DEFAULT_INTERNAL_API_KEY_HEADER, Role::Metrics)
            .expect("nothing to check")
            .is_none()
    );
}

#[test]
fn every_key_of_a_ring_is_checked() {
    const OTHER: &str = "another-key-that-is-long-enough-0123456";
    let key = ring(&[INTERNAL, OTHER]);
    assert_eq!(key.check(&HeaderMap::new()), Err(AuthError::MissingKey));
    assert_eq!(
        key.check(&with(DEFAULT_INTERNAL_API_KEY_HEADER, "wrong")),
        Err(AuthError::WrongKey)
    );
    let almost = format!("{}X", &INTERNAL[..INTERNAL.len() - 1]);
    assert_eq!(
        key.check(&with(DEFAULT_INTERNAL_API_KEY_HEADER, &almost)),
        Err(AuthError::WrongKey)
    );
    assert_eq!(
        key.check(&with(
            DEFAULT_INTERNAL_API_KEY_HEADER,
            &format!("{INTERNAL} ")
        )),
        Err(AuthError::WrongKey)
    );
    assert_eq!(
        key.check(&with("x-other", INTERNAL)),
        Err(AuthError::MissingKey)
    );
    let first = key
        .check(&with(DEFAULT_INTERNAL_API_KEY_HEADER, INTERNAL))
        .expect("the first key");
    let second = key
        .check(&with(DEFAULT_INTERNAL_API_KEY_HEADER, OTHER))
        .expect("the second key");
    assert_ne!(first, second, "each key has its own id");
    assert!(!first.0.contains(INTERNAL), "an id is not the key");
    assert!(key.holds(&first) && key.holds(&second));
    assert!(!ring(&[OTHER]).holds(&first), "a ring without it");
    // A bearer credential only where asked for.
    assert_eq!(key.check(&bearer(INTERNAL)), Err(AuthError::MissingKey));
    assert_eq!(key.check_or_bearer(&bearer(INTERNAL)), Ok(first));
    assert_eq!(
        key.check_or_bearer(&bearer("a-wrong-key")),
        Err(AuthError::WrongKey)
    );
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

#[test]
fn the_internal_key_is_a_key_of_every_role_but_metrics() {
    const PUBLISH: &str = "a-publishing-key-that-is-long-enough-012";
    let config = HubConfig {
        internal_api_key: Some(INTERNAL.to_owned()),
        publish_keys: vec![PUBLISH.to_owned()],
        internal_api_key_header: "X-Service-Key".to_owned(),
        ..HubConfig::default()
    };
    let rings = KeyRings::of(&config).expect("valid");
    let shown = format!("{rings:?}");
    assert!(
        !shown.contains(INTERNAL) && !shown.contains(PUBLISH),
        "{shown}"
    );
    let publish = rings.publish.expect("publishing keys");
    let operate = rings.operate.expect("operator keys");
    assert!(rings.metrics.is_none(), "metrics stay open");
    assert_eq!(publish.header().as_str(), "x-service-key");
    assert!(publish.matches(INTERNAL.as_bytes()).is_some());
    assert!(publish.matches(PUBLISH.as_bytes()).is_some());
    assert!(operate.matches(INTERNAL.as_bytes()).is_some());
    assert!(operate.matches(PUBLISH.as_bytes()).is_none());

    let none = KeyRings::of(&HubConfig::default()).expect("valid");
    assert!(none.publish.is_none() && none.operate.is_none() && none.metrics.is_none());
    let short = HubConfig {
        metrics_keys: vec!["short".to_owned()],
        ..HubConfig::default()
    };
    assert!(matches!(
        KeyRings::of(&short),
        Err(AuthError::InvalidConfig(_))
    ));
}

// ---------------------------------------------------------------------------
// Answers
// ---------------------------------------------------------------------------

#[tokio::test]
async fn errors_answer_401_with_a_reason_and_500_for_configuration() {
    for error in [
        AuthError::MissingToken,
        AuthError::MalformedToken,
        AuthError::MissingExpiry,
        AuthError::ExpiredToken,
        AuthError::BadSignature,
        AuthError::WrongAlgorithm,
        AuthError::MissingSubject,
    ] {
        let response = ApiError::from(error.clone()).into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{error:?}");
        let challenge = response
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .expect("a Bearer challenge");
        assert!(challenge.as_bytes().starts_with(b"Bearer"));
    }
    for error in [AuthError::MissingKey, AuthError::WrongKey] {
        let response = ApiError::from(error).into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(response.headers().get(header::WWW_AUTHENTICATE).is_none());
    }
    let response = ApiError::from(AuthError::InvalidConfig(
        "the key is 3 characters".to_owned(),
    ))
    .into_response();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .expect("a body");
    assert!(
        !String::from_utf8_lossy(&body).contains("3 characters"),
        "the reason stays in the log"
    );
}

/// A hub with both keys, on a scratch SQLite file removed when dropped.
struct ScratchHub {
    router: axum::Router,
    database: std::path::PathBuf,
}

impl Drop for ScratchHub {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.database.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

async fn scratch_hub() -> ScratchHub {
    websub_hub::delivery::net::install_crypto_provider();
    let database = websub_storetest::scratch::path("auth.db");
    let config = HubConfig {
        database_url: format!("sqlite:{}", database.display()),
        store: Some("memory".to_owned()),
        internal_api_key: Some(INTERNAL.to_owned()),
        user_token_key: Some(SECRET.to_owned()),
        ..HubConfig::default()
    };
    let hub = websub_hub::server::Hub::open(config)
        .await
        .expect("open the hub");
    ScratchHub {
        router: hub.router(),
        database,
    }
}

async fn get(
    hub: &ScratchHub,
    path: &str,
    header: Option<(&str, &str)>,
) -> (StatusCode, HeaderMap, String) {
    let mut request = Request::get(path);
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    let response = hub
        .router
        .clone()
        .oneshot(request.body(Body::empty()).expect("a request"))
        .await
        .expect("answered");
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("a body");
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn the_hub_routes_admit_and_refuse_with_these_answers() {
    let hub = scratch_hub().await;
    let token = issue_token(SECRET, "http-user", None, HOUR);
    let bearer = format!("Bearer {token}");

    let (status, _, body) = get(
        &hub,
        "/api/v1/subscriptions",
        Some(("authorization", &bearer)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "[]");

    let (status, headers, body) = get(&hub, "/api/v1/subscriptions", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        headers.get(header::WWW_AUTHENTICATE),
        Some(&HeaderValue::from_static("Bearer"))
    );
    assert_eq!(body.trim_end(), AuthError::MissingToken.to_string());

    let expired = format!(
        "Bearer {}",
        issue_token(SECRET, "u", None, TimeDelta::seconds(-5))
    );
    let (status, headers, body) = get(
        &hub,
        "/api/v1/subscriptions",
        Some(("authorization", &expired)),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        headers.get(header::WWW_AUTHENTICATE),
        Some(&HeaderValue::from_static("Bearer error=\"invalid_token\""))
    );
    assert_eq!(body.trim_end(), AuthError::ExpiredToken.to_string());

    let (status, _, body) = get(
        &hub,
        "/api/v1/operator/topics",
        Some((DEFAULT_INTERNAL_API_KEY_HEADER, INTERNAL)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, headers, _) = get(
        &hub,
        "/api/v1/operator/topics",
        Some((DEFAULT_INTERNAL_API_KEY_HEADER, "guess")),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers.get(header::WWW_AUTHENTICATE).is_none());
}
