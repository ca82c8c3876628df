//! The webhooks file: a feed's webhook subscribers, by event name, read
//! from TOML and registered with the feed's dispatcher.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use url::Url;

use crate::config::text::ConfigError;
use crate::delivery::client::{ClientIdentity, IdentityFile};
use crate::delivery::outbox::{
    RegistrationError, WebhookFormat, WebhookRegistrar, WebhookSubscriber,
};

/// The webhooks file a feed reads its webhook subscribers from (TOML): one
/// `[[webhook]]` table per (event name, subscriber).
///
/// ```toml
/// [[webhook]]
/// event = "auth-api.user.authenticated"
/// subscriber = "ush-users-api"     # what its delivery rows are recorded under
/// app = "ush"                      # optional: only this app's events (and app-less ones)
/// url = "http://ush-users-api:8000/api/v1/internal/events"
/// ordered = true                   # optional: one at a time, in recording order
/// max_in_flight = 4                # optional: in place of the feed's delivery_per_subscriber
/// client_cert = "certs/users.pem"  # optional: shown when it asks for a client certificate
/// client_key = "certs/users-key.pem"
/// format = "cloudevents-binary"    # optional: or cloudevents-structured; envelope by default
/// ```
///
/// `ordered`, `max_in_flight`, the client certificate and the format go
/// beyond the messaging contract. They apply to a subscriber, not to one of
/// its event names, so every entry of a subscriber must give the same
/// values (or leave them out alike). A relative certificate or key path is taken from
/// the webhooks file's directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksFile {
    /// The entries.
    #[serde(default)]
    pub webhook: Vec<WebhookEntry>,
    /// The client certificates the file names, read, by subscriber.
    #[serde(skip)]
    identities: HashMap<String, ClientIdentity>,
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
    /// Its events one at a time, strictly in recording order.
    #[serde(default)]
    pub ordered: bool,
    /// The most attempts in flight to it at once, in place of the feed's
    /// `delivery_per_subscriber`.
    pub max_in_flight: Option<usize>,
    /// The PEM file of the client certificate it is shown when it asks for
    /// one, in place of the feed's or the hub's; needs `client_key`.
    pub client_cert: Option<PathBuf>,
    /// The PEM file of `client_cert`'s private key.
    pub client_key: Option<PathBuf>,
    /// How its events are sent: `envelope` (the default),
    /// `cloudevents-binary` or `cloudevents-structured`.
    #[serde(default)]
    pub format: WebhookFormat,
}

impl WebhooksFile {
    /// Parses the file's text; `path` names it in errors. Every URL must be
    /// absolute, every (event, subscriber) pair appear once, and every entry
    /// of one subscriber agree on `ordered` and `max_in_flight` (at least 1,
    /// and 1 at most for an ordered subscriber).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let refuse = |reason: String| ConfigError::File {
            path: path.display().to_string(),
            reason,
        };
        let mut file: Self = toml::from_str(text).map_err(|error| refuse(error.to_string()))?;
        let directory = path.parent().unwrap_or(Path::new(""));
        for entry in &mut file.webhook {
            for file_path in [&mut entry.client_cert, &mut entry.client_key]
                .into_iter()
                .flatten()
            {
                if file_path.is_relative() {
                    *file_path = directory.join(&*file_path);
                }
            }
        }
        let mut seen = HashSet::new();
        let mut certificates: HashMap<&str, (&Option<PathBuf>, &Option<PathBuf>)> = HashMap::new();
        let mut delivery: HashMap<&str, (bool, Option<usize>, WebhookFormat, &str)> =
            HashMap::new();
        for entry in &file.webhook {
            if entry.max_in_flight == Some(0) {
                return Err(refuse(format!(
                    "webhook {:?} of {:?}: max_in_flight must be at least 1",
                    entry.subscriber, entry.event
                )));
            }
            if entry.ordered && entry.max_in_flight.is_some_and(|limit| limit > 1) {
                return Err(refuse(format!(
                    "webhook {:?} of {:?}: an ordered subscriber has one delivery in flight; \
                     max_in_flight cannot be more",
                    entry.subscriber, entry.event
                )));
            }
            let (ordered, max_in_flight, format, first) =
                *delivery.entry(&entry.subscriber).or_insert((
                    entry.ordered,
                    entry.max_in_flight,
                    entry.format,
                    &entry.event,
                ));
            if (ordered, max_in_flight, format)
                != (entry.ordered, entry.max_in_flight, entry.format)
            {
                return Err(refuse(format!(
                    "webhook {:?}: its entries for {first:?} and {:?} disagree on ordered, \
                     max_in_flight or format; give every entry of a subscriber the same",
                    entry.subscriber, entry.event
                )));
            }
            let certificate = (&entry.client_cert, &entry.client_key);
            if *certificates.entry(&entry.subscriber).or_insert(certificate) != certificate {
                return Err(refuse(format!(
                    "webhook {:?}: its entries disagree on client_cert or client_key; give \
                     every entry of a subscriber the same",
                    entry.subscriber
                )));
            }
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
        let mut identities = HashMap::new();
        for (subscriber, (certificate, key)) in certificates {
            let identity = match (certificate, key) {
                (None, None) => continue,
                (Some(certificate), Some(key)) => ClientIdentity::from_pem_files(certificate, key)
                    .map_err(|(file, error)| {
                        let (setting, named) = match file {
                            IdentityFile::Certificate => ("client_cert", certificate),
                            IdentityFile::Key => ("client_key", key),
                        };
                        refuse(format!(
                            "webhook {subscriber:?}: {setting} {}: {error}",
                            named.display()
                        ))
                    })?,
                _ => {
                    return Err(refuse(format!(
                        "webhook {subscriber:?}: client_cert and client_key go together"
                    )));
                }
            };
            identities.insert(subscriber.to_owned(), identity);
        }
        file.identities = identities;
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
                    ordered: entry.ordered,
                    max_in_flight: entry.max_in_flight,
                    identity: self.identities.get(&entry.subscriber).cloned(),
                    format: entry.format,
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

    #[test]
    fn ordered_and_max_in_flight_are_read_and_must_agree_per_subscriber() {
        let path = Path::new("webhooks.toml");
        let file = WebhooksFile::parse(
            r#"
            [[webhook]]
            event = "e1"
            subscriber = "ledger"
            url = "http://ledger.example/events"
            ordered = true

            [[webhook]]
            event = "e2"
            subscriber = "ledger"
            url = "http://ledger.example/events"
            ordered = true
            max_in_flight = 1

            [[webhook]]
            event = "e1"
            subscriber = "mailer"
            url = "http://mailer.example/events"
            max_in_flight = 2

            [[webhook]]
            event = "e1"
            subscriber = "search"
            url = "http://search.example/events"
            "#,
            path,
        );
        // `max_in_flight = 1` on one ordered entry and not the other:
        // they disagree.
        let Err(ConfigError::File { reason, .. }) = file else {
            panic!("a disagreement is refused: {file:?}");
        };
        assert!(reason.contains("\"ledger\""), "{reason}");

        let file = WebhooksFile::parse(
            r#"
            [[webhook]]
            event = "e1"
            subscriber = "ledger"
            url = "http://ledger.example/events"
            ordered = true

            [[webhook]]
            event = "e2"
            subscriber = "ledger"
            url = "http://ledger.example/events"
            ordered = true

            [[webhook]]
            event = "e1"
            subscriber = "mailer"
            url = "http://mailer.example/events"
            max_in_flight = 2

            [[webhook]]
            event = "e1"
            subscriber = "search"
            url = "http://search.example/events"
            "#,
            path,
        )
        .expect("parse");
        let read: Vec<_> = file
            .webhook
            .iter()
            .map(|entry| {
                (
                    entry.subscriber.as_str(),
                    entry.ordered,
                    entry.max_in_flight,
                )
            })
            .collect();
        assert_eq!(
            read,
            [
                ("ledger", true, None),
                ("ledger", true, None),
                ("mailer", false, Some(2)),
                ("search", false, None),
            ]
        );
        #[derive(Default)]
        struct Seen(Vec<(String, String, bool, Option<usize>)>);
        impl WebhookRegistrar for Seen {
            fn register_webhooks(
                &mut self,
                event_name: &str,
                subscribers: HashMap<String, WebhookSubscriber>,
            ) -> Result<(), RegistrationError> {
                for (name, subscriber) in subscribers {
                    self.0.push((
                        event_name.to_owned(),
                        name,
                        subscriber.ordered,
                        subscriber.max_in_flight,
                    ));
                }
                Ok(())
            }
        }
        let mut seen = Seen::default();
        file.register(&mut seen).expect("register");
        seen.0.sort();
        assert_eq!(
            seen.0,
            [
                ("e1".to_owned(), "ledger".to_owned(), true, None),
                ("e1".to_owned(), "mailer".to_owned(), false, Some(2)),
                ("e1".to_owned(), "search".to_owned(), false, None),
                ("e2".to_owned(), "ledger".to_owned(), true, None),
            ]
        );

        let entry = |event: &str, extra: &str| {
            format!(
                "[[webhook]]\nevent = \"{event}\"\nsubscriber = \"a\"\nurl = \"http://x/\"\n{extra}\n"
            )
        };
        for (bad, names) in [
            // Ordered on one entry, not on the other.
            (entry("e1", "ordered = true") + &entry("e2", ""), "\"a\""),
            // Different limits.
            (
                entry("e1", "max_in_flight = 2") + &entry("e2", "max_in_flight = 3"),
                "\"a\"",
            ),
            // No room at all.
            (entry("e1", "max_in_flight = 0"), "max_in_flight"),
            // Ordered is one at a time.
            (entry("e1", "ordered = true\nmax_in_flight = 2"), "ordered"),
            (entry("e1", "ordered = \"yes\""), "ordered"),
        ] {
            match WebhooksFile::parse(&bad, path) {
                Err(ConfigError::File { reason, .. }) => {
                    assert!(reason.contains(names), "{bad}: {reason}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn client_certificates_are_read_from_the_files_directory_and_must_agree() {
        let (cert, key) = crate::config::test_settings::test_identity_files();
        let directory = cert.parent().expect("a scratch directory");
        let path = directory.join("webhooks.toml");
        let name = |file: &std::path::PathBuf| {
            file.file_name()
                .and_then(|name| name.to_str())
                .expect("a file name")
                .to_owned()
        };
        let entry = |event: &str, subscriber: &str, cert: &str, key: &str| {
            format!(
                "[[webhook]]\nevent = \"{event}\"\nsubscriber = \"{subscriber}\"\n\
                 url = \"https://{subscriber}.example/\"\nclient_cert = \"{cert}\"\n\
                 client_key = \"{key}\"\n"
            )
        };
        let text = entry("e1", "mtls", &name(&cert), &name(&key))
            + &entry("e2", "mtls", &name(&cert), &name(&key));
        let file = WebhooksFile::parse(&text, &path).expect("relative paths, read");
        assert_eq!(file.webhook[0].client_cert.as_deref(), Some(cert.as_path()));
        let mut registered = Vec::new();
        struct Collect<'a>(&'a mut Vec<WebhookSubscriber>);
        impl WebhookRegistrar for Collect<'_> {
            fn register_webhooks(
                &mut self,
                _: &str,
                subscribers: HashMap<String, WebhookSubscriber>,
            ) -> Result<(), RegistrationError> {
                self.0.extend(subscribers.into_values());
                Ok(())
            }
        }
        file.register(&mut Collect(&mut registered))
            .expect("registered");
        assert_eq!(registered.len(), 2);
        assert!(
            registered
                .iter()
                .all(|subscriber| subscriber.identity.is_some())
        );

        for (bad, says) in [
            (
                entry("e1", "mtls", &name(&cert), &name(&key))
                    + &entry("e2", "mtls", &name(&cert), "other-key.pem"),
                "disagree on client_cert or client_key",
            ),
            (
                entry("e1", "mtls", "missing.pem", &name(&key)),
                "client_cert",
            ),
            (
                entry("e1", "mtls", &name(&key), &name(&key)),
                "no certificate",
            ),
        ] {
            match WebhooksFile::parse(&bad, &path) {
                Err(ConfigError::File { reason, .. }) => {
                    assert!(reason.contains(says), "{bad}: {reason}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
