//! Topic templates: how an outbox event's topic URL is built from the
//! hub's public URL and the event's names.

use chrono::DateTime;
use url::Url;

use crate::outbox::Envelope;
use crate::setting::{ConfigError, invalid};

/// The topic template a feed uses unless configured otherwise.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "{public_url}topics/{event_name}";

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
