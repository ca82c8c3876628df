//! The one answer every route gives when it does not succeed: the hub
//! endpoint, the JSON APIs and the admin page alike. Domain errors convert
//! into it (`?` in a handler), so a reason is worded once per cause. A
//! `4xx` says what was wrong with the request; a `5xx` says what failed in
//! words a client can act on and names the request id under which the log
//! keeps the cause. Backend text (a database's, a driver's) never reaches a
//! body.
//!
//! Every request gets an id ([`layers`]): the caller's `x-request-id` when
//! it sent one, a fresh UUID otherwise; the answer carries it back in the
//! same header, tower-http's trace span of the request holds it, and so
//! does the log line of every failure.

use axum::Json;
use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::request_id::{
    MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::{Level, debug, error, warn};

use crate::intake::publish::IntakeError;
use crate::intake::quota::QuotaError;
use crate::storage::backlog::BacklogError;
use crate::storage::events::EventLogError;
use crate::web::auth::AuthError;
use websub_store::StoreError;

/// Requests answered 503 with `Retry-After`: not accepted, to be sent again.
pub const SHED_TOTAL: &str = "websub_requests_shed_total";

/// The `Retry-After` of a 503: long enough for a backlog to move or a
/// database to come back, short enough that clients do not give up.
const RETRY_AFTER_SECONDS: u32 = 5;

tokio::task_local! {
    /// The id of the request being answered, for the bodies and log lines
    /// of its failures.
    static REQUEST_ID: HeaderValue;
}

/// An answer that is not a success: a status, a reason, and the headers
/// the status calls for.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) reason: String,
    /// A body with a contract of its own (the quota's JSON), sent instead
    /// of the plain-text reason.
    json: Option<serde_json::Value>,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// What the log keeps of a failure on the hub's side.
    cause: Option<String>,
}

impl ApiError {
    /// An answer of `status` saying `reason`.
    pub fn new(status: StatusCode, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
            json: None,
            headers: Vec::new(),
            cause: None,
        }
    }

    /// A `503 Service Unavailable` with `Retry-After`: the request was not
    /// accepted, nothing of it was kept, and the same request may succeed
    /// later.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, reason)
            .with_header(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS))
    }

    /// A part of the hub failed: `reason` for the client (with the request
    /// id appended), `cause` for the log only.
    pub fn failed(status: StatusCode, reason: &str, cause: impl std::fmt::Display) -> Self {
        let mut error = Self::new(status, reason);
        error.cause = Some(cause.to_string());
        if status == StatusCode::SERVICE_UNAVAILABLE {
            error = error.with_header(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        error
    }

    /// An outbox feed's producer database failed (`cause`, for the log).
    pub fn producer_failed(cause: sqlx::Error) -> Self {
        Self::failed(
            StatusCode::SERVICE_UNAVAILABLE,
            "a producer's database is unavailable; try again later",
            cause,
        )
    }

    /// The way to the admin page's login, for a page asked for without a
    /// session.
    pub fn login() -> Self {
        Self::new(StatusCode::SEE_OTHER, "log in first")
            .with_header(header::LOCATION, HeaderValue::from_static("/admin/login"))
    }

    /// The same answer, carrying `name: value` too.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::UnknownSubscription { .. } => {
                Self::new(StatusCode::NOT_FOUND, "no such subscription")
            }
            error => Self::failed(
                StatusCode::SERVICE_UNAVAILABLE,
                "the subscription store is unavailable; try again later",
                error,
            ),
        }
    }
}

impl From<EventLogError> for ApiError {
    fn from(error: EventLogError) -> Self {
        match error {
            EventLogError::UnknownEvent(id) => {
                Self::new(StatusCode::NOT_FOUND, format!("no event {id} in the log"))
            }
            error => Self::failed(
                StatusCode::SERVICE_UNAVAILABLE,
                "the event log is unavailable; try again later",
                error,
            ),
        }
    }
}

impl From<BacklogError> for ApiError {
    fn from(error: BacklogError) -> Self {
        Self::failed(
            StatusCode::SERVICE_UNAVAILABLE,
            "the hub could not record or read its work in hand; try again later",
            error,
        )
    }
}

impl From<IntakeError> for ApiError {
    fn from(error: IntakeError) -> Self {
        match error {
            IntakeError::TooLarge { limit } => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the content is larger than {limit} bytes"),
            ),
            IntakeError::Backlog(error) => error.into(),
            error => Self::failed(
                StatusCode::SERVICE_UNAVAILABLE,
                "the hub could not record the content; try again later",
                error,
            ),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(error: AuthError) -> Self {
        if let AuthError::InvalidConfig(_) = error {
            return Self::failed(
                StatusCode::INTERNAL_SERVER_ERROR,
                "authentication is misconfigured on this hub",
                error,
            );
        }
        let status = error.status();
        let challenge = error.challenge();
        let answer = Self::new(status, error.to_string());
        match challenge {
            Some(challenge) => answer.with_header(header::WWW_AUTHENTICATE, challenge),
            None => answer,
        }
    }
}

impl From<&QuotaError> for ApiError {
    fn from(error: &QuotaError) -> Self {
        let body = crate::intake::quota::ErrorBody::from(error);
        let mut answer = Self::new(error.status(), body.message.clone());
        answer.json = serde_json::to_value(body).ok();
        if error.status().is_server_error() {
            answer.cause = Some(crate::delivery::error_chain(error));
        }
        answer
    }
}

impl From<QuotaError> for ApiError {
    fn from(error: QuotaError) -> Self {
        Self::from(&error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let request_id = REQUEST_ID.try_with(HeaderValue::clone).ok();
        let request = request_id
            .as_ref()
            .and_then(|id| id.to_str().ok())
            .unwrap_or("-");
        let retry_later = self
            .headers
            .iter()
            .any(|(name, _)| name == header::RETRY_AFTER);
        if retry_later {
            metrics::counter!(SHED_TOTAL).increment(1);
        }
        let status = self.status.as_u16();
        if let Some(cause) = &self.cause {
            if retry_later {
                warn!(status, reason = %self.reason, %cause, request, "request failed");
            } else {
                error!(status, reason = %self.reason, %cause, request, "request failed");
            }
        } else if retry_later {
            // Shedding is the hub working as designed; under a flood a line
            // per request would bury everything else.
            debug!(status, reason = %self.reason, request, "request shed");
        } else if self.status.is_server_error() {
            error!(status, reason = %self.reason, request, "request failed");
        } else {
            debug!(status, reason = %self.reason, request, "request refused");
        }
        let mut response = match self.json {
            Some(json) => (self.status, Json(json)).into_response(),
            None => {
                let mut reason = self.reason;
                if self.status.is_server_error() && request_id.is_some() {
                    reason.push_str(&format!(" (request id {request})"));
                }
                reason.push('\n');
                (
                    self.status,
                    [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                    reason,
                )
                    .into_response()
            }
        };
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        response
    }
}

/// `router` with request ids and request logging: each request gets an id
/// (see the module docs), runs inside a tower-http trace span holding it
/// (requests and answers logged at `debug`, failures at `warn`), and its
/// failures name it.
pub fn layers(router: Router) -> Router {
    let x_request_id = HeaderName::from_static("x-request-id");
    router
        .layer(axum::middleware::from_fn(scope_request_id))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request| {
                    let id = request
                        .extensions()
                        .get::<RequestId>()
                        .and_then(|id| id.header_value().to_str().ok())
                        .unwrap_or("-");
                    // tower-http's own target, so that `tower_http=debug`
                    // turns the span on with the events inside it.
                    tracing::debug_span!(
                        target: "tower_http::trace::make_span",
                        "request",
                        method = %request.method(),
                        path = request.uri().path(),
                        request = id,
                    )
                })
                .on_response(DefaultOnResponse::new().level(Level::DEBUG))
                .on_failure(DefaultOnFailure::new().level(Level::DEBUG)),
        )
        .layer(PropagateRequestIdLayer::new(x_request_id.clone()))
        .layer(SetRequestIdLayer::new(x_request_id, MakeRequestUuid))
}

/// Runs the rest of the request with its id at hand.
async fn scope_request_id(request: Request, next: Next) -> Response {
    match request.extensions().get::<RequestId>() {
        Some(id) => {
            let id = id.header_value().clone();
            REQUEST_ID.scope(id, next.run(request)).await
        }
        None => next.run(request).await,
    }
}
