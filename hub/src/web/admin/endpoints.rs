//! The endpoints page at `/admin/endpoints`: the WebSub callbacks and
//! outbox webhooks that have been failing or are disabled, enabling one
//! again (`POST /admin/endpoints/enable`) and disabling one by hand
//! (`POST /admin/endpoints/disable`), as the operator API does; and the
//! history of their state changes, every endpoint's or
//! (`?endpoint=…&channel=…`) one's, with that endpoint's state now. The
//! list is searched by text in the endpoint (`?search=`) and shown a page
//! at a time. The decisions are the delivery core's
//! ([`crate::delivery::health`], [`crate::delivery::changes`]).

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Redirect;
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::Field;
use super::paging::{self, Page};
use super::session::{self, Session};
use super::{given, layout, link, when};
use crate::delivery::Channel;
use crate::storage::events::{ChangeFilter, DeliveryState, EndpointChange, EndpointRecord};
use crate::web::api::endpoints::{endpoints_of, parse_channel};
use crate::web::api::{ApiError, ApiState};

/// The channels whose endpoints the hub tallies.
const CHANNELS: [Channel; 2] = [Channel::WebSub, Channel::Webhook];

/// The reason recorded when the form gives none.
const DEFAULT_REASON: &str = "disabled by an operator on the admin page";

/// The troubled endpoints of every channel, at most `limit` of each,
/// disabled first; and whether a channel had more.
pub(super) async fn troubled(
    state: &ApiState,
    limit: usize,
) -> Result<(Vec<EndpointRecord>, bool), ApiError> {
    let mut listed = Vec::new();
    let mut more = false;
    for channel in CHANNELS {
        let mut records = endpoints_of(state, channel).list(limit + 1).await?;
        more |= records.len() > limit;
        records.truncate(limit);
        listed.extend(records);
    }
    Ok((listed, more))
}

/// What an action that led here did, and whose changes to show.
#[derive(Debug, Deserialize)]
pub(super) struct Done {
    enabled: Option<String>,
    disabled: Option<String>,
    /// Only this endpoint's changes.
    endpoint: Option<String>,
    /// Only this channel's changes.
    channel: Option<String>,
    /// Only endpoints containing this text.
    search: Option<String>,
    page: Option<String>,
}

/// The most troubled endpoints of each channel a search reads: the table
/// holds only endpoints failing or disabled, which are few.
const SEARCHED: usize = 10_000;

/// The most changes the page shows.
const CHANGES_SHOWN: usize = 50;

pub(super) async fn page(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(done): Query<Done>,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let page = Page::parse(done.page.as_deref())?;
    let search = paging::search("search", &done.search)?;
    let endpoint = paging::search("endpoint", &done.endpoint)?;
    let channel = given(&done.channel);
    let (mut troubled, searched_all) = match search {
        Some(_) => {
            let (found, more) = troubled(&state, SEARCHED).await?;
            (found, !more)
        }
        None => (troubled(&state, page.limit()).await?.0, true),
    };
    troubled.retain(|record| search.is_none_or(|text| record.endpoint.contains(text)));
    let (troubled, more) = page.cut(troubled);
    let filter = ChangeFilter { channel, endpoint };
    let mut changes = state
        .events
        .changes()
        .list_changes(filter, CHANGES_SHOWN + 1)
        .await?;
    let more_changes = changes.len() > CHANGES_SHOWN;
    changes.truncate(CHANGES_SHOWN);
    let body = html! {
        @if let Some(endpoint) = &done.enabled {
            p.notice role="status" {
                "Enabled " (endpoint) ", its failures cleared. Deliveries skipped while it was "
                "disabled stay skipped: replay them from the "
                a href="/admin/subscriptions" { "subscriptions page" } "."
            }
        }
        @if let Some(endpoint) = &done.disabled {
            p.notice role="status" {
                "Disabled " (endpoint) ": its new deliveries are skipped until it is enabled."
            }
        }
        @if let Some(endpoint) = endpoint {
            (one_state(&state, endpoint, channel, &changes).await?)
        }
        (layout::filter_form("/admin/endpoints", &[
            Field { name: "search", label: "Endpoint contains", kind: "search", value: search },
        ]))
        @if !searched_all {
            p.note { "The search read the first " (SEARCHED) " troubled endpoints of each channel." }
        }
        @if troubled.is_empty() {
            p {
                @if search.is_some() { "No failing or disabled endpoint matches." }
                @else { "No endpoint is failing or disabled." }
            }
        } @else {
            (table(&session, &troubled))
        }
        (paging::pager("/admin/endpoints",
            &search.map(|text| ("search", text)).into_iter().collect::<Vec<_>>(), page, more))
        h2 #changes {
            @if let Some(endpoint) = endpoint {
                "Changes of " (endpoint)
            } @else {
                "Recent changes"
            }
        }
        @if endpoint.is_some() {
            p { a href="/admin/endpoints#changes" { "every endpoint's changes" } }
        }
        @if changes.is_empty() {
            p { "No endpoint has changed state." }
        } @else {
            (changes_table(&changes))
            (layout::cut_short(more_changes, CHANGES_SHOWN))
        }
        h2 { "Disable an endpoint" }
        (disable_form(&session))
    };
    Ok(layout::page("Endpoints", &session, body))
}

/// One endpoint's state now: disabled, failing (its deliveries running
/// out of retries) or, in this process, held by its open breaker; else
/// healthy; with its latest change among `changes` (newest first).
async fn one_state(
    state: &ApiState,
    endpoint: &str,
    channel: Option<&str>,
    changes: &[EndpointChange],
) -> Result<Markup, ApiError> {
    let channel = parse_channel(channel)?.unwrap_or(Channel::WebSub);
    let record = endpoints_of(state, channel)
        .list(SEARCHED)
        .await?
        .into_iter()
        .find(|record| record.endpoint == endpoint);
    let open = channel == Channel::WebSub && state.dispatcher.endpoints().is_open(endpoint);
    let latest = changes.iter().find(|change| change.endpoint == endpoint);
    let now = match (&record, open) {
        (Some(record), _) if record.disabled_at.is_some() => "disabled",
        (_, true) => "open",
        (Some(record), false) if record.failures > 0 => "failing",
        _ => "healthy",
    };
    Ok(html! {
        section #endpoint-state {
            h2 { "State of " (endpoint) }
            dl.figures {
                dt { "Channel" } dd { (channel.label()) }
                dt { "Now" } dd #state-now { (now) }
                @if let Some(record) = &record {
                    dt { "Failures in a row" } dd { (record.failures) }
                    dt { "Last failure" } dd {
                        (record.last_failure_at.map(when).unwrap_or_default())
                        @if let Some(error) = &record.last_error { " " span.error { (error) } }
                    }
                    @if let Some(at) = record.disabled_at {
                        dt { "Disabled since" } dd {
                            (when(at)) ": " (record.disabled_reason.as_deref().unwrap_or(""))
                        }
                    }
                }
                dt { "Last change" } dd #last-change {
                    @if let Some(change) = latest {
                        (change.to.as_str()) " at " (when(change.at))
                    } @else {
                        "none kept"
                    }
                }
            }
            @if channel == Channel::WebSub {
                p {
                    a href=(link("/admin/deliveries", &[("subscriber", endpoint)])) {
                        "Its deliveries"
                    }
                    " · "
                    a href=(link("/admin/failed", &[("subscriber", endpoint)])) {
                        "its failed deliveries"
                    }
                }
            }
        }
    })
}

fn table(session: &Session, troubled: &[EndpointRecord]) -> Markup {
    html! {
        table #endpoints {
            thead {
                tr {
                    th { "Channel" } th { "Endpoint" } th { "Failures in a row" }
                    th { "Last failure" } th { "Disabled" } th {}
                }
            }
            tbody {
                @for record in troubled {
                    tr.endpoint.disabled[record.disabled_at.is_some()] {
                        td { (record.channel) }
                        td.name {
                            (record.endpoint) br;
                            a href=(format!("{}#changes", link("/admin/endpoints", &[
                                ("endpoint", &record.endpoint),
                                ("channel", &record.channel),
                            ]))) { "its changes" }
                        }
                        td.number { (record.failures) }
                        td {
                            (record.last_failure_at.map(when).unwrap_or_default())
                            @if let Some(error) = &record.last_error {
                                br; span.error { (error) }
                            }
                        }
                        td.since {
                            @if let Some(at) = record.disabled_at {
                                "since " (when(at))
                                @if let Some(reason) = &record.disabled_reason {
                                    ": " (reason)
                                }
                                @if record.channel == Channel::WebSub.label() {
                                    br;
                                    a href=(link("/admin/deliveries", &[
                                        ("subscriber", &record.endpoint),
                                        ("state", DeliveryState::Skipped.as_str()),
                                    ])) { "its skipped deliveries" }
                                }
                            } @else {
                                "no"
                            }
                        }
                        td { (action_form(session, "enable", &record.channel, &record.endpoint, "Enable")) }
                    }
                }
            }
        }
    }
}

/// The history of changes, newest first.
fn changes_table(changes: &[EndpointChange]) -> Markup {
    html! {
        table #endpoint-changes {
            thead {
                tr {
                    th { "When" } th { "Channel" } th { "Endpoint" } th { "Became" }
                    th { "Failures in a row" } th { "By" } th { "Why" } th { "Operator webhook" }
                }
            }
            tbody {
                @for change in changes {
                    tr.change.(change.to.as_str()) {
                        td { (when(change.at)) }
                        td { (change.channel) }
                        td.name {
                            a href=(format!("{}#changes", link("/admin/endpoints", &[
                                ("endpoint", &change.endpoint),
                                ("channel", &change.channel),
                            ]))) { (change.endpoint) }
                        }
                        td.state { (change.to.as_str()) }
                        td.number { (change.failures.map(|n| n.to_string()).unwrap_or_default()) }
                        td { (change.source.as_deref().unwrap_or_default()) }
                        td {
                            @if let Some(reason) = &change.reason {
                                span.error { (reason) }
                            }
                            @if let Some(since) = change.since {
                                @if change.reason.is_some() { br; }
                                "since " (when(since))
                            }
                        }
                        td { (change.webhook_state.as_str()) }
                    }
                }
            }
        }
    }
}

/// A button that enables or disables (`action`) one endpoint.
pub(super) fn action_form(
    session: &Session,
    action: &str,
    channel: &str,
    endpoint: &str,
    label: &str,
) -> Markup {
    html! {
        form class=(action) method="post" action={ "/admin/endpoints/" (action) } {
            (layout::csrf(session))
            input type="hidden" name="channel" value=(channel);
            input type="hidden" name="endpoint" value=(endpoint);
            button type="submit" { (label) }
        }
    }
}

fn disable_form(session: &Session) -> Markup {
    html! {
        form #disable-endpoint method="post" action="/admin/endpoints/disable" {
            (layout::csrf(session))
            label for="endpoint" { "Callback URL or webhook name" } " "
            input #endpoint type="text" name="endpoint" size="50" required;
            " "
            label for="reason" { "Why" } " "
            input #reason type="text" name="reason" size="30" placeholder=(DEFAULT_REASON);
            " "
            label for="channel" { "Channel" } " "
            select #channel name="channel" {
                @for channel in CHANNELS {
                    option value=(channel.label()) { (channel.label()) }
                }
            }
            " "
            button type="submit" { "Disable" }
        }
    }
}

/// What an endpoint's form sends.
#[derive(Debug, Deserialize)]
pub(super) struct EndpointForm {
    csrf: Option<String>,
    endpoint: Option<String>,
    channel: Option<String>,
    reason: Option<String>,
}

impl EndpointForm {
    /// The channel (WebSub when not given) and the endpoint named.
    fn endpoint(&self) -> Result<(Channel, &str), ApiError> {
        let channel = parse_channel(given(&self.channel))?.unwrap_or(Channel::WebSub);
        let endpoint = given(&self.endpoint).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "endpoint is required: a callback URL or a webhook's name",
            )
        })?;
        Ok((channel, endpoint))
    }
}

/// Enables an endpoint, its failures cleared, and wakes the dispatcher.
pub(super) async fn enable(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<EndpointForm>,
) -> Result<Redirect, ApiError> {
    session::require_form(&state, &headers, form.csrf.as_deref()).await?;
    let (channel, endpoint) = form.endpoint()?;
    let changed = endpoints_of(&state, channel)
        .enable(endpoint, state.clock.now())
        .await?;
    state.dispatcher.wake();
    tracing::info!(
        channel = channel.label(),
        endpoint,
        changed,
        "endpoint enabled from the admin page"
    );
    Ok(Redirect::to(&link(
        "/admin/endpoints",
        &[("enabled", endpoint)],
    )))
}

/// Disables an endpoint: its new deliveries are skipped until enabled.
pub(super) async fn disable(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<EndpointForm>,
) -> Result<Redirect, ApiError> {
    session::require_form(&state, &headers, form.csrf.as_deref()).await?;
    let (channel, endpoint) = form.endpoint()?;
    let reason = given(&form.reason).unwrap_or(DEFAULT_REASON);
    let changed = endpoints_of(&state, channel)
        .disable(endpoint, reason, state.clock.now())
        .await?;
    tracing::info!(
        channel = channel.label(),
        endpoint,
        reason,
        changed,
        "endpoint disabled from the admin page"
    );
    Ok(Redirect::to(&link(
        "/admin/endpoints",
        &[("disabled", endpoint)],
    )))
}
