//! The admin page under `/admin`: server-rendered HTML for an operator with
//! an operator key, over the same state as the HTTP API. It shows what
//! the hub is doing (recent deliveries, failures and latency as charts,
//! the backlog, failures), what it holds (topics, subscriptions and their
//! delivery health), one delivery with its attempts, delivery records by
//! state (the skipped ones among them), the endpoints failing or disabled
//! and each one's history, the verifications and topic fetches waiting or
//! failed, and the outbox feeds; every list a page at a time, with a
//! search; it retries failed
//! deliveries, sends events again, replays a subscription, disables or
//! enables an endpoint, denies a subscription, and keeps the deny list.
//!
//! No script runs in the page: every action is a POST form carrying a CSRF
//! token tied to the session (`session`, kept by the hub so that it can
//! be ended). Without an operator key configured, every page answers 403,
//! as the operator API does.

mod backlog;
mod charts;
mod deliveries;
mod denials;
mod endpoints;
mod feeds;
pub(crate) mod layout;
mod login;
mod overview;
mod paging;
mod records;
mod resend;
mod session;
mod subscriptions;
mod topics;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use chrono::{DateTime, Utc};

use crate::web::api::ApiState;

/// The largest form an admin action sends (a CSRF token, an event id, a
/// topic and a callback URL, an endpoint's reason, or the login key), with
/// room to spare.
const FORM_LIMIT: usize = 16 * 1024;

/// The most rows a list shows; the page says when there were more.
const ROWS_SHOWN: usize = 100;

/// The admin routes (see the module docs).
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/admin", get(overview::page))
        .route("/admin/login", get(login::login_form).post(login::login))
        .route("/admin/logout", post(login::logout))
        .route("/admin/topics", get(topics::page))
        .route("/admin/subscriptions", get(subscriptions::page))
        .route("/admin/delivery", get(deliveries::delivery))
        .route("/admin/failed", get(deliveries::failed))
        .route("/admin/retry", post(deliveries::retry))
        .route("/admin/deliveries", get(records::page))
        .route("/admin/redeliver", post(resend::redeliver))
        .route("/admin/replay", post(resend::replay))
        .route("/admin/endpoints", get(endpoints::page))
        .route("/admin/endpoints/enable", post(endpoints::enable))
        .route("/admin/endpoints/disable", post(endpoints::disable))
        .route("/admin/denials", get(denials::page))
        .route("/admin/verifications", get(backlog::verifications))
        .route("/admin/fetches", get(backlog::fetches))
        .route("/admin/feeds", get(feeds::page))
        .route("/admin/denials/add", post(denials::add))
        .route("/admin/denials/remove", post(denials::remove))
        .route(
            "/admin/subscriptions/deny",
            post(denials::deny_subscription),
        )
        .layer(DefaultBodyLimit::max(FORM_LIMIT))
        .layer(axum::middleware::map_response(crate::web::guard_pages))
        .with_state(state)
}

/// A page's link with its query, encoded.
pub(crate) fn link(path: &str, query: &[(&str, &str)]) -> String {
    let query = serde_urlencoded::to_string(query).unwrap_or_default();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    }
}

/// A form or query field as given, trimmed; `None` when absent or blank.
pub(crate) fn given(field: &Option<String>) -> Option<&str> {
    field
        .as_deref()
        .map(str::trim)
        .filter(|text| !text.is_empty())
}

/// A time as the pages show it: to the second, in UTC.
pub(crate) fn when(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
