//! The webhooks file: a feed's webhook subscribers, by event name, read
//! from TOML and registered with the feed's dispatcher.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;
use url::Url;

use crate::outbox::{RegistrationError, WebhookRegistrar, WebhookSubscriber};
use crate::setting::ConfigError;

/// The webhooks file a feed reads its webhook subscribers from (TOML): one
/// `[[webhook]]` table per (event name, subscriber).
///
/// ```toml
/// [[webhook]]
/// event = "auth-api.user.authenticated"
/// subscriber = "ush-users-api"     # what its delivery rows are recorded under
/// app = "ush"                      # optional: only this app's events (and app-less ones)
/// url = "http://ush-users-api:8000/api/v1/internal/events"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksFile {
    /// The entries.
    #[serde(default)]
    pub webhook: Vec<WebhookEntry>,
}

/// One `[[webhook]]` of a [`WebhooksFile`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookEntry {
    /// The event name.
    pub event: String,
    /// The subscriber's name.
    pub subscriber: String,
    /// Its app, if it wants one app's events.
    pub app: Option<String>,
    /// Where its deliveries go.
    pub url: String,
}

impl WebhooksFile {
    /// Parses the file's text; `path` names it in errors. Every URL must be
    /// absolute and every (event, subscriber) pair appear once.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let refuse = |reason: String| ConfigError::File {
            path: path.display().to_string(),
            reason,
        };
        let file: Self = toml::from_str(text).map_err(|error| refuse(error.to_string()))?;
        let mut seen = HashSet::new();
        for entry in &file.webhook {
            Url::parse(&entry.url).map_err(|error| {
                refuse(format!(
                    "webhook {:?} of {:?}: url {:?}: {error}",
                    entry.subscriber, entry.event, entry.url
                ))
            })?;
            if !seen.insert((entry.event.as_str(), entry.subscriber.as_str())) {
                return Err(refuse(format!(
                    "webhook {:?} of {:?} is listed twice",
                    entry.subscriber, entry.event
                )));
            }
        }
        Ok(file)
    }

    /// Reads and parses the file at `path`.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::File {
            path: path.display().to_string(),
            reason: error.to_string(),
        })?;
        Self::parse(&text, path)
    }

    /// Registers every entry, by event name.
    pub fn register(&self, registrar: &mut dyn WebhookRegistrar) -> Result<(), RegistrationError> {
        let mut by_event: BTreeMap<&str, HashMap<String, WebhookSubscriber>> = BTreeMap::new();
        for entry in &self.webhook {
            let Ok(url) = Url::parse(&entry.url) else {
                return Err(RegistrationError::InvalidUrl {
                    event_name: entry.event.clone(),
                    subscriber: entry.subscriber.clone(),
                    url: entry.url.clone(),
                });
            };
            by_event.entry(&entry.event).or_default().insert(
                entry.subscriber.clone(),
                WebhookSubscriber {
                    app: entry.app.clone(),
                    url,
                },
            );
        }
        for (event, subscribers) in by_event {
            registrar.register_webhooks(event, subscribers)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhooks_files_parse_and_register_by_event() {
        let path = Path::new("webhooks.toml");
        let file = WebhooksFile::parse(
            r#"
            [[webhook]]
            event = "e1"
            subscriber = "a"
            app = "ush"
            url = "http://a.example/events"

            [[webhook]]
            event = "e1"
            subscriber = "b"
            url = "http://b.example/events"

            [[webhook]]
            event = "e2"
            subscriber = "a"
            url = "http://a.example/other"
            "#,
            path,
        )
        .expect("parse");
        #[derive(Default)]
        struct Seen(BTreeMap<String, Vec<(String, Option<String>, String)>>);
        impl WebhookRegistrar for Seen {
            fn register_webhooks(
                &mut self,
                event_name: &str,
                subscribers: HashMap<String, WebhookSubscriber>,
            ) -> Result<(), RegistrationError> {
                let mut entries: Vec<_> = subscribers
                    .into_iter()
                    .map(|(name, subscriber)| (name, subscriber.app, subscriber.url.to_string()))
                    .collect();
                entries.sort();
                self.0.insert(event_name.to_owned(), entries);
                Ok(())
            }
        }
        let mut seen = Seen::default();
        file.register(&mut seen).expect("register");
        assert_eq!(
            seen.0["e1"],
            [
                (
                    "a".to_owned(),
                    Some("ush".to_owned()),
                    "http://a.example/events".to_owned()
                ),
                ("b".to_owned(), None, "http://b.example/events".to_owned()),
            ]
        );
        assert_eq!(seen.0["e2"].len(), 1);

        for bad in [
            "[[webhook]]\nevent = \"e\"\nsubscriber = \"a\"\nurl = \"not a url\"\n",
            "[[webhook]]\nevent = \"e\"\nsubscriber = \"a\"\nurl = \"http://x/\"\n\
             [[webhook]]\nevent = \"e\"\nsubscriber = \"a\"\nurl = \"http://y/\"\n",
            "[[webhook]]\nevent = \"e\"\nsubscriber = \"a\"\nurl = \"http://x/\"\nextra = 1\n",
            "[[hook]]\n",
        ] {
            assert!(
                matches!(
                    WebhooksFile::parse(bad, path),
                    Err(ConfigError::File { .. })
                ),
                "{bad}"
            );
        }
    }
}
