//! The HTTP adapter: routes, request parsing and error mapping. Handlers
//! parse, call the domain (subscriptions, intake, the event log), and turn
//! its errors into the one error answer (`error`: a 4xx or 5xx with a
//! reason, and the request ids every request gets); they hold no logic of
//! their own.
//!
//! - `/`: the WebSub hub endpoint (subscribe, unsubscribe, publish);
//! - `/topics/…`: topics the hub itself publishes (outbox feeds), answering
//!   discovery;
//! - `/api/v1/subscriptions`, `/api/v1/usage`: the subscriber API
//!   (`subscriber`), with a user token;
//! - `/api/v1/operator/…`: the operator API (`operator`), with an operator
//!   key;
//! - `/api/v1/openapi.json`: the OpenAPI description of both (`openapi`),
//!   which is also the only way a route gets under `/api/v1`;
//! - the admin page (`/admin`) and the subscriber portal (`/portal`) are
//!   routers of their own, merged beside these by the server;
//! - `/healthz` (the process answers), `/readyz` (its databases answer and
//!   are migrated, `health`), `/metrics` (with a metrics key when the hub
//!   has any).

mod admin_sessions;
mod backlog;
mod delivery_order;
pub(crate) mod denials;
pub(crate) mod endpoints;
mod error;
mod feeds;
mod health;
pub(crate) mod history;
mod openapi;
pub(crate) mod operator;
mod own_deliveries;
mod portal_links;
pub(crate) mod redeliver;
mod requests;
mod retention;
pub(crate) mod signing;
mod subscriber;
pub(crate) mod subscription;
mod webhooks;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::clock::Clock;
use crate::delivery::websub::{Distributor, link_header};
use crate::intake::publish::{DEFAULT_CONTENT_TYPE, Intake};
use crate::intake::quota::QuotaError;
use crate::intake::verify::Subscriptions;
use crate::protocol::{self, HubRequest, Mode, SubscriptionRequest};
use crate::storage::backlog::Admission;
use crate::storage::events::EventLog;
use crate::telemetry::traces;
use crate::web::auth::{AuthError, KeyRing, KeyRings, Role, User, UserTokens};
use websub_store::SubscriptionStore;

pub use error::{ApiError, SHED_TOTAL, layers};
pub use requests::{HTTP_REQUEST_SECONDS, HTTP_REQUESTS_TOTAL};

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The subscription workflow.
    pub subscriptions: Subscriptions,
    /// Content intake.
    pub intake: Intake,
    /// The subscription store, read by the APIs.
    pub store: Arc<dyn SubscriptionStore>,
    /// The event log, read by the APIs.
    pub events: Arc<dyn EventLog>,
    /// The dispatcher, woken when the APIs make records due.
    pub dispatcher: Distributor,
    /// The hub's clock.
    pub clock: Arc<dyn Clock>,
    /// The hub URL announced in `rel="hub"`.
    pub public_url: Arc<str>,
    /// The keys of each role.
    pub keys: KeyRings,
    /// Checks user tokens, when a key is configured.
    pub user_tokens: Option<UserTokens>,
    /// The largest form accepted.
    pub max_form_bytes: usize,
    /// The largest content accepted.
    pub max_content_bytes: usize,
    /// Renders `/metrics`, when the binary installed a recorder.
    pub metrics: Option<PrometheusHandle>,
    /// How long events are kept, when the hub purges them; a replay from
    /// before it is refused.
    pub retention: Option<std::time::Duration>,
    /// The running outbox feeds.
    pub feeds: crate::intake::feed::Feeds,
}

/// The hub's routes (see the module docs).
pub fn router(state: ApiState) -> Router {
    let body_limit = state.max_content_bytes.max(state.max_form_bytes);
    let apis = subscriber::routes()
        .nest("/operator", operator_routes())
        .serve(&state);
    Router::new()
        .route("/", post(hub_endpoint).get(about))
        .route("/topics/{*name}", get(topic))
        .merge(apis)
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(health::ready))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(body_limit))
        .route_layer(axum::middleware::from_fn(requests::count_requests))
        .with_state(state)
}

/// The operator routes, nested under `/api/v1/operator`, each module's
/// gathered here so that none of them needs another's.
fn operator_routes() -> openapi::ApiRoutes {
    use utoipa_axum::routes;
    operator::routes()
        .route(routes!(history::delivery))
        .route(routes!(history::deliveries))
        .merge(redeliver::routes())
        .merge(endpoints::routes())
        .merge(webhooks::routes())
        .route(routes!(backlog::operator_intents))
        .route(routes!(backlog::fetches))
        .route(routes!(subscription::show))
        .route(routes!(subscription::delete))
        .route(routes!(delivery_order::operator))
        .route(routes!(feeds::list))
        .route(routes!(retention::purge))
        .merge(admin_sessions::routes())
        .merge(denials::routes())
        .merge(portal_links::routes())
}

async fn about() -> &'static str {
    "This is a WebSub hub. POST hub.mode=subscribe|unsubscribe|publish here.\n"
}

/// A topic the hub publishes itself (an outbox feed's): the discovery
/// headers, with the latest content when there is any.
async fn topic(State(state): State<ApiState>, uri: axum::http::Uri) -> Result<Response, ApiError> {
    let path = uri.path().trim_start_matches('/');
    let topic = format!("{}{path}", state.public_url);
    let link = link_header(&state.public_url, &topic);
    let latest = state.events.latest(&topic).await?;
    Ok(match latest {
        Some(event) => (
            [
                (header::LINK, link),
                (header::CONTENT_TYPE, event.content_type),
            ],
            event.body,
        )
            .into_response(),
        None => (StatusCode::NO_CONTENT, [(header::LINK, link)]).into_response(),
    })
}

async fn metrics(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    if let Some(ring) = &state.keys.metrics
        && let Err(error) = ring.check_or_bearer(&headers)
    {
        return ApiError::new(
            error.status(),
            format!(
                "{error} (in the {} header, or as a bearer token)",
                ring.header()
            ),
        )
        .into_response();
    }
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => ApiError::new(StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

async fn hub_endpoint(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if let Some(topic) = fat_ping_topic(query.as_deref())? {
        return fat_ping(&state, topic, &headers, body).await;
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "expected a form (application/x-www-form-urlencoded), got {:?}",
                content_type
            ),
        ));
    }
    if body.len() > state.max_form_bytes {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the form is larger than {} bytes", state.max_form_bytes),
        ));
    }
    match protocol::parse_form(&body)
        .map_err(|error| ApiError::new(error.status(), error.to_string()))?
    {
        HubRequest::Subscription(mut request) => {
            state
                .subscriptions
                .check(&request)
                .await
                .map_err(|error| ApiError::new(StatusCode::BAD_REQUEST, error.to_string()))?;
            authorize_subscription(&state, &headers, &mut request).await?;
            match state.subscriptions.accept(request).await {
                Ok(Admission::Accepted) => {
                    Ok((StatusCode::ACCEPTED, "verification of intent pending\n").into_response())
                }
                Ok(Admission::Full { pending }) => Err(ApiError::unavailable(format!(
                    "{pending} verifications of intent are waiting, the most this hub holds; \
                     try again later"
                ))),
                Err(error) => Err(error.into()),
            }
        }
        HubRequest::Publish(request) => {
            for topic in &request.topics {
                state
                    .subscriptions
                    .check_topic(topic)
                    .await
                    .map_err(|error| ApiError::new(StatusCode::BAD_REQUEST, error.to_string()))?;
            }
            let span = request
                .topics
                .first()
                .and_then(|topic| traces::Intake::start(&headers, "publish", topic));
            match state.intake.ping(&request.topics, span).await {
                Ok(()) => Ok((StatusCode::ACCEPTED, "publish accepted\n").into_response()),
                Err(error) => Err(error.into()),
            }
        }
    }
}

/// The topic of a fat ping (`?hub.mode=publish&hub.topic=T`), if this is one.
fn fat_ping_topic(query: Option<&str>) -> Result<Option<String>, ApiError> {
    let Some(query) = query else {
        return Ok(None);
    };
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).map_err(|error| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("bad query string: {error}"),
        )
    })?;
    let mode = pairs.iter().find(|(key, _)| key == "hub.mode");
    if mode.is_none_or(|(_, mode)| mode != "publish") {
        return Ok(None);
    }
    let topics: Vec<&String> = pairs
        .iter()
        .filter(|(key, _)| key == "hub.topic" || key == "hub.url")
        .map(|(_, value)| value)
        .collect();
    match topics.as_slice() {
        [topic] => protocol::parse_topic(topic)
            .map(Some)
            .map_err(|error| ApiError::new(error.status(), error.to_string())),
        [] => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "a fat ping needs hub.topic in the query string",
        )),
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "a fat ping carries content for exactly one hub.topic",
        )),
    }
}

async fn fat_ping(
    state: &ApiState,
    topic: String,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    authorize(state.keys.publish.as_ref(), Role::Publish, headers)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or(DEFAULT_CONTENT_TYPE)
        .to_owned();
    match state
        .intake
        .record(
            topic.clone(),
            content_type,
            body,
            traces::Intake::start(headers, "publish", &topic),
        )
        .await
    {
        Ok(event) => Ok((
            StatusCode::ACCEPTED,
            format!("recorded event {}\n", event.id),
        )
            .into_response()),
        Err(error) => Err(error.into()),
    }
}

/// Requires a key of the operator role: 401 without the right one, 403
/// when the hub has none configured (then no operator request is
/// accepted).
pub fn authorize_operator(state: &ApiState, headers: &HeaderMap) -> Result<(), ApiError> {
    authorize(state.keys.operate.as_ref(), Role::Operate, headers)
}

/// Requires a key of `ring`, the ring of `role`.
fn authorize(ring: Option<&KeyRing>, role: Role, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ring) = ring else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "this hub has no {} configured (nor internal-api-key), so these requests are \
                 refused",
                role.setting()
            ),
        ));
    };
    ring.check(headers).map(drop).map_err(|error| {
        ApiError::new(
            error.status(),
            format!("{error} (in the {} header)", ring.header()),
        )
    })
}

/// The caller, by user token; an answer to send when there is none.
fn caller(state: &ApiState, headers: &HeaderMap) -> Result<User, ApiError> {
    let Some(tokens) = &state.user_tokens else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "the subscriber API needs a user token key, and this hub has none configured",
        ));
    };
    Ok(tokens.authenticate(headers)?)
}

/// Who is asking, by user token. With the quota on, a subscription request
/// needs one (its user owns the subscription); otherwise a token is
/// optional, and names the owner when given.
fn request_owner(state: &ApiState, headers: &HeaderMap) -> Result<Option<User>, AuthError> {
    let Some(tokens) = &state.user_tokens else {
        return Ok(None);
    };
    match tokens.authenticate(headers) {
        Ok(user) => Ok(Some(user)),
        Err(AuthError::MissingToken) if state.subscriptions.quota().is_none() => Ok(None),
        Err(error) => Err(error),
    }
}

/// The checks a subscription request passes before its 202 when subscribers
/// authenticate: the owner is the token's user; a pair held by another
/// owner is refused; and with the quota on, a new subscription over a limit
/// already reached is refused at once (the authoritative count runs at save
/// time, after verification).
async fn authorize_subscription(
    state: &ApiState,
    headers: &HeaderMap,
    request: &mut SubscriptionRequest,
) -> Result<(), ApiError> {
    let Some(user) = request_owner(state, headers)? else {
        return Ok(());
    };
    let held = match state.store.get(&request.topic, &request.callback).await {
        Ok(existing) => match existing.owner.as_deref() {
            Some(owner) if owner != user.id => {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "this callback's subscription to the topic belongs to another subscriber",
                ));
            }
            owner => owner.is_some(),
        },
        Err(websub_store::StoreError::UnknownSubscription { .. }) => false,
        Err(error) => return Err(error.into()),
    };
    if request.mode == Mode::Subscribe
        && !held
        && let Some(quota) = state.subscriptions.quota()
    {
        let limit = quota.limit(quota.quota_type(), &user.id).await?;
        if !limit.unlimited {
            let used = state.store.count_by_owner(&user.id).await?;
            if used >= limit.limit {
                return Err(QuotaError::LimitReached {
                    limit: limit.limit,
                    used,
                }
                .into());
            }
        }
    }
    request.owner = Some(user.id);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fat_pings_are_recognised_by_their_query() {
        assert!(matches!(fat_ping_topic(None), Ok(None)));
        assert!(matches!(fat_ping_topic(Some("a=b")), Ok(None)));
        assert!(matches!(
            fat_ping_topic(Some("hub.mode=publish&hub.topic=https%3A%2F%2Fpub.example%2Ffeed")),
            Ok(Some(topic)) if topic == "https://pub.example/feed"
        ));
        assert!(fat_ping_topic(Some("hub.mode=publish")).is_err());
        assert!(fat_ping_topic(Some("hub.mode=publish&hub.topic=nota-url")).is_err());
    }
}
