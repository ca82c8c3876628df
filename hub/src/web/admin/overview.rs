//! The overview at `/admin`: how many deliveries succeeded recently, what
//! is waiting to be delivered, what failed, and how much the hub holds; the
//! endpoints failing or disabled, and the outbox feeds' lag and listeners.

use axum::extract::State;
use axum::http::HeaderMap;
use maud::{Markup, html};

use super::endpoints;
use super::session;
use super::{layout, when};
use crate::intake::feed::FeedStatus;
use crate::storage::events::FailedFilter;
use crate::web::api::{ApiError, ApiState};

/// The most failed deliveries counted; past it the page says "at least".
const FAILED_COUNTED: usize = 1000;

/// The most topics whose subscriptions are counted, and the most
/// subscriptions counted per topic: the overview stays a bounded read
/// however much the hub holds.
const TOPICS_COUNTED: usize = 1000;
const SUBSCRIPTIONS_COUNTED_PER_TOPIC: usize = 10_000;

/// The most troubled endpoints counted per channel, and the most disabled
/// ones listed.
const ENDPOINTS_COUNTED: usize = 1000;
const DISABLED_SHOWN: usize = 20;

/// A count that may have stopped at its bound.
struct Bounded {
    count: usize,
    capped: bool,
}

impl Bounded {
    fn text(&self) -> String {
        if self.capped {
            format!("at least {}", self.count)
        } else {
            self.count.to_string()
        }
    }
}

pub(super) async fn page(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    Ok(layout::page("Overview", &session, figures(&state).await?))
}

async fn figures(state: &ApiState) -> Result<Markup, ApiError> {
    let now = state.clock.now();
    let events = &state.events;
    let last_minute = events
        .delivered_since(now - chrono::TimeDelta::minutes(1))
        .await?;
    let last_ten_minutes = events
        .delivered_since(now - chrono::TimeDelta::minutes(10))
        .await?;
    let backlog = events.undelivered().await?;
    let failed = events
        .failed(FailedFilter::default(), FAILED_COUNTED + 1)
        .await?
        .len();
    let failed = Bounded {
        count: failed.min(FAILED_COUNTED),
        capped: failed > FAILED_COUNTED,
    };
    let (topics, subscriptions) = holdings(state).await?;
    Ok(html! {
        section #deliveries {
            h2 { "Deliveries" }
            dl.figures {
                dt { "Delivered in the last minute" }
                dd #delivered-last-minute { (last_minute) }
                dt { "Delivered in the last 10 minutes" }
                dd #delivered-last-ten-minutes { (last_ten_minutes) }
                dt { "Per minute, over 10 minutes" }
                dd { (format!("{:.1}", last_ten_minutes as f64 / 10.0)) }
                dt { "Backlog (due, retrying or in flight)" }
                dd #backlog { (backlog.records) }
                dt { "Oldest event in the backlog" }
                dd { (backlog.oldest.map(when).unwrap_or_else(|| "none".to_owned())) }
                dt { "Failed (out of retries)" }
                dd #failed { a href="/admin/failed" { (failed.text()) } }
            }
            p.note {
                "Counted from the event log: attempts answered 2xx for events recorded within "
                "the window."
            }
        }
        section #holdings {
            h2 { "Held" }
            dl.figures {
                dt { "Topics" }
                dd #topics { a href="/admin/topics" { (topics.text()) } }
                dt { "Subscriptions" }
                dd #subscriptions { a href="/admin/subscriptions" { (subscriptions.text()) } }
            }
        }
        (endpoints(state).await?)
        (feeds(&state.feeds.statuses()))
    })
}

/// How many topics and subscriptions the hub holds, bounded.
async fn holdings(state: &ApiState) -> Result<(Bounded, Bounded), ApiError> {
    let topics = state.store.topics().await?;
    let mut subscriptions = Bounded {
        count: 0,
        capped: topics.len() > TOPICS_COUNTED,
    };
    for topic in topics.iter().take(TOPICS_COUNTED) {
        let page = state
            .store
            .list_by_topic_page(topic, None, SUBSCRIPTIONS_COUNTED_PER_TOPIC + 1)
            .await?;
        subscriptions.capped |= page.len() > SUBSCRIPTIONS_COUNTED_PER_TOPIC;
        subscriptions.count += page.len().min(SUBSCRIPTIONS_COUNTED_PER_TOPIC);
    }
    let topics = Bounded {
        count: topics.len(),
        capped: false,
    };
    Ok((topics, subscriptions))
}

/// Endpoints whose deliveries keep failing, and those disabled, of both
/// channels: how many, and which are disabled.
async fn endpoints(state: &ApiState) -> Result<Markup, ApiError> {
    let (troubled, capped) = endpoints::troubled(state, ENDPOINTS_COUNTED).await?;
    let (disabled, failing): (Vec<_>, Vec<_>) = troubled
        .iter()
        .partition(|record| record.disabled_at.is_some());
    let count = |count: usize| Bounded { count, capped }.text();
    Ok(html! {
        section #endpoints {
            h2 { "Failing and disabled endpoints" }
            dl.figures {
                dt { "Failing (deliveries exhausted their retries)" }
                dd #endpoints-failing { (count(failing.len())) }
                dt { "Disabled (deliveries skipped)" }
                dd #endpoints-disabled { (count(disabled.len())) }
            }
            @if !disabled.is_empty() {
                table #disabled-endpoints {
                    thead { tr { th { "Channel" } th { "Endpoint" } th { "Since" } th { "Why" } } }
                    tbody {
                        @for record in disabled.iter().take(DISABLED_SHOWN) {
                            tr {
                                td { (record.channel) }
                                td.name { (record.endpoint) }
                                td { (record.disabled_at.map(when).unwrap_or_default()) }
                                td { (record.disabled_reason.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
                (layout::cut_short(disabled.len() > DISABLED_SHOWN, DISABLED_SHOWN))
            }
            p { a href="/admin/endpoints" { "Every failing and disabled endpoint" } }
        }
    })
}

/// The outbox feeds: how far behind their producers they are, and whether
/// their listeners are connected, as each feed's dispatcher last saw it.
fn feeds(statuses: &[FeedStatus]) -> Markup {
    html! {
        section #feeds {
            h2 { "Outbox feeds: lag and listener state" }
            @if statuses.is_empty() {
                p { "No outbox feeds." }
            } @else {
                table #feed-status {
                    thead {
                        tr {
                            th { "Outbox table" } th { "Deliveries table" } th { "Backlog" }
                            th { "Oldest undelivered" } th { "Listener connected" } th { "Sampled" }
                        }
                    }
                    tbody {
                        @for feed in statuses {
                            tr.feed {
                                td { (feed.outbox_table) }
                                td { (feed.deliveries_table) }
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
