//! The deliveries page at `/admin/deliveries`: delivery records by event
//! id, topic, subscriber and state, newest event first, a page at a time,
//! as the operator API lists them; the skipped ones (endpoint disabled, to replay) are its
//! `state=skipped`. A replay from the subscriptions page lands here.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::Field;
use super::paging::{self, Page};
use super::session;
use super::{given, layout, link, when};
use crate::storage::events::{DeliveryFilter, DeliveryState, DeliverySummary};
use crate::web::api::history::parse_state;
use crate::web::api::{ApiError, ApiState};

/// The filters, and what a replay that led here did.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Filter {
    event_id: Option<String>,
    topic: Option<String>,
    subscriber: Option<String>,
    state: Option<String>,
    replayed: Option<usize>,
    resume_since: Option<String>,
    page: Option<String>,
}

pub(super) async fn page(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(filter): Query<Filter>,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let page = Page::parse(filter.page.as_deref())?;
    let event_text = paging::search("event_id", &filter.event_id)?;
    let event_id = super::deliveries::parse_event_id(event_text)?;
    let topic = paging::search("topic", &filter.topic)?;
    let subscriber = paging::search("subscriber", &filter.subscriber)?;
    let state_text = given(&filter.state);
    let wanted = parse_state(state_text)?;
    let records = state
        .events
        .list(
            DeliveryFilter {
                event_id,
                topic,
                subscriber,
                state: wanted,
                ..DeliveryFilter::default()
            },
            page.limit(),
        )
        .await?;
    let (records, more) = page.cut(records);
    let title = match wanted {
        Some(DeliveryState::Skipped) => "Skipped deliveries",
        _ => "Deliveries",
    };
    let by_state = |state: Option<DeliveryState>| {
        let mut query = vec![];
        query.extend(event_text.map(|id| ("event_id", id)));
        query.extend(topic.map(|topic| ("topic", topic)));
        query.extend(subscriber.map(|subscriber| ("subscriber", subscriber)));
        query.extend(state.map(|state| ("state", state.as_str())));
        link("/admin/deliveries", &query)
    };
    let mut filters = vec![];
    filters.extend(event_text.map(|id| ("event_id", id)));
    filters.extend(topic.map(|topic| ("topic", topic)));
    filters.extend(subscriber.map(|subscriber| ("subscriber", subscriber)));
    filters.extend(wanted.map(|state| ("state", state.as_str())));
    let body = html! {
        @if let Some(replayed) = filter.replayed {
            p.notice role="status" {
                "Replay requested: " (replayed) " events sent again."
                @if let Some(resume) = &filter.resume_since {
                    " More follow: replay again since " (resume) "."
                }
            }
        }
        (layout::filter_form("/admin/deliveries", &[
            Field { name: "event_id", label: "Event id", kind: "search", value: event_text },
            Field { name: "topic", label: "Topic", kind: "url", value: topic },
            Field { name: "subscriber", label: "Subscriber", kind: "url", value: subscriber },
            Field { name: "state", label: "State", kind: "text", value: state_text },
        ]))
        p #states {
            "State: "
            a href=(by_state(None)) { "any" }
            @for state in DeliveryState::ALL {
                " · " a href=(by_state(Some(state))) { (state.as_str()) }
            }
        }
        @if wanted == Some(DeliveryState::Skipped) {
            p.note {
                "Skipped deliveries were not sent because their endpoint was disabled. Enable it "
                "on the " a href="/admin/endpoints" { "endpoints page" } ", then replay them "
                "from the " a href="/admin/subscriptions" { "subscriptions page" } "."
            }
        }
        p { "Listed: " span #count { (records.len()) } }
        @if !records.is_empty() { (table(&records)) }
        (paging::pager("/admin/deliveries", &filters, page, more))
    };
    Ok(layout::page(title, &session, body))
}

fn table(records: &[DeliverySummary]) -> Markup {
    html! {
        table #records {
            thead {
                tr {
                    th { "Event" } th { "Sends again" } th { "Topic" } th { "Subscriber" }
                    th { "Recorded" } th { "State" } th { "Retries" } th { "Last error" }
                    th { "Closed" }
                }
            }
            tbody {
                @for record in records {
                    @let event_id = record.event_id.to_string();
                    tr.record {
                        td {
                            a href=(link("/admin/delivery", &[
                                ("event_id", &event_id),
                                ("subscriber", &record.subscriber),
                            ])) { (event_id) }
                        }
                        td { (record.original_id.map(|id| id.to_string()).unwrap_or_default()) }
                        td { (record.topic) }
                        td.subscriber { (record.subscriber) }
                        td { (when(record.created_at)) }
                        td.state { (record.state.as_str()) }
                        td.number { (record.retry_count) }
                        td.error { (record.last_error.as_deref().unwrap_or("")) }
                        td { (record.processed_at.map(when).unwrap_or_default()) }
                    }
                }
            }
        }
    }
}
