//! Outbox events as CloudEvents 1.0 over HTTP, for a webhook that asks for
//! them ([`WebhookFormat`]) instead of the messaging contract's envelope.
//!
//! The envelope maps onto the context attributes as follows: `id` is the
//! event id, `source` is `/{app}/{resource_type}` (`/{resource_type}` for
//! an event of no app), `type` is the event name, `time` is when the event
//! was written, `subject` is the resource id, and `data` is the payload,
//! as `application/json`. Two extension attributes carry the rest:
//! `eventtype` (what happened to the resource) and, when there is one,
//! `appname`. In binary mode the attributes travel as `ce-` headers
//! (percent-encoded where the HTTP binding asks) and the body is the data;
//! in structured mode the body is the whole event as
//! `application/cloudevents+json`. Either body is signed as the envelope
//! would be.

use bytes::Bytes;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use reqwest::header::{HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::json;
use websub_outbox::Envelope;

/// How a webhook's events are sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum WebhookFormat {
    /// The messaging contract's JSON envelope (the default).
    #[default]
    #[serde(rename = "envelope")]
    Envelope,
    /// CloudEvents in binary content mode: `ce-` headers, the data as the
    /// body.
    #[serde(rename = "cloudevents-binary")]
    CloudEventsBinary,
    /// CloudEvents in structured content mode: the event as one JSON body.
    #[serde(rename = "cloudevents-structured")]
    CloudEventsStructured,
}

/// The Content-Type of a structured CloudEvent.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json; charset=utf-8";

/// The Content-Type of the data, in binary mode.
pub const DATA_CONTENT_TYPE: &str = "application/json";

/// What the HTTP binding asks to be percent-encoded in a header value:
/// everything outside printable ASCII (non-ASCII is always encoded), and
/// space, the double quote and the percent sign.
const HEADER_UNSAFE: &AsciiSet = &CONTROLS.add(b' ').add(b'"').add(b'%');

/// The context attributes of `envelope`, by name, in the order the spec
/// lists them.
fn attributes(envelope: &Envelope) -> Vec<(&'static str, String)> {
    let source = match envelope.app.as_deref().filter(|app| !app.is_empty()) {
        Some(app) => format!("/{app}/{}", envelope.resource_type),
        None => format!("/{}", envelope.resource_type),
    };
    let mut attributes = vec![
        ("specversion", "1.0".to_owned()),
        ("id", envelope.event_id.to_string()),
        ("source", source),
        ("type", envelope.event_name.clone()),
        (
            "time",
            envelope
                .occurred_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        ),
        ("subject", envelope.resource_id.clone()),
        ("eventtype", envelope.event_type.clone()),
    ];
    if let Some(app) = envelope.app.as_deref().filter(|app| !app.is_empty()) {
        attributes.push(("appname", app.to_owned()));
    }
    attributes
}

/// The body of `envelope` in structured mode.
pub fn structured(envelope: &Envelope) -> Bytes {
    let mut event = serde_json::Map::new();
    for (name, value) in attributes(envelope) {
        event.insert(name.to_owned(), json!(value));
    }
    event.insert("datacontenttype".to_owned(), json!(DATA_CONTENT_TYPE));
    event.insert("data".to_owned(), envelope.data.clone());
    Bytes::from(serde_json::to_vec(&event).unwrap_or_default())
}

/// The `ce-` headers of `envelope` in binary mode, and its body (the data).
pub fn binary(envelope: &Envelope) -> (Vec<(HeaderName, HeaderValue)>, Bytes) {
    let headers = attributes(envelope)
        .into_iter()
        .filter_map(|(name, value)| {
            let name = HeaderName::try_from(format!("ce-{name}")).ok()?;
            let value =
                HeaderValue::try_from(utf8_percent_encode(&value, HEADER_UNSAFE).to_string())
                    .ok()?;
            Some((name, value))
        })
        .collect();
    let body = Bytes::from(serde_json::to_vec(&envelope.data).unwrap_or_default());
    (headers, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(app: Option<&str>) -> Envelope {
        Envelope {
            event_id: uuid::Uuid::nil(),
            event_name: "shop.order.created".to_owned(),
            app: app.map(str::to_owned),
            occurred_at: chrono::DateTime::from_timestamp(1_764_583_200, 0).expect("a time"),
            resource_type: "order".to_owned(),
            resource_id: "Zoë 42".to_owned(),
            event_type: "created".to_owned(),
            data: json!({"order": 42}),
        }
    }

    #[test]
    fn the_envelope_maps_onto_the_context_attributes() {
        let event: serde_json::Value =
            serde_json::from_slice(&structured(&envelope(Some("shop")))).expect("JSON");
        assert_eq!(
            event,
            json!({
                "specversion": "1.0",
                "id": "00000000-0000-0000-0000-000000000000",
                "source": "/shop/order",
                "type": "shop.order.created",
                "time": "2025-12-01T10:00:00Z",
                "subject": "Zoë 42",
                "eventtype": "created",
                "appname": "shop",
                "datacontenttype": "application/json",
                "data": {"order": 42},
            })
        );
        let (headers, body) = binary(&envelope(None));
        let header = |name: &str| {
            headers
                .iter()
                .find(|(header, _)| header.as_str() == name)
                .map(|(_, value)| value.to_str().expect("ASCII").to_owned())
        };
        assert_eq!(header("ce-source").as_deref(), Some("/order"));
        assert_eq!(header("ce-subject").as_deref(), Some("Zo%C3%AB%2042"));
        assert_eq!(header("ce-appname"), None);
        assert_eq!(&body[..], br#"{"order":42}"#);
    }
}
