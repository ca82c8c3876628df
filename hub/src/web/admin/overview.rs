//! The overview at `/admin`: how many deliveries succeeded recently, what
//! is waiting to be delivered, what failed, and how much the hub holds; the
//! WebSub deliveries and failures per minute over the last hour and per
//! quarter hour over the last day, their attempts' latency, and the
//! busiest and the failing endpoints, as charts ([`super::charts`]) drawn
//! from the event log; the endpoints failing or disabled, and the outbox
//! feeds' lag and listeners. `?refresh=N` reloads it every N seconds.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use maud::{Markup, html};
use serde::Deserialize;

use super::charts::{self, LineChart, Ranked, Series};
use super::endpoints;
use super::session;
use super::{layout, link, when};
use crate::storage::events::{Activity, ActivityWindow, FailedFilter};
use crate::web::api::{ApiError, ApiState};

/// The reload intervals `?refresh=` takes, in seconds: often enough to
/// watch an incident, never so often that the page loads the database.
const REFRESH_SECONDS: std::ops::RangeInclusive<u32> = 5..=300;

/// The interval the overview's link offers.
const REFRESH_OFFERED: u32 = 10;

/// The endpoints each ranking lists.
const ENDPOINTS_RANKED: usize = 10;

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

/// What the overview takes: how often it reloads, if at all.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Options {
    refresh: Option<String>,
}

/// The reload interval `text` asks for, within [`REFRESH_SECONDS`].
fn refresh(text: Option<&str>) -> Result<Option<u32>, ApiError> {
    let Some(text) = text.map(str::trim).filter(|text| !text.is_empty()) else {
        return Ok(None);
    };
    text.parse::<u32>()
        .ok()
        .filter(|seconds| REFRESH_SECONDS.contains(seconds))
        .map(Some)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "refresh must be a number of seconds from {} to {}",
                    REFRESH_SECONDS.start(),
                    REFRESH_SECONDS.end()
                ),
            )
        })
}

pub(super) async fn page(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(options): Query<Options>,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let refresh = refresh(options.refresh.as_deref())?;
    let body = html! {
        p #refresh {
            @if let Some(seconds) = refresh {
                "Reloading every " (seconds) " s. " a href="/admin" { "Stop reloading" }
            } @else {
                a href=(link("/admin", &[("refresh", &REFRESH_OFFERED.to_string())])) {
                    "Refresh every " (REFRESH_OFFERED) " s"
                }
            }
        }
        (figures(&state).await?)
    };
    Ok(layout::page_refreshing("Overview", &session, refresh, body))
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
        (glance(state, now).await?)
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
        (super::feeds::table(&state.feeds.statuses()))
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

/// A window of `buckets` buckets of `bucket` each, the last one holding
/// `now`.
fn window_to(now: DateTime<Utc>, bucket: TimeDelta, buckets: usize) -> ActivityWindow {
    let current = now.duration_trunc(bucket).unwrap_or(now);
    ActivityWindow {
        since: current - bucket * (i32::try_from(buckets).unwrap_or(i32::MAX) - 1),
        bucket,
        buckets,
        endpoints: ENDPOINTS_RANKED,
    }
}

/// The charts of the last hour (per minute) and the last day (per quarter
/// hour): deliveries and failures, the attempts' latency; and the busiest
/// and failing endpoints of the day.
async fn glance(state: &ApiState, now: DateTime<Utc>) -> Result<Markup, ApiError> {
    let hour = state
        .events
        .activity(window_to(now, TimeDelta::minutes(1), 60))
        .await?;
    let day = state
        .events
        .activity(window_to(now, TimeDelta::minutes(15), 96))
        .await?;
    let busiest: Vec<Ranked<'_>> = day
        .busiest
        .iter()
        .map(|endpoint| Ranked {
            name: &endpoint.endpoint,
            href: link("/admin/deliveries", &[("subscriber", &endpoint.endpoint)]),
            count: endpoint.delivered,
        })
        .collect();
    let failing: Vec<Ranked<'_>> = day
        .failing
        .iter()
        .map(|endpoint| Ranked {
            name: &endpoint.endpoint,
            href: format!(
                "{}#changes",
                link(
                    "/admin/endpoints",
                    &[("endpoint", &endpoint.endpoint), ("channel", "websub")]
                )
            ),
            count: endpoint.failed,
        })
        .collect();
    Ok(html! {
        section #charts {
            h2 { "At a glance" }
            p.note {
                "WebSub deliveries, from the hub's event log: attempts made in each span to "
                "events recorded in the window (a retry of an older event is not counted). "
                "Outbox webhooks are counted in their producers' deliveries tables, not here: "
                "see the feeds below."
            }
            div.charts {
                (counts_chart("hour-deliveries", "Deliveries and failures per minute, last hour",
                    &hour, "%H:%M"))
                (latency_chart("hour-latency", "Attempt latency per minute, last hour (ms)",
                    &hour, "%H:%M"))
                (counts_chart("day-deliveries",
                    "Deliveries and failures per 15 minutes, last 24 hours", &day, "%b %d %H:%M"))
                (latency_chart("day-latency",
                    "Attempt latency per 15 minutes, last 24 hours (ms)", &day, "%b %d %H:%M"))
                (charts::bar_list("busiest", "Busiest endpoints, last 24 hours (deliveries)",
                    DELIVERED_COLOUR, "No delivery in the last 24 hours.", &busiest))
                (charts::bar_list("failing", "Failing endpoints, last 24 hours (failed attempts)",
                    FAILED_COLOUR, "No failed attempt in the last 24 hours.", &failing))
            }
        }
    })
}

const DELIVERED_COLOUR: &str = "#2e7d32";
const FAILED_COLOUR: &str = "#c62828";

/// The buckets' labels: their start, in UTC, as `format` spells it.
fn labels(activity: &Activity, format: &str) -> Vec<String> {
    activity
        .buckets
        .iter()
        .map(|bucket| bucket.start.format(format).to_string())
        .collect()
}

fn counts_chart(id: &str, title: &str, activity: &Activity, format: &str) -> Markup {
    let series = |pick: fn(&crate::storage::events::ActivityBucket) -> u64| {
        activity
            .buckets
            .iter()
            .map(|bucket| Some(pick(bucket) as f64))
            .collect()
    };
    LineChart {
        id,
        title,
        unit: "",
        empty: "no deliveries",
        labels: labels(activity, format),
        series: vec![
            Series {
                label: "delivered",
                colour: DELIVERED_COLOUR,
                values: series(|bucket| bucket.delivered),
            },
            Series {
                label: "failed",
                colour: FAILED_COLOUR,
                values: series(|bucket| bucket.failed),
            },
        ],
    }
    .render(true)
}

fn latency_chart(id: &str, title: &str, activity: &Activity, format: &str) -> Markup {
    let series = |pick: fn(&crate::storage::events::ActivityBucket) -> Option<i64>| {
        activity
            .buckets
            .iter()
            .map(|bucket| pick(bucket).map(|micros| micros as f64 / 1000.0))
            .collect()
    };
    LineChart {
        id,
        title,
        unit: " ms",
        empty: "no attempts",
        labels: labels(activity, format),
        series: vec![
            Series {
                label: "p50",
                colour: "#1565c0",
                values: series(|bucket| bucket.p50_micros),
            },
            Series {
                label: "p99",
                colour: "#ef6c00",
                values: series(|bucket| bucket.p99_micros),
            },
        ],
    }
    .render(false)
}
