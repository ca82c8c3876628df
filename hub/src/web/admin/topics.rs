//! The topics page at `/admin/topics`: every topic with subscriptions and
//! how many, each linking to its subscriptions.

use axum::extract::State;
use axum::http::HeaderMap;
use maud::{Markup, html};

use super::session;
use super::{layout, link};
use crate::web::api::{ApiError, ApiState};

/// The most topics listed.
const TOPICS_SHOWN: usize = 500;

/// Subscriptions counted per topic; past it the count reads "N+".
const COUNTED: usize = 1000;

pub(super) async fn page(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    Ok(layout::page("Topics", &session, topics(&state).await?))
}

async fn topics(state: &ApiState) -> Result<Markup, ApiError> {
    let mut topics = state.store.topics().await?;
    topics.sort_unstable();
    let total = topics.len();
    topics.truncate(TOPICS_SHOWN);
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
    Ok(html! {
        p { (total) " topics with at least one subscription." }
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
        (layout::cut_short(total > TOPICS_SHOWN, TOPICS_SHOWN))
    })
}
