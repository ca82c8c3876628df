//! The hub over HTTP: who may call what, the routes, the handlers and the
//! pages, and the connections they are served on.
//!
//! - [`routes`]: the route table with each route's policy (body limit,
//!   timeout, concurrency), and its export for Traefik;
//! - [`api`]: the handlers: the WebSub endpoint (`POST /`), the publish,
//!   subscriber and operator APIs, health and metrics;
//! - [`admin`]: the operator's admin page, server-rendered views over the
//!   same operations as the API;
//! - [`portal`]: the subscriber portal, each subscriber's own
//!   subscriptions and deliveries, and the actions on them;
//! - [`auth`]: user tokens and the keys of each role;
//! - `connections`: the accept loop and the bounds on slow, idle and
//!   surplus clients.

pub mod admin;
pub mod api;
pub mod auth;
pub(crate) mod connections;
pub mod portal;
pub mod routes;

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;

/// Headers every page answer (the admin page's, the portal's) carries:
/// never cached (they show what only their viewer may see), never framed,
/// and no resource loaded or form sent anywhere but this hub.
pub(crate) async fn guard_pages(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    response
}

/// The value of the cookie `name` among the request's cookies.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| {
            let (found, value) = pair.trim().split_once('=')?;
            (found == name).then_some(value)
        })
}
