//! The overview at `/admin`: how many deliveries succeeded recently, what
//! is waiting to be delivered, what failed, and how much the hub holds;
//! with a section for endpoints and one for outbox feeds.

use axum::extract::State;
use axum::http::HeaderMap;
use maud::{Markup, html};

use super::session::{self, Refused};
use super::{events_failed, layout, store_failed, when};
use crate::api::{ApiError, ApiState};
use crate::events::FailedFilter;

/// The most failed deliveries counted; past it the page says "at least".
const FAILED_COUNTED: usize = 1000;

/// The most topics whose subscriptions are counted, and the most
/// subscriptions counted per topic: the overview stays a bounded read
/// however much the hub holds.
const TOPICS_COUNTED: usize = 1000;
const SUBSCRIPTIONS_COUNTED_PER_TOPIC: usize = 10_000;

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
) -> Result<Markup, Refused> {
    let session = session::require(&state, &headers)?;
    Ok(layout::page("Overview", &session, figures(&state).await?))
}

async fn figures(state: &ApiState) -> Result<Markup, ApiError> {
    let now = state.clock.now();
    let events = &state.events;
    let last_minute = events
        .delivered_since(now - chrono::TimeDelta::minutes(1))
        .await
        .map_err(events_failed)?;
    let last_ten_minutes = events
        .delivered_since(now - chrono::TimeDelta::minutes(10))
        .await
        .map_err(events_failed)?;
    let backlog = events.undelivered().await.map_err(events_failed)?;
    let failed = events
        .failed(FailedFilter::default(), FAILED_COUNTED + 1)
        .await
        .map_err(events_failed)?
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
        (endpoints())
        (feeds())
    })
}

/// How many topics and subscriptions the hub holds, bounded.
async fn holdings(state: &ApiState) -> Result<(Bounded, Bounded), ApiError> {
    let topics = state.store.topics().await.map_err(store_failed)?;
    let mut subscriptions = Bounded {
        count: 0,
        capped: topics.len() > TOPICS_COUNTED,
    };
    for topic in topics.iter().take(TOPICS_COUNTED) {
        let page = state
            .store
            .list_by_topic_page(topic, None, SUBSCRIPTIONS_COUNTED_PER_TOPIC + 1)
            .await
            .map_err(store_failed)?;
        subscriptions.capped |= page.len() > SUBSCRIPTIONS_COUNTED_PER_TOPIC;
        subscriptions.count += page.len().min(SUBSCRIPTIONS_COUNTED_PER_TOPIC);
    }
    let topics = Bounded {
        count: topics.len(),
        capped: false,
    };
    Ok((topics, subscriptions))
}

/// Endpoints whose deliveries keep failing, and those disabled: the place
/// for endpoint health on the overview. The hub does not track it per
/// endpoint yet; per subscription it is on the subscriptions page.
fn endpoints() -> Markup {
    html! {
        section #endpoints {
            h2 { "Failing and disabled endpoints" }
            p.note {
                "Endpoint health is not tracked yet. Delivery health per subscription is on the "
                a href="/admin/subscriptions" { "subscriptions page" } "."
            }
        }
    }
}

/// The outbox feeds: how far behind their producers they are, and whether
/// their listeners are connected. The place for feed status on the
/// overview; the hub does not report it yet.
fn feeds() -> Markup {
    html! {
        section #feeds {
            h2 { "Outbox feeds: lag and listener state" }
            p.note { "Feed status is not reported yet." }
        }
    }
}
