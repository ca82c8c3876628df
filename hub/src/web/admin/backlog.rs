//! The backlog on the admin page: the verifications of intent
//! (`/admin/verifications`) and the topic fetches (`/admin/fetches`) that
//! wait or failed for good, newest first, by state and by text in their
//! topic or callback, a page at a time, as the operator API lists them
//! ([`crate::storage::backlog`]).

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::Field;
use super::paging::{self, Page};
use super::session;
use super::{given, layout, link, when};
use crate::storage::backlog::Listing;
use crate::web::api::{ApiError, ApiState};

/// The filters and the page.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Filter {
    /// `waiting`, `failed`, or either.
    state: Option<String>,
    /// Text in the topic (or a verification's callback).
    search: Option<String>,
    page: Option<String>,
}

/// The state asked for: failed (`Some(true)`), waiting, or either.
fn failed(text: Option<&str>) -> Result<Option<bool>, ApiError> {
    match text {
        None => Ok(None),
        Some("failed") => Ok(Some(true)),
        Some("waiting") => Ok(Some(false)),
        Some(other) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "state must be waiting or failed, not {:?}",
                other.chars().take(40).collect::<String>()
            ),
        )),
    }
}

/// A row's state, from when it is due next.
fn state_of(next_attempt_at: Option<DateTime<Utc>>) -> &'static str {
    if next_attempt_at.is_some() {
        "waiting"
    } else {
        "failed"
    }
}

/// What the page was asked for, checked.
struct Asked<'a> {
    failed: Option<bool>,
    state: Option<&'a str>,
    search: Option<&'a str>,
    page: Page,
}

impl<'a> Asked<'a> {
    fn of(filter: &'a Filter) -> Result<Self, ApiError> {
        let state = given(&filter.state);
        Ok(Self {
            failed: failed(state)?,
            state,
            search: paging::search("search", &filter.search)?,
            page: Page::parse(filter.page.as_deref())?,
        })
    }

    fn listing(&self) -> Listing<'a> {
        Listing {
            failed: self.failed,
            owner: None,
            search: self.search,
        }
    }

    /// The query that keeps these filters.
    fn filters(&self) -> Vec<(&'a str, &'a str)> {
        let mut filters = vec![];
        filters.extend(self.state.map(|state| ("state", state)));
        filters.extend(self.search.map(|search| ("search", search)));
        filters
    }

    /// The search form, and a link per state.
    fn form(&self, path: &str, search_label: &str) -> Markup {
        let by_state = |state: Option<&str>| {
            let mut query = vec![];
            query.extend(self.search.map(|search| ("search", search)));
            query.extend(state.map(|state| ("state", state)));
            link(path, &query)
        };
        html! {
            (layout::filter_form(path, &[
                Field { name: "search", label: search_label, kind: "search", value: self.search },
                Field { name: "state", label: "State (waiting or failed)", kind: "text",
                    value: self.state },
            ]))
            p.states {
                "State: " a href=(by_state(None)) { "any" }
                " · " a href=(by_state(Some("waiting"))) { "waiting" }
                " · " a href=(by_state(Some("failed"))) { "failed" }
            }
        }
    }
}

/// What frames a list of the backlog: where it is, what it says above
/// the list and when nothing matches.
struct Shown {
    path: &'static str,
    title: &'static str,
    note: &'static str,
    search_label: &'static str,
    none: &'static str,
}

impl Shown {
    /// The page: the note, the search form, the list (`None` when nothing
    /// matches) and the pager.
    fn page(
        &self,
        session: &session::Session,
        asked: &Asked<'_>,
        list: Option<Markup>,
        more: bool,
    ) -> Markup {
        let body = html! {
            p.note { (self.note) }
            (asked.form(self.path, self.search_label))
            @match list {
                Some(list) => (list),
                None => p { (self.none) },
            }
            (paging::pager(self.path, &asked.filters(), asked.page, more))
        };
        layout::page(self.title, session, body)
    }
}

pub(super) async fn verifications(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(filter): Query<Filter>,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let asked = Asked::of(&filter)?;
    let intents = state
        .subscriptions
        .backlog()
        .intents(asked.listing(), asked.page.limit())
        .await?;
    let (intents, more) = asked.page.cut(intents);
    let table = html! {
            table #verifications {
                thead {
                    tr {
                        th { "Mode" } th { "Topic" } th { "Callback" } th { "Owner" }
                        th { "Requested" } th { "State" } th { "Attempts" } th { "Next attempt" }
                        th { "Last error" }
                    }
                }
                tbody {
                    @for intent in &intents {
                        @let state = state_of(intent.next_attempt_at);
                        tr.verification.(state) {
                            td { (intent.mode.as_str()) }
                            td { (intent.topic) }
                            td.callback { (intent.callback) }
                            td { (intent.owner.as_deref().unwrap_or("")) }
                            td { (when(intent.requested_at)) }
                            td.state { (state) }
                            td.number { (intent.attempts) }
                            td { (intent.next_attempt_at.map(when).unwrap_or_default()) }
                            td.error { (intent.last_error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
    };
    let shown = Shown {
        path: "/admin/verifications",
        title: "Verifications",
        note: "Subscribe and unsubscribe requests answered 202 and not yet verified, and \
               those whose verification failed for good (kept for a while, with the error).",
        search_label: "Topic or callback contains",
        none: "No verification matches.",
    };
    Ok(shown.page(
        &session,
        &asked,
        (!intents.is_empty()).then_some(table),
        more,
    ))
}

pub(super) async fn fetches(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(filter): Query<Filter>,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let asked = Asked::of(&filter)?;
    let fetches = state
        .intake
        .backlog()
        .fetches(asked.listing(), asked.page.limit())
        .await?;
    let (fetches, more) = asked.page.cut(fetches);
    let table = html! {
            table #fetches {
                thead {
                    tr {
                        th { "Topic" } th { "Pinged" } th { "State" } th { "Attempts" }
                        th { "Next attempt" } th { "Last error" }
                    }
                }
                tbody {
                    @for fetch in &fetches {
                        @let state = state_of(fetch.next_attempt_at);
                        tr.fetch.(state) {
                            td { (fetch.topic) }
                            td { (when(fetch.requested_at)) }
                            td.state { (state) }
                            td.number { (fetch.attempts) }
                            td { (fetch.next_attempt_at.map(when).unwrap_or_default()) }
                            td.error { (fetch.last_error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
    };
    let shown = Shown {
        path: "/admin/fetches",
        title: "Topic fetches",
        note: "Topics a publish ping asked the hub to fetch, not yet fetched, and those whose \
               fetch failed for good (kept for a while, with the error).",
        search_label: "Topic contains",
        none: "No fetch matches.",
    };
    Ok(shown.page(
        &session,
        &asked,
        (!fetches.is_empty()).then_some(table),
        more,
    ))
}
