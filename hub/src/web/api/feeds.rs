//! The outbox feeds as the operator sees them, at
//! `GET /api/v1/operator/feeds`: per feed its tables, whether its listener
//! is connected, and its backlog as its dispatcher last sampled it (the
//! same figures as the `websub_outbox_*` gauges).

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::openapi::{NoInternalKey, WrongKey};
use super::{ApiError, ApiState, authorize_operator};
use crate::intake::feed::FeedStatus;

/// One outbox feed's state.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct FeedView {
    /// The outbox table (`schema.table`), which names the feed.
    outbox_table: String,
    /// The deliveries table.
    deliveries_table: String,
    /// The `NOTIFY` channel it listens on.
    channel: String,
    /// Whether its listener is connected now; while it is not, the feed
    /// delivers by polling alone.
    listener_connected: bool,
    /// Delivery rows due, retrying or in flight; `null` until first sampled.
    backlog: Option<u64>,
    /// The age in seconds of the oldest event with such a row (0 when there
    /// is none); `null` until first sampled.
    oldest_undelivered_seconds: Option<f64>,
    /// When the backlog was sampled (every few seconds).
    sampled_at: Option<DateTime<Utc>>,
}

impl From<FeedStatus> for FeedView {
    fn from(status: FeedStatus) -> Self {
        Self {
            outbox_table: status.outbox_table,
            deliveries_table: status.deliveries_table,
            channel: status.channel,
            listener_connected: status.listener_connected,
            backlog: status.backlog,
            oldest_undelivered_seconds: status.oldest_undelivered_seconds,
            sampled_at: status.sampled_at,
        }
    }
}

/// Every outbox feed the hub runs, in the order they started.
#[utoipa::path(
    get,
    path = "/feeds",
    operation_id = "list_feeds",
    tag = "operator",
    security(("internal_api_key" = [])),
    responses(
        (status = 200, description = "The feeds; none when the hub runs no feed.",
            body = [FeedView]),
        (status = 401, response = WrongKey),
        (status = 403, response = NoInternalKey),
    ),
)]
pub(super) async fn list(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Json<Vec<FeedView>>, ApiError> {
    authorize_operator(&state, &headers)?;
    Ok(Json(
        state
            .feeds
            .statuses()
            .into_iter()
            .map(FeedView::from)
            .collect(),
    ))
}
