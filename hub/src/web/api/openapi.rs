//! The OpenAPI 3.1 description of the JSON APIs under `/api/v1`, and the
//! only way routes get there.
//!
//! [`ApiRoutes`] accepts nothing but what `utoipa_axum::routes!` makes of a
//! handler carrying `#[utoipa::path(...)]`: the path, method, parameters,
//! body and answers written on the handler are both the route and its
//! description, so a route added through it cannot be served undocumented
//! or documented unserved (the end-to-end tests look for routes added any
//! other way). The shared answers (refusals, failures) are the response
//! components below, referenced by name from each handler's attribute; the
//! security schemes name the headers this hub is configured with. The
//! document is built once, with the router, and served as it is at
//! `GET /api/v1/openapi.json`, to anyone: it describes, it grants nothing.

use axum::body::Bytes;
use axum::http::{HeaderName, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use utoipa::OpenApi;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Components, OpenApi as Document};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};

use super::ApiState;
use crate::intake::quota::ErrorBody;
use crate::web::auth::{
    DEFAULT_INTERNAL_API_KEY_HEADER, DEFAULT_USER_TOKEN_HEADER, KeyRing, UserTokens,
};

/// Where the APIs are mounted; the document's paths include it.
const PREFIX: &str = "/api/v1";

// The handlers' `security(...)` name these schemes again: the attribute
// takes only string literals. The API description test fails on a name
// that is not one of these.
/// The security scheme of the subscriber API: a user token.
const USER_TOKEN: &str = "bearer";
/// The security scheme of the operator API: the internal key.
const INTERNAL_KEY: &str = "internal_api_key";

/// Routes whose every method is described: built only from
/// `utoipa_axum::routes!(handler)`, so a handler without its
/// `#[utoipa::path]` does not compile into one.
pub(super) struct ApiRoutes(OpenApiRouter<ApiState>);

// The router inside holds no state worth printing, and utoipa's types
// implement `Debug` only behind a feature of theirs.
impl std::fmt::Debug for ApiRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiRoutes").finish_non_exhaustive()
    }
}

impl ApiRoutes {
    /// No routes yet.
    pub(super) fn new() -> Self {
        Self(OpenApiRouter::default())
    }

    /// Adds a documented handler: `.route(routes!(handler))`.
    pub(super) fn route(self, documented: UtoipaMethodRouter<ApiState>) -> Self {
        Self(self.0.routes(documented))
    }

    /// Adds `routes` beside these.
    pub(super) fn merge(self, routes: ApiRoutes) -> Self {
        Self(self.0.merge(routes.0))
    }

    /// Adds `routes` under `path`.
    pub(super) fn nest(self, path: &str, routes: ApiRoutes) -> Self {
        Self(self.0.nest(path, routes.0))
    }

    /// The routes under [`PREFIX`], serving their own description at
    /// `openapi.json` beside them, with the security schemes of `state`.
    pub(super) fn serve(self, state: &ApiState) -> Router<ApiState> {
        let routes = self.route(utoipa_axum::routes!(openapi_json));
        let (router, mut document) = OpenApiRouter::with_openapi(ApiDoc::openapi())
            .nest(PREFIX, routes.0)
            .split_for_parts();
        add_security_schemes(&mut document, state);
        // A document that does not serialise is a bug of the types above,
        // caught by any test that builds a router.
        let json = document
            .to_json()
            .unwrap_or_else(|error| panic!("the OpenAPI document does not serialise: {error}"));
        router.layer(Extension(OpenApiJson(Bytes::from(json))))
    }
}

/// The document, serialised once.
#[derive(Debug, Clone)]
struct OpenApiJson(Bytes);

/// The description of these APIs (this document).
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "meta",
    security(()),
    responses((status = 200, description = "This OpenAPI 3.1 document.", body = serde_json::Value)),
)]
async fn openapi_json(Extension(document): Extension<OpenApiJson>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document.0).into_response()
}

/// What every document starts from: its info, tags, and the shared answers
/// the handlers refer to by name.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "websub-hub",
        description = "The JSON APIs of a WebSub hub: the subscriber API (a user token, by \
            default `Authorization: Bearer <JWT>`) and the operator API (the internal API \
            key). Refusals and failures are answered with a plain-text reason, except \
            quota errors, which are JSON; a failure on the hub's side names the request id \
            (also in the `x-request-id` header of every answer) under which its log keeps \
            the cause.",
    ),
    tags(
        (name = "subscriber", description = "The caller's own subscriptions, usage and \
            verifications, by user token."),
        (name = "operator", description = "What the hub holds, could not deliver, and has \
            not yet done, behind the internal API key."),
        (name = "meta", description = "This description."),
    ),
    // A response named in a handler's attribute and missing here is a
    // dangling reference, which the validator in the end-to-end tests
    // refuses.
    components(
        schemas(ErrorBody),
        responses(
            BadRequest,
            Unauthenticated,
            NoSubscriberApi,
            TokenTooLarge,
            WrongKey,
            NoInternalKey,
            Unavailable,
        ),
    ),
)]
struct ApiDoc;

/// The schemes carry the header names this hub reads: a user token in
/// `Authorization` is a bearer token; in a header of its own, it may be
/// bare, which OpenAPI can only say as an API key.
fn add_security_schemes(document: &mut Document, state: &ApiState) {
    let user_header = spelled(
        state.user_tokens.as_ref().map(UserTokens::header),
        DEFAULT_USER_TOKEN_HEADER,
    );
    let user_token = if user_header.eq_ignore_ascii_case(DEFAULT_USER_TOKEN_HEADER) {
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("JWT")
                .description(Some(
                    "An HS256 JWT with `sub` (the user) and `exp`, signed with the hub's \
                     user token key.",
                ))
                .build(),
        )
    } else {
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
            user_header,
            "An HS256 JWT with `sub` (the user) and `exp`, signed with the hub's user \
             token key, bare or as `Bearer <token>`."
                .to_owned(),
        )))
    };
    let key_header = spelled(
        state.keys.operate.as_ref().map(KeyRing::header),
        DEFAULT_INTERNAL_API_KEY_HEADER,
    );
    let internal_key = SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
        key_header,
        "A key of the operator role (`operator-keys`, or the hub's internal API key; at \
         least 32 characters). Fat pings take a key of the publishing role in the same \
         header."
            .to_owned(),
    )));
    let components = document.components.get_or_insert_with(Components::new);
    components.add_security_scheme(USER_TOKEN, user_token);
    components.add_security_scheme(INTERNAL_KEY, internal_key);
}

/// A header's name as documentation spells it: header names are kept in
/// lower case, which is correct but not how the default is written.
fn spelled(header: Option<&HeaderName>, default: &str) -> String {
    match header {
        Some(header) if !header.as_str().eq_ignore_ascii_case(default) => header.to_string(),
        _ => default.to_owned(),
    }
}

pub(super) use answers::{
    BadRequest, NoInternalKey, NoSubscriberApi, TokenTooLarge, Unauthenticated, Unavailable,
    WrongKey,
};

/// The shared answers, as response components. The handlers answer with
/// `ApiError`, whose bodies are these plain-text reasons.
#[allow(
    dead_code,
    reason = "descriptions only, never built: each field is the schema of a body"
)]
mod answers {
    use utoipa::ToResponse;

    /// The query or body is not one this route accepts; the reason says why.
    #[derive(ToResponse)]
    #[response(content_type = "text/plain")]
    pub(crate) struct BadRequest(String);

    /// No valid user token: missing, malformed, expired, not HS256, badly
    /// signed, or naming no subject. The reason says which.
    #[derive(ToResponse)]
    #[response(
        content_type = "text/plain",
        headers((
            "WWW-Authenticate" = String,
            description = "`Bearer`, or `Bearer error=\"invalid_token\"` when a token was sent."
        ))
    )]
    pub(crate) struct Unauthenticated(String);

    /// This hub has no user token key configured, so it has no subscriber API.
    #[derive(ToResponse)]
    #[response(content_type = "text/plain")]
    pub(crate) struct NoSubscriberApi(String);

    /// The user token header is larger than 8 KiB.
    #[derive(ToResponse)]
    #[response(content_type = "text/plain")]
    pub(crate) struct TokenTooLarge(String);

    /// The key is missing or not one of the role's (an operator key, or a
    /// publishing key for a fat ping).
    #[derive(ToResponse)]
    #[response(content_type = "text/plain")]
    pub(crate) struct WrongKey(String);

    /// This hub has no key of the role configured (nor an internal API
    /// key), so every request of the role is refused.
    #[derive(ToResponse)]
    #[response(content_type = "text/plain")]
    pub(crate) struct NoInternalKey(String);

    /// A store the answer needs (subscriptions, event log or backlog) failed;
    /// the reason says which, and names the request id under which the
    /// hub's log keeps the cause. The same request may succeed later.
    #[derive(ToResponse)]
    #[response(
        content_type = "text/plain",
        headers(("Retry-After" = u32, description = "Seconds to wait before trying again."))
    )]
    pub(crate) struct Unavailable(String);
}
