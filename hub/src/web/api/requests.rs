//! Counting the HTTP requests answered, by route and status, and timing
//! them.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

/// `websub_http_requests_total{route, method, status}`.
pub const HTTP_REQUESTS_TOTAL: &str = "websub_http_requests_total";

/// `websub_http_request_seconds{route, method}`: from the request's head to
/// its answer's head.
pub const HTTP_REQUEST_SECONDS: &str = "websub_http_request_seconds";

/// Counts each request by its route's pattern (never the raw path, whose
/// values are unbounded), method and status, and times it.
pub(super) async fn count_requests(
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let route = matched.map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!(HTTP_REQUEST_SECONDS, "route" => route.clone(), "method" => method.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(HTTP_REQUESTS_TOTAL, "route" => route, "method" => method, "status" => status)
        .increment(1);
    response
}
