//! The topics page at `/admin/topics`: the topics with subscriptions and
//! how many, each linking to its subscriptions; searched by text in the
//! topic, a page at a time.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::Field;
use super::paging::{self, Page};
use super::session;
use super::{layout, link};
use crate::web::api::{ApiError, ApiState};

/// Subscriptions counted per topic; past it the count reads "N+".
const COUNTED: usize = 1000;

/// The search and the page.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Filter {
    /// Only topics containing this text.
    topic: Option<String>,
    page: Option<String>,
}

pub(super) async fn page(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(filter): Query<Filter>,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let page = Page::parse(filter.page.as_deref())?;
    let search = paging::search("topic", &filter.topic)?;
    Ok(layout::page(
        "Topics",
        &session,
        topics(&state, search, page).await?,
    ))
}

async fn topics(state: &ApiState, search: Option<&str>, page: Page) -> Result<Markup, ApiError> {
    // The store lists its topics whole (those with a subscription); only
    // the page's are counted.
    let mut topics = state.store.topics().await?;
    topics.retain(|topic| search.is_none_or(|text| topic.contains(text)));
    topics.sort_unstable();
    let total = topics.len();
    topics.truncate(page.limit());
    let (topics, more) = page.cut(topics);
    let mut rows = Vec::with_capacity(topics.len());
    for topic in topics {
        let subscribers = state
            .store
            .list_by_topic_page(&topic, None, COUNTED + 1)
            .await?
            .len();
        let count = if subscribers > COUNTED {
            format!("{COUNTED}+")
        } else {
            subscribers.to_string()
        };
        rows.push((topic, count));
    }
    let filters: Vec<(&str, &str)> = search.map(|text| ("topic", text)).into_iter().collect();
    Ok(html! {
        (layout::filter_form("/admin/topics", &[
            Field { name: "topic", label: "Topic contains", kind: "search", value: search },
        ]))
        p { (total) " topics with at least one subscription" @if search.is_some() { " match" } "." }
        table #topics {
            thead { tr { th { "Topic" } th { "Subscriptions" } } }
            tbody {
                @for (topic, count) in &rows {
                    tr {
                        td { (topic) }
                        td.number {
                            a href=(link("/admin/subscriptions", &[("topic", topic)])) { (count) }
                        }
                    }
                }
            }
        }
        (paging::pager("/admin/topics", &filters, page, more))
    })
}
