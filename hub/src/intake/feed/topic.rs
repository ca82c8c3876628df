//! Topic templates: how an outbox event's topic URL is built from the
//! hub's public URL and the event's names, and, the other way round, which
//! events a topic URL stands for.

use chrono::DateTime;
use url::Url;

use crate::config::text::{ConfigError, invalid};
use crate::delivery::outbox::{Envelope, EventMatch};

/// The topic template a feed uses unless configured otherwise.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "{public_url}topics/{event_name}";

/// The most ways of reading one topic [`TopicTemplate::events_of`] tells
/// apart. Only placeholders side by side (`{app}{event_name}`) read a topic
/// in more than one way; past this many, the topic is taken to stand for
/// any event, which takes more events than it needs but never fewer.
const MAX_READINGS: usize = 64;

/// The placeholders that stand for an event's values, in the order of
/// [`Readings`]'s slots.
const EVENT_NAME: usize = 0;
const APP: usize = 1;
const RESOURCE_TYPE: usize = 2;
const EVENT_TYPE: usize = 3;

/// One reading of a topic: the decoded value of each placeholder it has.
type Reading = [Option<String>; 4];

/// How an outbox event's topic URL is built: text with placeholders
/// `{public_url}` (the hub's public URL, ending with a slash),
/// `{event_name}`, `{app}` (empty when none), `{resource_type}` and
/// `{event_type}`. Values other than the public URL are percent-encoded
/// (everything but letters, digits and `-._~`), so they stay one path
/// segment or query value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<Part>,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    PublicUrl,
    EventName,
    App,
    ResourceType,
    EventType,
}

impl TopicTemplate {
    /// Parses a template; an unknown placeholder or an unmatched brace is
    /// refused.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let refuse = |reason: String| invalid("topic-template", text, reason);
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Literal(rest.to_owned()));
                    break;
                }
                Some(at) if rest[at..].starts_with('}') => {
                    return Err(refuse("a `}` without its `{`".to_owned()));
                }
                Some(at) => {
                    if at > 0 {
                        parts.push(Part::Literal(rest[..at].to_owned()));
                    }
                    let Some(end) = rest[at..].find('}') else {
                        return Err(refuse("a `{` without its `}`".to_owned()));
                    };
                    let name = &rest[at + 1..at + end];
                    parts.push(match name {
                        "public_url" => Part::PublicUrl,
                        "event_name" => Part::EventName,
                        "app" => Part::App,
                        "resource_type" => Part::ResourceType,
                        "event_type" => Part::EventType,
                        other => {
                            return Err(refuse(format!(
                                "unknown placeholder {{{other}}} (known: {{public_url}}, \
                                 {{event_name}}, {{app}}, {{resource_type}}, {{event_type}})"
                            )));
                        }
                    });
                    rest = &rest[at + end + 1..];
                }
            }
        }
        Ok(Self {
            parts,
            text: text.to_owned(),
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The topic of `envelope` for a hub at `public_url`.
    pub fn render(&self, public_url: &Url, envelope: &Envelope) -> String {
        let mut topic = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => topic.push_str(text),
                Part::PublicUrl => topic.push_str(public_url.as_str()),
                Part::EventName => encode_into(&mut topic, &envelope.event_name),
                Part::App => encode_into(&mut topic, envelope.app.as_deref().unwrap_or("")),
                Part::ResourceType => encode_into(&mut topic, &envelope.resource_type),
                Part::EventType => encode_into(&mut topic, &envelope.event_type),
            }
        }
        topic
    }

    /// The events whose topic is `topic` for a hub at `public_url`: one
    /// description per way of reading the topic against the template
    /// (usually one; none when no event renders it), with the values of
    /// placeholders the template lacks left open. An empty `{app}` reads as
    /// the app `""`, which events without one have.
    pub fn events_of(&self, public_url: &Url, topic: &str) -> Vec<EventMatch> {
        let mut readings = Vec::new();
        self.read(
            &self.parts,
            public_url.as_str(),
            topic,
            &mut Reading::default(),
            &mut readings,
        );
        if readings.len() > MAX_READINGS {
            return vec![EventMatch::default()];
        }
        readings
            .into_iter()
            .map(|[event_name, app, resource_type, event_type]| EventMatch {
                event_name,
                app,
                resource_type,
                event_type,
                since: None,
            })
            .collect()
    }

    /// Reads `rest` against `parts`, adding every complete reading to
    /// `readings` (one past [`MAX_READINGS`] at most).
    fn read(
        &self,
        parts: &[Part],
        public_url: &str,
        rest: &str,
        reading: &mut Reading,
        readings: &mut Vec<Reading>,
    ) {
        if readings.len() > MAX_READINGS {
            return;
        }
        let Some((part, later)) = parts.split_first() else {
            if rest.is_empty() {
                readings.push(reading.clone());
            }
            return;
        };
        let slot = match part {
            Part::Literal(text) => {
                if let Some(after) = rest.strip_prefix(text.as_str()) {
                    self.read(later, public_url, after, reading, readings);
                }
                return;
            }
            Part::PublicUrl => {
                if let Some(after) = rest.strip_prefix(public_url) {
                    self.read(later, public_url, after, reading, readings);
                }
                return;
            }
            Part::EventName => EVENT_NAME,
            Part::App => APP,
            Part::ResourceType => RESOURCE_TYPE,
            Part::EventType => EVENT_TYPE,
        };
        // A placeholder used twice has one value.
        if let Some(value) = &reading[slot] {
            let mut encoded = String::new();
            encode_into(&mut encoded, value);
            if let Some(after) = rest.strip_prefix(encoded.as_str()) {
                self.read(later, public_url, after, reading, readings);
            }
            return;
        }
        for end in encoded_prefix_ends(rest) {
            let Some(value) = decode_rendered(&rest[..end]) else {
                continue;
            };
            reading[slot] = Some(value);
            self.read(later, public_url, &rest[end..], reading, readings);
            reading[slot] = None;
        }
    }

    /// Checks that the template renders absolute http(s) URLs for a hub at
    /// `public_url`.
    pub fn check(&self, public_url: &Url) -> Result<(), ConfigError> {
        let sample = Envelope {
            event_id: uuid::Uuid::nil(),
            event_name: "auth-api.user.authenticated".to_owned(),
            app: Some("app".to_owned()),
            occurred_at: DateTime::UNIX_EPOCH,
            resource_type: "user".to_owned(),
            resource_id: "1".to_owned(),
            event_type: "authenticated".to_owned(),
            data: serde_json::Value::Null,
        };
        let rendered = self.render(public_url, &sample);
        match Url::parse(&rendered) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(()),
            _ => Err(invalid(
                "topic-template",
                &self.text,
                format!("renders {rendered:?}, not an absolute http(s) URL"),
            )),
        }
    }
}

/// Appends `value` percent-encoded: everything but RFC 3986's unreserved
/// characters.
fn encode_into(out: &mut String, value: &str) {
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}

/// Where a placeholder's value may end in `text`: at its start, and after
/// each character [`encode_into`] writes (an unreserved character or a
/// `%XX` escape with uppercase digits), as far as they go.
fn encoded_prefix_ends(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    let hex = |byte: u8| byte.is_ascii_digit() || (b'A'..=b'F').contains(&byte);
    let mut ends = vec![0];
    let mut at = 0;
    loop {
        match bytes.get(at..) {
            Some([byte, ..]) if byte.is_ascii_alphanumeric() || b"-._~".contains(byte) => at += 1,
            Some([b'%', high, low, ..]) if hex(*high) && hex(*low) => at += 3,
            _ => return ends,
        }
        ends.push(at);
    }
}

/// The value [`encode_into`] rendered as `text`, if it rendered one: valid
/// UTF-8, and no escape of a character it writes as itself.
fn decode_rendered(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let byte = u8::from_str_radix(text.get(at + 1..at + 3)?, 16).ok()?;
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                return None;
            }
            decoded.push(byte);
            at += 3;
        } else {
            decoded.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(app: Option<&str>) -> Envelope {
        Envelope {
            event_id: uuid::Uuid::nil(),
            event_name: "auth-api.user.authenticated".to_owned(),
            app: app.map(str::to_owned),
            occurred_at: DateTime::UNIX_EPOCH,
            resource_type: "user profile".to_owned(),
            resource_id: "1".to_owned(),
            event_type: "authenticated".to_owned(),
            data: serde_json::Value::Null,
        }
    }

    fn hub() -> Url {
        Url::parse("https://hub.example/websub/").expect("url")
    }

    #[test]
    fn the_default_template_puts_topics_under_the_hub() {
        let template = TopicTemplate::parse(DEFAULT_TOPIC_TEMPLATE).expect("valid");
        assert_eq!(
            template.render(&hub(), &envelope(None)),
            "https://hub.example/websub/topics/auth-api.user.authenticated"
        );
        template.check(&hub()).expect("renders URLs");
    }

    #[test]
    fn placeholders_are_encoded_and_app_may_be_empty() {
        let template =
            TopicTemplate::parse("{public_url}{app}/{resource_type}/{event_type}?e={event_name}")
                .expect("valid");
        assert_eq!(
            template.render(&hub(), &envelope(Some("ush/ü"))),
            "https://hub.example/websub/ush%2F%C3%BC/user%20profile/authenticated?e=auth-api.user.authenticated"
        );
        assert_eq!(
            template.render(&hub(), &envelope(None)),
            "https://hub.example/websub//user%20profile/authenticated?e=auth-api.user.authenticated"
        );
    }

    fn described(
        event_name: Option<&str>,
        app: Option<&str>,
        resource_type: Option<&str>,
        event_type: Option<&str>,
    ) -> EventMatch {
        EventMatch {
            event_name: event_name.map(str::to_owned),
            app: app.map(str::to_owned),
            resource_type: resource_type.map(str::to_owned),
            event_type: event_type.map(str::to_owned),
            since: None,
        }
    }

    #[test]
    fn a_topic_reads_back_as_the_events_that_render_it() {
        let default = TopicTemplate::parse(DEFAULT_TOPIC_TEMPLATE).expect("valid");
        assert_eq!(
            default.events_of(
                &hub(),
                "https://hub.example/websub/topics/auth-api.user.authenticated"
            ),
            [described(
                Some("auth-api.user.authenticated"),
                None,
                None,
                None
            )]
        );
        for foreign in [
            "https://other.example/websub/topics/x",
            "https://hub.example/websub/topics/a/b",
            // Not how the template writes a value: never rendered.
            "https://hub.example/websub/topics/caf%c3%a9",
            "https://hub.example/websub/topics/%41",
            "https://hub.example/websub/topics/%FF",
        ] {
            assert!(default.events_of(&hub(), foreign).is_empty(), "{foreign}");
        }

        let template =
            TopicTemplate::parse("{public_url}{app}/{resource_type}/{event_type}?e={event_name}")
                .expect("valid");
        for app in [Some("ush/\u{fc}"), None] {
            let rendered = template.render(&hub(), &envelope(app));
            assert_eq!(
                template.events_of(&hub(), &rendered),
                [described(
                    Some("auth-api.user.authenticated"),
                    Some(app.unwrap_or("")),
                    Some("user profile"),
                    Some("authenticated")
                )],
                "{rendered}"
            );
        }
    }

    #[test]
    fn placeholders_side_by_side_read_every_way_and_repeated_ones_agree() {
        let side_by_side = TopicTemplate::parse("{public_url}{app}{event_type}").expect("valid");
        let readings = side_by_side.events_of(&hub(), "https://hub.example/websub/ab");
        assert_eq!(
            readings,
            [
                described(None, Some(""), None, Some("ab")),
                described(None, Some("a"), None, Some("b")),
                described(None, Some("ab"), None, Some("")),
            ]
        );
        let long = format!("https://hub.example/websub/{}", "a".repeat(200));
        assert_eq!(
            side_by_side.events_of(&hub(), &long),
            [EventMatch::default()],
            "too many readings: any event"
        );

        let repeated =
            TopicTemplate::parse("{public_url}{event_name}/{event_name}").expect("valid");
        assert_eq!(
            repeated.events_of(&hub(), "https://hub.example/websub/a.b/a.b"),
            [described(Some("a.b"), None, None, None)]
        );
        assert!(
            repeated
                .events_of(&hub(), "https://hub.example/websub/a/b")
                .is_empty()
        );
        let fixed = TopicTemplate::parse("{public_url}everything").expect("valid");
        assert_eq!(
            fixed.events_of(&hub(), "https://hub.example/websub/everything"),
            [EventMatch::default()]
        );
    }

    #[test]
    fn bad_templates_are_refused() {
        for bad in ["{public_url}{nope}", "{public_url", "x}{event_name}"] {
            assert!(
                matches!(
                    TopicTemplate::parse(bad),
                    Err(ConfigError::Invalid {
                        setting: "topic-template",
                        ..
                    })
                ),
                "{bad}"
            );
        }
        let relative = TopicTemplate::parse("topics/{event_name}").expect("parses");
        assert!(relative.check(&hub()).is_err(), "not an absolute URL");
    }
}
