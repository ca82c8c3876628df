//! Saying no from the admin page: the deny list at `/admin/denials` (its
//! patterns with a button to remove each, searched by text in the pattern
//! and shown a page at a time, and a form to add one), and the
//! **Deny** form of each subscription on the subscriptions page, which
//! removes it and tells its callback why. The same rules as the operator
//! API's (`crate::web::api`'s `denials`).

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
use crate::intake::deny::{PatternError, check_reason};
use crate::storage::events::{Denial, DeniedField};
use crate::web::api::{ApiError, ApiState};

/// What the page says happened, after a form.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Outcome {
    added: Option<String>,
    removed: Option<String>,
    denied: Option<String>,
    notified: Option<String>,
    /// Only patterns containing this text.
    search: Option<String>,
    page: Option<String>,
}

pub(super) async fn page(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(outcome): Query<Outcome>,
) -> Result<Markup, ApiError> {
    let session = session::require(&state, &headers).await?;
    let page = Page::parse(outcome.page.as_deref())?;
    let search = paging::search("search", &outcome.search)?;
    // The deny list is bounded (`DenyList`), and read whole every few
    // seconds by the hub itself: searched here.
    let mut denials = state.events.denials().await?;
    denials.retain(|denial| search.is_none_or(|text| denial.pattern.contains(text)));
    let (denials, more) = page.cut(denials);
    let filters: Vec<(&str, &str)> = search.map(|text| ("search", text)).into_iter().collect();
    let body = html! {
        @if let Some(pattern) = given(&outcome.added) {
            p.notice role="status" { "Denying subscriptions matching " code { (pattern) } "." }
        }
        @if let Some(pattern) = given(&outcome.removed) {
            p.notice role="status" { "Removed " code { (pattern) } " from the deny list." }
        }
        @if let Some(callback) = given(&outcome.denied) {
            p.notice role="status" {
                "Denied the subscription of " code { (callback) } "; "
                @if given(&outcome.notified) == Some("true") {
                    "its callback was told why."
                } @else {
                    "its callback did not acknowledge the notice."
                }
            }
        }
        p.note {
            "A subscribe request whose topic or callback matches a pattern is denied: "
            "its callback is sent " code { "hub.mode=denied" } " with the reason. "
            code { "*" } " matches any run of characters; the rest matches itself, case aside."
        }
        (layout::filter_form("/admin/denials", &[
            Field { name: "search", label: "Pattern contains", kind: "search", value: search },
        ]))
        table #denials {
            thead { tr { th { "Field" } th { "Pattern" } th { "Reason" } th { "Added" } th {} } }
            tbody {
                @for denial in &denials { (row(&session, denial)) }
            }
        }
        @if denials.is_empty() {
            p { @if search.is_some() { "No pattern matches." } @else { "The deny list is empty." } }
        }
        (paging::pager("/admin/denials", &filters, page, more))
        (add_form(&session))
    };
    Ok(layout::page("Deny list", &session, body))
}

fn row(session: &Session, denial: &Denial) -> Markup {
    html! {
        tr.denial {
            td { (denial.field.as_str()) }
            td { code { (denial.pattern) } }
            td { (denial.reason) }
            td { (when(denial.created_at)) }
            td {
                form.remove method="post" action="/admin/denials/remove" {
                    (layout::csrf(session))
                    input type="hidden" name="id" value=(denial.id);
                    input type="hidden" name="pattern" value=(denial.pattern);
                    button type="submit" { "Remove" }
                }
            }
        }
    }
}

fn add_form(session: &Session) -> Markup {
    html! {
        form #add-denial method="post" action="/admin/denials/add" {
            (layout::csrf(session))
            label for="field" { "Match" } " "
            select #field name="field" {
                option value="callback" { "callback" }
                option value="topic" { "topic" }
            }
            " "
            label for="pattern" { "Pattern" } " "
            input #pattern type="text" name="pattern" size="40" required
                placeholder="https://*.spam.example/*";
            " "
            label for="reason" { "Reason" } " "
            input #reason type="text" name="reason" size="30" required;
            " "
            button type="submit" { "Deny" }
        }
    }
}

/// What the add form sends.
#[derive(Debug, Deserialize)]
pub(super) struct AddForm {
    csrf: Option<String>,
    field: Option<String>,
    pattern: Option<String>,
    reason: Option<String>,
}

fn bad(error: PatternError) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, error.to_string())
}

pub(super) async fn add(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<AddForm>,
) -> Result<Redirect, ApiError> {
    session::require_form(&state, &headers, form.csrf.as_deref()).await?;
    let field = given(&form.field)
        .and_then(DeniedField::parse)
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "field must be topic or callback"))?;
    let pattern = form.pattern.as_deref().unwrap_or("").trim();
    let reason = given(&form.reason).unwrap_or("");
    let listed = crate::web::api::denials::deny_pattern(&state, field, pattern, reason).await?;
    Ok(Redirect::to(&link(
        "/admin/denials",
        &[("added", &listed.pattern)],
    )))
}

/// What a remove button sends.
#[derive(Debug, Deserialize)]
pub(super) struct RemoveForm {
    csrf: Option<String>,
    id: Option<String>,
    pattern: Option<String>,
}

pub(super) async fn remove(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<RemoveForm>,
) -> Result<Redirect, ApiError> {
    session::require_form(&state, &headers, form.csrf.as_deref()).await?;
    let id =
        given(&form.id).ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "id is required"))?;
    crate::web::api::denials::undeny_pattern(&state, id).await?;
    Ok(Redirect::to(&link(
        "/admin/denials",
        &[("removed", given(&form.pattern).unwrap_or(id))],
    )))
}

/// What a subscription's Deny form sends.
#[derive(Debug, Deserialize)]
pub(super) struct DenyForm {
    csrf: Option<String>,
    topic: Option<String>,
    callback: Option<String>,
    reason: Option<String>,
}

/// The Deny form of one subscription, for the subscriptions page.
pub(super) fn deny_form(session: &Session, topic: &str, callback: &str) -> Markup {
    html! {
        form.deny method="post" action="/admin/subscriptions/deny" {
            (layout::csrf(session))
            input type="hidden" name="topic" value=(topic);
            input type="hidden" name="callback" value=(callback);
            input type="text" name="reason" size="16" required placeholder="why"
                aria-label="Why it is denied";
            " "
            button type="submit" { "Deny" }
        }
    }
}

pub(super) async fn deny_subscription(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<DenyForm>,
) -> Result<Redirect, ApiError> {
    session::require_form(&state, &headers, form.csrf.as_deref()).await?;
    let (Some(topic), Some(callback)) = (given(&form.topic), given(&form.callback)) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "topic and callback are required",
        ));
    };
    let reason = given(&form.reason).unwrap_or("");
    check_reason(reason).map_err(bad)?;
    crate::web::api::subscription::find(&state, topic, callback).await?;
    let notified = state.subscriptions.deny(topic, callback, reason).await?;
    Ok(Redirect::to(&link(
        "/admin/denials",
        &[("denied", callback), ("notified", &notified.to_string())],
    )))
}
