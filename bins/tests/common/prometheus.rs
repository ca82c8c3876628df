//! Reading websubd's `/metrics`: the Prometheus text format, parsed into
//! families with their `# HELP`, `# TYPE` and samples.

use std::collections::BTreeMap;

use websub_tests::http_client;

use super::Websubd;

/// One family of a scrape: its `# TYPE`, whether it had a `# HELP`, and its
/// samples (name with labels, value).
#[derive(Debug, Default)]
pub(crate) struct Family {
    pub(crate) kind: Option<String>,
    pub(crate) help: bool,
    pub(crate) samples: Vec<(String, f64)>,
}

/// Parses the Prometheus text format: comments, then `name{labels} value`.
/// A sample belongs to the family named by its `# TYPE`, a histogram's
/// `_bucket`, `_sum` and `_count` included.
pub(crate) fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split_whitespace().next().expect("a name after HELP");
            families.entry(name.to_owned()).or_default().help = true;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let name = words.next().expect("a name after TYPE");
            let kind = words.next().expect("a kind after the name");
            families.entry(name.to_owned()).or_default().kind = Some(kind.to_owned());
        } else {
            assert!(!line.starts_with('#'), "an unknown comment: {line}");
            let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("a number in {line}"));
            let name = series.split('{').next().expect("a name");
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|suffix| name.strip_suffix(suffix))
                .find(|base| {
                    families.get(*base).and_then(|f| f.kind.as_deref()) == Some("histogram")
                })
                .unwrap_or(name);
            families
                .get_mut(family)
                .unwrap_or_else(|| panic!("a sample before its # TYPE: {line}"))
                .samples
                .push((series.to_owned(), value));
        }
    }
    families
}

/// The value of the one sample of `family` whose labels include every one
/// of `labels` (written `key="value"`), summed when several match.
pub(crate) fn value(
    families: &BTreeMap<String, Family>,
    family: &str,
    series: &str,
    labels: &[&str],
) -> f64 {
    families
        .get(family)
        .unwrap_or_else(|| panic!("no family {family}"))
        .samples
        .iter()
        .filter(|(name, _)| name.split('{').next() == Some(series))
        .filter(|(name, _)| labels.iter().all(|label| name.contains(label)))
        .map(|(_, value)| value)
        .sum()
}

pub(crate) async fn scrape(hub: &Websubd) -> BTreeMap<String, Family> {
    let response = http_client()
        .get(format!("{}metrics", hub.url))
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status().as_u16(), 200);
    parse(&response.text().await.expect("the metrics"))
}
