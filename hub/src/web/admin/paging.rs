//! Lists a page at a time: the page a list is asked for (`?page=`, from
//! 1), the search texts its form sends, both checked before any read, and
//! the Previous and Next links under it. A list reads the rows up to its
//! page and one more, with a LIMIT, so the pages reach as far as
//! [`MAX_PAGE`] and no further.

use axum::http::StatusCode;
use maud::{Markup, html};

use super::{ROWS_SHOWN, link};
use crate::web::api::ApiError;

/// The last page a list shows: each page reads the ones before it, so
/// that a search narrows what lies further.
pub(super) const MAX_PAGE: usize = 100;

/// The longest search text taken.
pub(super) const MAX_SEARCH: usize = 512;

/// One page of a list, counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Page(usize);

fn bad(reason: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, reason)
}

impl Page {
    /// The page `text` names; the first when none.
    pub(super) fn parse(text: Option<&str>) -> Result<Self, ApiError> {
        let Some(text) = text.map(str::trim).filter(|text| !text.is_empty()) else {
            return Ok(Self(1));
        };
        text.parse::<usize>()
            .ok()
            .filter(|page| (1..=MAX_PAGE).contains(page))
            .map(Self)
            .ok_or_else(|| {
                bad(format!(
                    "page must be a number from 1 to {MAX_PAGE}, not {:?}",
                    text.chars().take(40).collect::<String>()
                ))
            })
    }

    /// Its number.
    pub(super) fn number(self) -> usize {
        self.0
    }

    /// How many rows to read: every page up to this one, and one more to
    /// know whether another follows.
    pub(super) fn limit(self) -> usize {
        self.0 * ROWS_SHOWN + 1
    }

    /// This page's rows of `rows` (read with [`Page::limit`]), and whether
    /// more follow.
    pub(super) fn cut<T>(self, rows: Vec<T>) -> (Vec<T>, bool) {
        let more = rows.len() > self.0 * ROWS_SHOWN;
        let shown = rows
            .into_iter()
            .skip((self.0 - 1) * ROWS_SHOWN)
            .take(ROWS_SHOWN)
            .collect();
        (shown, more)
    }
}

/// A search field as given: trimmed, `None` when blank, and refused when
/// longer than [`MAX_SEARCH`].
pub(super) fn search<'a>(
    name: &str,
    field: &'a Option<String>,
) -> Result<Option<&'a str>, ApiError> {
    match super::given(field) {
        Some(text) if text.len() > MAX_SEARCH => {
            Err(bad(format!("{name} is longer than {MAX_SEARCH} bytes")))
        }
        given => Ok(given),
    }
}

/// The links to the pages beside `page` of the list at `path` with
/// `query` (its filters).
pub(super) fn pager(path: &str, query: &[(&str, &str)], page: Page, more: bool) -> Markup {
    let to = |number: usize| {
        let number = number.to_string();
        let mut query = query.to_vec();
        query.push(("page", &number));
        link(path, &query)
    };
    html! {
        @if page.number() > 1 || more {
            nav.pages aria-label="Pages" {
                @if page.number() > 1 {
                    a.previous rel="prev" href=(to(page.number() - 1)) { "← Previous" }
                }
                span.page { "Page " (page.number()) }
                @if more && page.number() < MAX_PAGE {
                    a.next rel="next" href=(to(page.number() + 1)) { "Next →" }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_numbers_within_bounds() {
        assert_eq!(Page::parse(None).ok(), Some(Page(1)));
        assert_eq!(Page::parse(Some(" ")).ok(), Some(Page(1)));
        assert_eq!(Page::parse(Some("3")).ok(), Some(Page(3)));
        for wrong in ["0", "-1", "two", "101", "1e3"] {
            assert!(Page::parse(Some(wrong)).is_err(), "{wrong}");
        }
    }

    #[test]
    fn a_page_cuts_its_rows_and_says_whether_more_follow() {
        let page = Page(2);
        assert_eq!(page.limit(), 2 * ROWS_SHOWN + 1);
        let rows: Vec<usize> = (0..page.limit()).collect();
        let (shown, more) = page.cut(rows);
        assert_eq!(shown.first(), Some(&ROWS_SHOWN));
        assert_eq!(shown.len(), ROWS_SHOWN);
        assert!(more);
        let (shown, more) = page.cut((0..ROWS_SHOWN + 3).collect::<Vec<_>>());
        assert_eq!(shown, vec![ROWS_SHOWN, ROWS_SHOWN + 1, ROWS_SHOWN + 2]);
        assert!(!more);
    }

    #[test]
    fn the_links_keep_the_filters() {
        let markup = pager("/admin/failed", &[("topic", "a b")], Page(2), true).into_string();
        assert!(
            markup.contains("href=\"/admin/failed?topic=a+b&amp;page=1\""),
            "{markup}"
        );
        assert!(
            markup.contains("href=\"/admin/failed?topic=a+b&amp;page=3\""),
            "{markup}"
        );
        assert!(
            pager("/admin/failed", &[], Page(1), false)
                .into_string()
                .is_empty()
        );
    }

    #[test]
    fn an_overlong_search_is_refused() {
        assert!(search("callback", &Some("x".repeat(MAX_SEARCH + 1))).is_err());
        assert_eq!(
            search("callback", &Some(" cb ".to_owned())).ok(),
            Some(Some("cb"))
        );
    }
}
