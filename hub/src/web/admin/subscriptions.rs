//! The subscriptions page at `/admin/subscriptions`: subscriptions by topic
//! and by callback text, a page at a time, each with its delivery health, linking to its
//! deliveries; with a button to disable its callback (or a link to the
//! endpoints page, when disabled), a form to replay its topic's events
//! since a time ([`super::resend`]), and one to deny it ([`super::denials`]).

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use maud::{Markup, html};
use serde::Deserialize;
use websub_store::Subscription;

use super::denials::deny_form;
use super::endpoints::action_form;
use super::layout::Field;
use super::paging::{self, Page};
use super::session::{self, Session};
use super::{ROWS_SHOWN, layout, link, when};
use crate::delivery::Channel;
use crate::storage::events::DeliveryHealth;
use crate::web::api::{ApiError, ApiState};

/// The topic's most recent events a subscription's health is read over,
/// as the subscriber API reads it.
const HEALTH_WINDOW: usize = 1000;

/// The most topics, and the most subscriptions, read to find those
/// matching the filters.
const TOPICS_SEARCHED: usize = 1000;
const SUBSCRIPTIONS_SEARCHED: usize = 100_000;

/// The filters, both optional.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Filter {
    /// Only this topic's (exactly).
    topic: Option<String>,
    /// Only callbacks containing this text.
    callback: Option<String>,
    page: Option<String>,
}

/// A subscription as listed.
struct Row {
    subscription: Subscription,
    health: DeliveryHealth,
    latest_event: Option<uuid::Uuid>,
    disabled: bool,
}

pub(super) async fn page(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(filter): Query<Filter>,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let body = subscriptions(&state, &session, filter).await?;
    Ok(layout::page("Subscriptions", &session, body))
}

async fn subscriptions(
    state: &ApiState,
    session: &Session,
    filter: Filter,
) -> Result<Markup, ApiError> {
    let page = Page::parse(filter.page.as_deref())?;
    let topic = paging::search("topic", &filter.topic)?;
    let callback = paging::search("callback", &filter.callback)?;
    let (found, searched_all) = find(state, topic, callback, page.limit()).await?;
    let (found, more) = page.cut(found);
    let mut filters = vec![];
    filters.extend(topic.map(|topic| ("topic", topic)));
    filters.extend(callback.map(|callback| ("callback", callback)));
    let mut rows = Vec::with_capacity(found.len());
    for subscription in found {
        let health = state
            .events
            .health(&subscription.topic, &subscription.callback, HEALTH_WINDOW)
            .await?;
        let latest_event = state
            .events
            .latest(&subscription.topic)
            .await?
            .map(|event| event.id);
        let disabled = state
            .dispatcher
            .endpoints()
            .is_disabled(&subscription.callback);
        rows.push(Row {
            subscription,
            health,
            latest_event,
            disabled,
        });
    }
    Ok(html! {
        (layout::filter_form("/admin/subscriptions", &[
            Field { name: "topic", label: "Topic", kind: "url", value: topic },
            Field { name: "callback", label: "Callback contains", kind: "search", value: callback },
        ]))
        @if !searched_all {
            p.note {
                "The search stopped after " (TOPICS_SEARCHED) " topics or "
                (SUBSCRIPTIONS_SEARCHED) " subscriptions; narrow it with a topic."
            }
        }
        table #subscriptions {
            thead {
                tr {
                    th { "Topic" } th { "Callback" } th { "Owner" } th { "Expires" }
                    th { "Last success" } th { "Last error" } th { "Pending" } th { "Failed" }
                    th { "Deliveries" } th { "Endpoint" } th { "Replay since (RFC 3339)" }
                    th { "Deny" }
                }
            }
            tbody {
                @for row in &rows { (render(session, row)) }
            }
        }
        @if rows.is_empty() { p { "No subscription matches." } }
        (paging::pager("/admin/subscriptions", &filters, page, more))
    })
}

/// Up to `limit` subscriptions matching the filters, in topic then
/// callback order; and whether every topic was searched.
async fn find(
    state: &ApiState,
    topic: Option<&str>,
    callback: Option<&str>,
    limit: usize,
) -> Result<(Vec<Subscription>, bool), ApiError> {
    let mut topics = match topic {
        Some(topic) => vec![topic.to_owned()],
        None => state.store.topics().await?,
    };
    topics.sort_unstable();
    let searched_all = topics.len() <= TOPICS_SEARCHED;
    let mut found = Vec::new();
    let mut scanned = 0;
    for topic in topics.iter().take(TOPICS_SEARCHED) {
        // Pages in callback order, so that a callback filter reads the
        // topic a page at a time instead of whole.
        let mut after: Option<String> = None;
        loop {
            let page = state
                .store
                .list_by_topic_page(topic, after.as_deref(), ROWS_SHOWN)
                .await?;
            let last_page = page.len() < ROWS_SHOWN;
            scanned += page.len();
            after = page.last().map(|last| last.callback.clone());
            for subscription in page {
                if callback.is_none_or(|text| subscription.callback.contains(text)) {
                    found.push(subscription);
                    if found.len() == limit {
                        return Ok((found, searched_all));
                    }
                }
            }
            if last_page {
                break;
            }
            if scanned >= SUBSCRIPTIONS_SEARCHED {
                return Ok((found, false));
            }
        }
    }
    Ok((found, searched_all))
}

fn render(session: &Session, row: &Row) -> Markup {
    let subscription = &row.subscription;
    let health = &row.health;
    let failed_link = link(
        "/admin/failed",
        &[
            ("topic", &subscription.topic),
            ("subscriber", &subscription.callback),
        ],
    );
    html! {
        tr.subscription {
            td { (subscription.topic) }
            td.callback { (subscription.callback) }
            td { (subscription.owner.as_deref().unwrap_or("")) }
            td {
                (subscription.expires_at.map(when).unwrap_or_else(|| "never".to_owned()))
            }
            td { (health.last_success.map(when).unwrap_or_else(|| "never".to_owned())) }
            td.error { (health.last_error.as_deref().unwrap_or("")) }
            td.number { (health.pending) }
            td.number {
                @if health.failed > 0 {
                    a href=(failed_link) { (health.failed) }
                } @else {
                    "0"
                }
            }
            td {
                a href=(failed_link) { "failed" }
                @if let Some(event_id) = row.latest_event {
                    " · "
                    a href=(link("/admin/delivery", &[
                        ("event_id", &event_id.to_string()),
                        ("subscriber", &subscription.callback),
                    ])) { "latest" }
                }
                " · "
                a href=(link("/admin/deliveries", &[
                    ("topic", &subscription.topic),
                    ("subscriber", &subscription.callback),
                ])) { "all" }
            }
            td.endpoint {
                @if row.disabled {
                    a.disabled href="/admin/endpoints" { "disabled" }
                } @else {
                    (action_form(session, "disable", Channel::WebSub.label(),
                        &subscription.callback, "Disable"))
                }
            }
            td {
                form.replay method="post" action="/admin/replay" {
                    (layout::csrf(session))
                    input type="hidden" name="topic" value=(subscription.topic);
                    input type="hidden" name="subscriber" value=(subscription.callback);
                    input type="text" name="since" size="22" required
                        placeholder="2026-12-01T10:00:00Z" aria-label="Replay since";
                    " "
                    button type="submit" { "Replay" }
                }
            }
            td { (deny_form(session, &subscription.topic, &subscription.callback)) }
        }
    }
}
