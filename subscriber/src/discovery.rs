//! Discovery (WebSub 4): finding a topic's hub and canonical URL from the
//! `Link` headers of a GET of the topic, and the `Link` header parser the
//! receiver also uses to read a delivery's `rel="self"`.

use url::Url;

use super::error::{ClientError, reason};

/// One link of a `Link` header (RFC 8288): its target as written and its
/// relation types, lowercased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkValue {
    /// The URI between `<` and `>`.
    pub target: String,
    /// The `rel` parameter's relation types.
    pub rels: Vec<String>,
}

impl LinkValue {
    /// Whether `rel` is one of its relation types (case-insensitive).
    pub fn has_rel(&self, rel: &str) -> bool {
        self.rels
            .iter()
            .any(|known| known.eq_ignore_ascii_case(rel))
    }
}

/// Parses one `Link` header value: `<uri>; rel="hub", <uri>; rel=self`.
/// Links without a `rel` are kept with no relation types; malformed parts
/// are skipped.
pub fn parse_link_header(value: &str) -> Vec<LinkValue> {
    let mut links = Vec::new();
    let mut rest = value;
    loop {
        let Some(open) = rest.find('<') else {
            return links;
        };
        let Some(close) = rest[open..].find('>') else {
            return links;
        };
        let target = rest[open + 1..open + close].trim().to_owned();
        rest = &rest[open + close + 1..];
        // The parameters run to the next comma outside a quoted string.
        let mut in_quotes = false;
        let mut escaped = false;
        let mut end = rest.len();
        for (index, character) in rest.char_indices() {
            match character {
                _ if escaped => escaped = false,
                '\\' if in_quotes => escaped = true,
                '"' => in_quotes = !in_quotes,
                ',' if !in_quotes => {
                    end = index;
                    break;
                }
                _ => {}
            }
        }
        let params = &rest[..end];
        rest = &rest[end..];
        let rels = params
            .split(';')
            .filter_map(|param| param.split_once('='))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("rel"))
            .map(|(_, value)| {
                value
                    .trim()
                    .trim_matches('"')
                    .split_ascii_whitespace()
                    .map(str::to_ascii_lowercase)
                    .collect()
            })
            .unwrap_or_default();
        links.push(LinkValue { target, rels });
    }
}

/// What a topic announces.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Discovery {
    /// Every `rel="hub"` link, in order, resolved against the topic URL.
    pub hubs: Vec<Url>,
    /// The `rel="self"` link: the topic URL to subscribe to. When the topic
    /// announces none, the URL fetched (after redirects).
    pub topic: Url,
}

impl Discovery {
    /// The first hub announced.
    pub fn hub(&self) -> Option<&Url> {
        self.hubs.first()
    }
}

/// GETs `topic_url` and reads its `Link` headers. A topic that announces no
/// hub is [`ClientError::NoHub`].
pub async fn discover(http: &reqwest::Client, topic_url: &str) -> Result<Discovery, ClientError> {
    let url = Url::parse(topic_url).map_err(|error| ClientError::InvalidUrl {
        url: topic_url.to_owned(),
        reason: error.to_string(),
    })?;
    let response = http.get(url).send().await.map_err(ClientError::Transport)?;
    let status = response.status();
    if !status.is_success() {
        return Err(ClientError::Unexpected {
            status,
            reason: reason(response).await,
        });
    }
    let fetched = response.url().clone();
    let links: Vec<LinkValue> = response
        .headers()
        .get_all(http::header::LINK)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(parse_link_header)
        .collect();
    let resolve = |link: &LinkValue| fetched.join(&link.target).ok();
    let hubs: Vec<Url> = links
        .iter()
        .filter(|link| link.has_rel("hub"))
        .filter_map(resolve)
        .collect();
    if hubs.is_empty() {
        return Err(ClientError::NoHub {
            topic: topic_url.to_owned(),
        });
    }
    let topic = links
        .iter()
        .find(|link| link.has_rel("self"))
        .and_then(resolve)
        .unwrap_or(fetched);
    Ok(Discovery { hubs, topic })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_combined_and_separate_links() {
        let links = parse_link_header(
            "<https://hub.example/>; rel=\"hub\", <https://pub.example/feed?a=1,2>; rel=self",
        );
        assert_eq!(
            links,
            vec![
                LinkValue {
                    target: "https://hub.example/".to_owned(),
                    rels: vec!["hub".to_owned()],
                },
                LinkValue {
                    target: "https://pub.example/feed?a=1,2".to_owned(),
                    rels: vec!["self".to_owned()],
                },
            ]
        );
    }

    #[test]
    fn reads_several_rels_quoted_commas_and_odd_spacing() {
        let links = parse_link_header(
            " < /hub >;title=\"a, b\" ; REL = \"Hub alternate\",</x>;type=\"text/html\"",
        );
        assert_eq!(links.len(), 2);
        assert_eq!(links[0].target, "/hub");
        assert!(links[0].has_rel("hub") && links[0].has_rel("alternate"));
        assert!(links[1].rels.is_empty());
        assert!(parse_link_header("").is_empty());
        assert!(parse_link_header("<unterminated; rel=hub").is_empty());
    }
}
