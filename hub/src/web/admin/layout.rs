//! The frame every admin page shares: the document, its style, the
//! navigation and the logout form; and the small pieces pages repeat (a
//! CSRF field, the note under a list cut short).

use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::session::{CSRF_FIELD, Session};

/// A little style so tables read as tables; no external resource is loaded.
const STYLE: &str = "
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1d1d1f; }
nav { display: flex; flex-wrap: wrap; gap: 0.25rem 0.7rem; align-items: center; margin-bottom: 1rem; }
nav form { margin-left: auto; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #c8c8cc; padding: 0.25rem 0.5rem; text-align: left;
  vertical-align: top; }
th { background: #f0f0f3; }
td.number { text-align: right; }
pre { margin: 0; white-space: pre-wrap; word-break: break-all; max-width: 40rem; }
.error { color: #b00020; }
.notice { background: #eef6ee; border: 1px solid #9c9; padding: 0.5rem; }
.note { color: #555; }
section { margin-bottom: 1.5rem; }
dl.figures { display: grid; grid-template-columns: max-content max-content; gap: 0.25rem 1rem; }
dl.figures dt { font-weight: 600; }
dl.figures dd { margin: 0; }
div.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(30rem, 1fr)); gap: 1rem; }
figure.chart { margin: 0; }
figure.chart p.legend { margin: 0.25rem 0; font-size: 0.9rem; }
table.bars td.name { max-width: 24rem; word-break: break-all; }
nav.pages { display: flex; gap: 1rem; margin: 0.5rem 0; }
";

/// A page of a logged-in session.
pub(super) fn page(title: &str, session: &Session, body: Markup) -> Markup {
    page_refreshing(title, session, None, body)
}

/// A page of a logged-in session that the browser reloads every
/// `refresh` seconds, when given: a live view without script.
pub(super) fn page_refreshing(
    title: &str,
    session: &Session,
    refresh: Option<u32>,
    body: Markup,
) -> Markup {
    document(
        title,
        refresh,
        html! {
            nav {
                strong { "WebSub hub" }
                a href="/admin" { "Overview" }
                a href="/admin/topics" { "Topics" }
                a href="/admin/subscriptions" { "Subscriptions" }
                a href="/admin/deliveries" { "Deliveries" }
                a href="/admin/deliveries?state=skipped" { "Skipped" }
                a href="/admin/failed" { "Failed deliveries" }
                a href="/admin/endpoints" { "Endpoints" }
                a href="/admin/denials" { "Deny list" }
                a href="/admin/verifications" { "Verifications" }
                a href="/admin/fetches" { "Fetches" }
                a href="/admin/feeds" { "Feeds" }
                form method="post" action="/admin/logout" {
                    (csrf(session))
                    button type="submit" { "Log out" }
                }
            }
            h1 { (title) }
            (body)
        },
    )
}

/// A page without the navigation (the login).
pub(crate) fn bare(title: &str, body: Markup) -> Markup {
    document(title, None, body)
}

fn document(title: &str, refresh: Option<u32>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                @if let Some(seconds) = refresh {
                    meta http-equiv="refresh" content=(seconds);
                }
                title { (title) " · WebSub hub admin" }
                style { (PreEscaped(STYLE)) }
            }
            body { (body) }
        }
    }
}

/// The hidden field carrying the session's CSRF token.
pub(super) fn csrf(session: &Session) -> Markup {
    html! { input type="hidden" name=(CSRF_FIELD) value=(session.csrf); }
}

/// Says a list stopped at `limit` rows when there were `more`.
pub(super) fn cut_short(more: bool, limit: usize) -> Markup {
    html! {
        @if more {
            p.note { "Showing the first " (limit) " rows only; narrow the filter to see others." }
        }
    }
}

/// One field of a filter form: its name (and id), label, input type and
/// the value it was sent with.
pub(super) struct Field<'a> {
    pub(super) name: &'a str,
    pub(super) label: &'a str,
    pub(super) kind: &'a str,
    pub(super) value: Option<&'a str>,
}

/// A form that filters a list: a GET of `action` with the fields.
pub(super) fn filter_form(action: &str, fields: &[Field<'_>]) -> Markup {
    html! {
        form method="get" action=(action) {
            @for field in fields {
                label for=(field.name) { (field.label) } " "
                input id=(field.name) type=(field.kind) name=(field.name) size="40"
                    value=[field.value];
                " "
            }
            button type="submit" { "Filter" }
        }
    }
}
