//! Deliveries on the admin page: one delivery with its attempts
//! (`/admin/delivery`) and a button to send it again ([`super::resend`]),
//! the deliveries that ran out of retries (`/admin/failed`, by event id,
//! topic and subscriber, a page at a time), and retrying
//! them (`POST /admin/retry`), one or all of a subscriber's, as the operator
//! API's retry does.

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Redirect;
use maud::{Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use super::layout::Field;
use super::paging::{self, Page};
use super::session::{self, Session};
use super::{layout, link, when};
use crate::storage::events::DeliveryState;
use crate::storage::events::{Attempt, DeliveryRecord, FailedDelivery, FailedFilter};
use crate::web::api::history;
use crate::web::api::operator;
use crate::web::api::{ApiError, ApiState};

/// The most attempts listed for one delivery (the oldest first).
const ATTEMPTS_SHOWN: usize = 500;

/// Which delivery, and what a retry or a sending again that led here did.
#[derive(Debug, Deserialize)]
pub(super) struct DeliveryQuery {
    event_id: Option<String>,
    subscriber: Option<String>,
    retried: Option<u64>,
    /// The delivery this one sends again.
    sent_again: Option<Uuid>,
}

fn bad_request(reason: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, reason)
}

/// The event id a search field names, if any.
pub(super) fn parse_event_id(text: Option<&str>) -> Result<Option<Uuid>, ApiError> {
    text.map(|text| event_id(Some(text))).transpose()
}

fn event_id(text: Option<&str>) -> Result<Uuid, ApiError> {
    let text = text.ok_or_else(|| bad_request("event_id is required"))?;
    Uuid::try_parse(text).map_err(|_| bad_request(format!("event_id {text:?} is not a UUID")))
}

pub(super) async fn delivery(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<DeliveryQuery>,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let (record, attempts) = history::find(
        &state,
        query.event_id.as_deref(),
        query.subscriber.as_deref(),
    )
    .await?;
    let banner = html! {
        @if let Some(retried) = query.retried {
            p.notice role="status" { "Retry requested: " (retried) " failed delivery re-opened." }
        }
        @if let Some(earlier) = query.sent_again {
            p.notice role="status" {
                "Sent again: this is a new delivery of the event; "
                a href=(link("/admin/delivery", &[
                    ("event_id", &earlier.to_string()),
                    ("subscriber", &record.subscriber),
                ])) { "the earlier one" }
                " keeps its history."
            }
        }
    };
    delivery_page(&state, &session, &record, &attempts, banner).await
}

/// The page of one delivery, `banner` on top.
pub(super) async fn delivery_page(
    state: &ApiState,
    session: &Session,
    record: &DeliveryRecord,
    attempts: &[Attempt],
    banner: Markup,
) -> Result<Markup, ApiError> {
    let topic = state
        .events
        .event(record.event_id)
        .await?
        .map(|event| event.topic);
    let disabled = state.dispatcher.endpoints().is_disabled(&record.subscriber);
    let body = delivery_body(
        session,
        record,
        topic.as_deref(),
        disabled,
        attempts,
        banner,
    );
    Ok(layout::page("Delivery", session, body))
}

fn delivery_body(
    session: &Session,
    record: &DeliveryRecord,
    topic: Option<&str>,
    disabled: bool,
    attempts: &[Attempt],
    banner: Markup,
) -> Markup {
    let state = record.state;
    let event_id = record.event_id.to_string();
    html! {
        (banner)
        dl.figures {
            dt { "Event" } dd #event { (event_id) }
            dt { "Topic" } dd { (topic.unwrap_or("")) }
            dt { "Subscriber" } dd #subscriber { (record.subscriber) }
            dt { "State" } dd #state { (state.as_str()) }
            dt { "Retries counted" } dd #retry-count { (record.retry_count) }
            dt { "Last error" } dd.error #last-error { (record.last_error.as_deref().unwrap_or("")) }
            dt { "Processed" } dd { (record.processed_at.map(when).unwrap_or_default()) }
            dt { "Next attempt" } dd { (record.next_attempt_at.map(when).unwrap_or_default()) }
        }
        @if state == DeliveryState::Failed {
            (retry_form(session, Some(&event_id), &record.subscriber, "Retry this delivery"))
        }
        form.redeliver method="post" action="/admin/redeliver" {
            (layout::csrf(session))
            input type="hidden" name="event_id" value=(event_id);
            input type="hidden" name="subscriber" value=(record.subscriber);
            button type="submit" { "Send again" }
            @if disabled {
                " "
                span.note {
                    "Its endpoint is "
                    a href="/admin/endpoints" { "disabled" }
                    ": enable it before sending to it."
                }
            }
        }
        h2 { "Attempts" }
        table #attempts {
            thead {
                tr {
                    th { "At" } th { "Duration (ms)" } th { "Status" } th { "Error" }
                    th { "Response (first KiB)" }
                }
            }
            tbody {
                @for attempt in attempts.iter().take(ATTEMPTS_SHOWN) {
                    tr.attempt {
                        td { (when(attempt.at)) }
                        td.number { (format!("{:.1}", attempt.duration_micros as f64 / 1000.0)) }
                        td.number {
                            (attempt.status.map(|status| status.to_string()).unwrap_or_default())
                        }
                        td.error { (attempt.error.as_deref().unwrap_or("")) }
                        td { pre { (String::from_utf8_lossy(&attempt.response)) } }
                    }
                }
            }
        }
        @if attempts.is_empty() { p { "No attempt yet." } }
        (layout::cut_short(attempts.len() > ATTEMPTS_SHOWN, ATTEMPTS_SHOWN))
    }
}

/// Which failed deliveries to list.
#[derive(Debug, Deserialize)]
pub(super) struct FailedQuery {
    event_id: Option<String>,
    topic: Option<String>,
    subscriber: Option<String>,
    retried: Option<u64>,
    page: Option<String>,
}

pub(super) async fn failed(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<FailedQuery>,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let page = Page::parse(query.page.as_deref())?;
    let event_text = paging::search("event_id", &query.event_id)?;
    let topic = paging::search("topic", &query.topic)?;
    let subscriber = paging::search("subscriber", &query.subscriber)?;
    let filter = FailedFilter {
        topic,
        subscriber,
        event_id: parse_event_id(event_text)?,
    };
    let failed = state.events.failed(filter, page.limit()).await?;
    let (failed, more) = page.cut(failed);
    let mut filters = vec![];
    filters.extend(event_text.map(|id| ("event_id", id)));
    filters.extend(topic.map(|topic| ("topic", topic)));
    filters.extend(subscriber.map(|subscriber| ("subscriber", subscriber)));
    let body = html! {
        @if let Some(retried) = query.retried {
            p.notice role="status" { "Retry requested: " (retried) " failed deliveries re-opened." }
        }
        (layout::filter_form("/admin/failed", &[
            Field { name: "event_id", label: "Event id", kind: "search", value: event_text },
            Field { name: "topic", label: "Topic", kind: "url", value: topic },
            Field {
                name: "subscriber",
                label: "Subscriber (callback URL)",
                kind: "url",
                value: subscriber,
            },
        ]))
        @if failed.is_empty() {
            p { "No failed delivery." }
        } @else {
            (failed_table(&session, &failed))
            (paging::pager("/admin/failed", &filters, page, more))
            h2 { "By subscriber" }
            (subscribers_table(&session, &failed))
        }
    };
    Ok(layout::page("Failed deliveries", &session, body))
}

fn failed_table(session: &Session, failed: &[FailedDelivery]) -> Markup {
    html! {
        table #failed {
            thead {
                tr {
                    th { "Event" } th { "Topic" } th { "Subscriber" } th { "Recorded" }
                    th { "Attempts" } th { "Last error" } th {}
                }
            }
            tbody {
                @for record in failed {
                    @let event_id = record.event_id.to_string();
                    tr.failed {
                        td {
                            a href=(link("/admin/delivery", &[
                                ("event_id", &event_id),
                                ("subscriber", &record.subscriber),
                            ])) { (event_id) }
                        }
                        td { (record.topic) }
                        td.subscriber { (record.subscriber) }
                        td { (when(record.created_at)) }
                        td.number { (record.retry_count) }
                        td.error { (record.last_error.as_deref().unwrap_or("")) }
                        td { (retry_form(session, Some(&event_id), &record.subscriber, "Retry")) }
                    }
                }
            }
        }
    }
}

/// The subscribers among `failed`, each once, with a retry of all of
/// theirs.
fn subscribers_table(session: &Session, failed: &[FailedDelivery]) -> Markup {
    let mut subscribers: Vec<&str> = failed
        .iter()
        .map(|record| record.subscriber.as_str())
        .collect();
    subscribers.sort_unstable();
    subscribers.dedup();
    html! {
        table #failed-subscribers {
            thead { tr { th { "Subscriber" } th { "Listed" } th {} } }
            tbody {
                @for subscriber in subscribers {
                    tr {
                        td { (subscriber) }
                        td.number {
                            (failed.iter().filter(|record| record.subscriber == subscriber).count())
                        }
                        td { (retry_form(session, None, subscriber, "Retry all of this subscriber")) }
                    }
                }
            }
        }
    }
}

/// A retry button: of one delivery, or of every failed delivery of the
/// subscriber.
fn retry_form(session: &Session, event_id: Option<&str>, subscriber: &str, label: &str) -> Markup {
    html! {
        form.retry method="post" action="/admin/retry" {
            (layout::csrf(session))
            @if let Some(event_id) = event_id {
                input type="hidden" name="event_id" value=(event_id);
            }
            input type="hidden" name="subscriber" value=(subscriber);
            button type="submit" { (label) }
        }
    }
}

/// What a retry button sends.
#[derive(Debug, Deserialize)]
pub(super) struct RetryForm {
    csrf: Option<String>,
    subscriber: Option<String>,
    event_id: Option<String>,
}

/// Re-opens the failed deliveries a button names and wakes the dispatcher
/// for them; then shows the delivery (one) or the subscriber's failures
/// (all).
pub(super) async fn retry(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<RetryForm>,
) -> Result<Redirect, ApiError> {
    session::require_form(&state, &headers, form.csrf.as_deref()).await?;
    let subscriber = form
        .subscriber
        .as_deref()
        .filter(|text| !text.is_empty())
        .ok_or_else(|| bad_request("subscriber is required"))?;
    let event_id = match form.event_id.as_deref() {
        Some(text) => Some(event_id(Some(text))?),
        None => None,
    };
    let filter = FailedFilter {
        topic: None,
        subscriber: Some(subscriber),
        event_id,
    };
    let retried = operator::retry_failed(&state, filter).await?;
    tracing::info!(
        subscriber,
        ?event_id,
        retried,
        "failed deliveries retried from the admin page"
    );
    let retried = retried.to_string();
    let next = match event_id {
        Some(event_id) => link(
            "/admin/delivery",
            &[
                ("event_id", &event_id.to_string()),
                ("subscriber", subscriber),
                ("retried", &retried),
            ],
        ),
        None => link(
            "/admin/failed",
            &[("subscriber", subscriber), ("retried", &retried)],
        ),
    };
    Ok(Redirect::to(&next))
}
