//! The feeds page at `/admin/feeds`: the producers' outboxes the hub
//! reads ([`crate::intake::feed`]), each with its tables, its listener and
//! its backlog as its dispatcher last sampled them; the overview shows the
//! same table. Their deliveries are kept in each producer's deliveries
//! table, so the overview's charts, drawn from the hub's event log, do not
//! count them.

use axum::extract::State;
use axum::http::HeaderMap;
use maud::{Markup, html};

use super::{layout, session, when};
use crate::intake::feed::FeedStatus;
use crate::web::api::{ApiError, ApiState};

pub(super) async fn page(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let statuses = state.feeds.statuses();
    let body = html! {
        p.note {
            "Each feed reads a producer's outbox table (woken by NOTIFY, and by polling while "
            "its listener is down) and delivers to the webhooks registered for it and to the "
            "topic's WebSub subscribers. The backlog counts the producer's delivery rows due, "
            "retrying or in flight, sampled every few seconds."
        }
        p { (statuses.len()) " feeds." }
        (table(&statuses))
    };
    Ok(layout::page("Outbox feeds", &session, body))
}

/// The outbox feeds: how far behind their producers they are, and whether
/// their listeners are connected, as each feed's dispatcher last saw it.
pub(super) fn table(statuses: &[FeedStatus]) -> Markup {
    html! {
        section #feeds {
            h2 { "Outbox feeds: lag and listener state" }
            @if statuses.is_empty() {
                p { "No outbox feeds." }
            } @else {
                table #feed-status {
                    thead {
                        tr {
                            th { "Outbox table" } th { "Deliveries table" } th { "NOTIFY channel" }
                            th { "Backlog" }
                            th { "Oldest undelivered" } th { "Listener connected" } th { "Sampled" }
                        }
                    }
                    tbody {
                        @for feed in statuses {
                            tr.feed {
                                td { (feed.outbox_table) }
                                td { (feed.deliveries_table) }
                                td { (feed.channel) }
                                td.number {
                                    (feed.backlog.map(|backlog| backlog.to_string())
                                        .unwrap_or_else(|| "not sampled yet".to_owned()))
                                }
                                td.number {
                                    (feed.oldest_undelivered_seconds
                                        .map(|seconds| format!("{seconds:.1} s"))
                                        .unwrap_or_default())
                                }
                                td { (if feed.listener_connected { "yes" } else { "no (polling)" }) }
                                td { (feed.sampled_at.map(when).unwrap_or_default()) }
                            }
                        }
                    }
                }
            }
        }
    }
}
