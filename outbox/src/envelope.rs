//! The envelope an outbox event travels in: the JSON body of a webhook
//! delivery, what an in-process handler receives, and the content of the hub
//! event the WebSub bridge records. One pure encoding, tested here.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// The Content-Type of an envelope, wherever it travels.
pub const ENVELOPE_CONTENT_TYPE: &str = "application/json";

/// One outbox event as delivered. Serialized with the messaging contract's
/// field names, in its order; `app` is left out when the event has none and
/// `occurred_at` is RFC 3339 in UTC with a `Z` (fractional seconds only
/// when there are any).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The event's id: receivers de-duplicate on it (delivery is at least
    /// once).
    pub event_id: Uuid,
    /// The event name subscribers register for.
    pub event_name: String,
    /// The application the event belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    /// When the event was written (its row's `created_at`).
    #[serde(serialize_with = "rfc3339_utc", deserialize_with = "parse_rfc3339")]
    pub occurred_at: DateTime<Utc>,
    /// The kind of resource.
    pub resource_type: String,
    /// Which resource.
    pub resource_id: String,
    /// What happened to it.
    pub event_type: String,
    /// The event's payload.
    pub data: serde_json::Value,
}

impl Envelope {
    /// The JSON body, exactly as POSTed and signed.
    pub fn to_json(&self) -> Vec<u8> {
        // Every field is a string, a UUID, a timestamp or a JSON value, none
        // of which can fail to serialize.
        serde_json::to_vec(self).unwrap_or_else(|error| unreachable!("envelope encodes: {error}"))
    }
}

fn rfc3339_utc<S: Serializer>(at: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&at.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

fn parse_rfc3339<'de, D: Deserializer<'de>>(deserializer: D) -> Result<DateTime<Utc>, D::Error> {
    let text = String::deserialize(deserializer)?;
    DateTime::parse_from_rfc3339(&text)
        .map(|at| at.with_timezone(&Utc))
        .map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn envelope(app: Option<&str>) -> Envelope {
        Envelope {
            event_id: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001),
            event_name: "auth-api.user.authenticated".to_owned(),
            app: app.map(str::to_owned),
            occurred_at: Utc
                .with_ymd_and_hms(2026, 9, 4, 10, 0, 0)
                .single()
                .expect("valid date"),
            resource_type: "user".to_owned(),
            resource_id: "42".to_owned(),
            event_type: "authenticated".to_owned(),
            data: serde_json::json!({"b": 1, "a": [true, null]}),
        }
    }

    #[test]
    fn encodes_the_contract_fields_in_order() {
        let body = String::from_utf8(envelope(Some("ush")).to_json()).expect("utf-8");
        assert_eq!(
            body,
            "{\"event_id\":\"01900000-0000-7000-8000-000000000001\",\
             \"event_name\":\"auth-api.user.authenticated\",\"app\":\"ush\",\
             \"occurred_at\":\"2026-09-04T10:00:00Z\",\"resource_type\":\"user\",\
             \"resource_id\":\"42\",\"event_type\":\"authenticated\",\
             \"data\":{\"a\":[true,null],\"b\":1}}"
        );
    }

    #[test]
    fn omits_app_when_none_and_round_trips() {
        let original = envelope(None);
        let body = original.to_json();
        let text = String::from_utf8(body.clone()).expect("utf-8");
        assert!(!text.contains("\"app\""), "{text}");
        let decoded: Envelope = serde_json::from_slice(&body).expect("decodes");
        assert_eq!(decoded, original);
    }

    #[test]
    fn keeps_sub_second_precision() {
        let mut with_micros = envelope(None);
        with_micros.occurred_at += chrono::Duration::microseconds(1_500);
        let text = String::from_utf8(with_micros.to_json()).expect("utf-8");
        assert!(
            text.contains("\"occurred_at\":\"2026-09-04T10:00:00.001500Z\""),
            "{text}"
        );
    }
}
