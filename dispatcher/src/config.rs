//! The dispatcher's settings, their messaging-contract defaults, and the
//! validation that names the first bad one.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::{HeaderName, HeaderValue};

use crate::{OutboxTables, check_channel};
use websub_delivery::RetryPolicy;
use websub_delivery::attempt::{MESSAGING_SCHEME, STANDARD_WEBHOOKS_SCHEME, SignatureScheme};
use websub_delivery::client::Trust;
use websub_delivery::net::NetPolicy;
use websub_delivery::setting::{ConfigError, invalid};
use websub_protocol::signature::{
    MESSAGING_EVENT_ID_HEADER, MESSAGING_SIGNATURE_HEADER, standard_key,
};

/// Everything a dispatcher needs besides its pool. [`Default`] gives the
/// messaging contract's defaults; set what differs, then
/// [`Dispatcher::new`](super::Dispatcher::new) validates it.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// The outbox and deliveries tables.
    pub tables: OutboxTables,
    /// The `NOTIFY` channel to listen on; `None` is
    /// [`OutboxTables::default_channel`], what [`Outbox`](crate::Outbox) notifies on
    /// by default.
    pub channel: Option<String>,
    /// The subscriber in-process handlers deliver as. Stored in every one of
    /// their delivery rows, so it must stay stable: a new name orphans the
    /// old rows and re-delivers every event inside `start_from`. Required to
    /// register a handler; a dispatcher that only sends webhooks needs none.
    pub subscriber_name: Option<String>,
    /// How far back expansion looks: events created before this get no new
    /// delivery rows, so a newly registered subscriber does not replay the
    /// whole history. Rows that exist are delivered whatever their age.
    /// `None` looks at every event.
    pub start_from: Option<DateTime<Utc>>,
    /// How often to expand and claim when nothing wakes the dispatcher.
    pub poll_interval: Duration,
    /// Retries after a failed first attempt and their backoff (10, the last
    /// after 10 s): a row whose retries are exhausted is never claimed again
    /// and keeps its `last_error`.
    pub retry: RetryPolicy,
    /// Listener reconnection failures over which the wait grows from zero to
    /// `listener_max_backoff` (10); past them it stays there, forever.
    pub listener_max_retries: u32,
    /// The longest wait between listener reconnection attempts (30 s).
    pub listener_max_backoff: Duration,
    /// How often the listener's connection is checked with a `NOTIFY` to
    /// itself (30 s): a connection that lost its peer without a word (a
    /// network partition) is found dead when the previous check has not come
    /// back by the time the next is due.
    pub listener_ping_interval: Duration,
    /// Time allowed for one webhook POST (by the default client) or one
    /// handler call (10 s).
    pub delivery_timeout: Duration,
    /// A claim older than this is taken to be from a dead process and its
    /// row becomes claimable again (60 s). Must exceed `delivery_timeout`.
    pub visibility_timeout: Duration,
    /// The secret webhook bodies are signed with
    /// ([`MESSAGING_SIGNATURE_HEADER`]); no signature without one.
    pub signing_secret: Option<String>,
    /// The secret `signing_secret` replaces, while receivers move to the
    /// new one: under Standard Webhooks every request carries a signature
    /// with each (space-separated, as the scheme allows), so a receiver
    /// holding either verifies it; the messaging contract's single header
    /// carries the new one's (its receivers accept both meanwhile). Remove
    /// it once every receiver holds the new secret.
    pub previous_signing_secret: Option<String>,
    /// How webhooks are signed: the messaging contract's headers (the
    /// default), or Standard Webhooks' (`signing_secret` is then a
    /// `whsec_…` secret).
    pub signature_scheme: WebhookSignature,
    /// Headers sent with every webhook POST, e.g. an internal API key.
    pub webhook_headers: Vec<(String, String)>,
    /// Which addresses webhooks may be POSTed to: by default public ones
    /// only, as for WebSub callbacks. Webhooks of services on the same
    /// private network need `allow_private_network`.
    pub network: NetPolicy,
    /// The roots trusted for HTTPS webhooks: the system's by default.
    pub trust: Trust,
    /// Delete events older than this (and their delivery rows), every
    /// `retention_interval`, starting at start-up. `None` deletes nothing.
    pub retention: Option<Duration>,
    /// How often the retention sweep runs (an hour).
    pub retention_interval: Duration,
    /// Delivery rows claimed per round trip at most (100).
    pub batch_size: usize,
    /// Attempts in flight at once, over all subscribers (64).
    pub concurrency: usize,
    /// Attempts in flight at once to one subscriber at most (16), so that a
    /// slow one cannot take every slot. Its limit adapts below this to how
    /// its webhook answers (see [`websub_delivery::limit`]), from
    /// [`websub_delivery::limit::INITIAL_LIMIT`] and never under
    /// `per_subscriber_min`. A subscriber's rows are claimed up to four
    /// times this many ahead (fewer when the visibility timeout leaves less
    /// than four delivery timeouts of patience), so that its next attempt is
    /// ready the moment one finishes.
    pub per_subscriber: usize,
    /// The least a subscriber's adapting limit falls to (1).
    pub per_subscriber_min: usize,
    /// How far before the previous scan a polling scan starts looking (60 s):
    /// an event's `created_at` is its transaction's start, so one committed
    /// later than this after it began is found by the next full scan rather
    /// than the next poll (or at once, if it was notified).
    pub expand_lookback: Duration,
    /// How long any one statement the dispatcher runs may take (60 s)
    /// before it is abandoned, with its connection, and retried: a
    /// connection whose peer vanished without closing it would otherwise
    /// hold the dispatcher until the operating system gives up on it.
    pub query_timeout: Duration,
    /// How often expansion looks at every event since `start_from` rather
    /// than only recent ones (5 min). It also does at start-up, after the
    /// listener reconnects, and whenever registrations change.
    pub catch_up_interval: Duration,
    /// Failed attempts in a row that open a webhook's breaker (0, the
    /// default: no breaker, every row tried to its own retry limit, as the
    /// messaging contract has it). Beyond the contract: while open, the
    /// webhook's due rows wait without spending retries, and the next real
    /// delivery probes it (see [`websub_delivery::health`]). Only with
    /// [`super::Dispatcher::with_operations`], whose log keeps the health.
    pub breaker_open_after: u32,
    /// When a webhook's breaker closes again, re-open its rows that ran out
    /// of retries while it was failing (their retry count reset), as the
    /// hub's own attempt history tells them apart (false, the default).
    /// Beyond the contract; needs `breaker_open_after`.
    pub resend_exhausted: bool,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            tables: OutboxTables::default(),
            channel: None,
            subscriber_name: None,
            start_from: None,
            poll_interval: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            listener_max_retries: 10,
            listener_max_backoff: Duration::from_secs(30),
            listener_ping_interval: Duration::from_secs(30),
            delivery_timeout: Duration::from_secs(10),
            visibility_timeout: Duration::from_secs(60),
            signing_secret: None,
            previous_signing_secret: None,
            signature_scheme: WebhookSignature::Messaging,
            webhook_headers: Vec::new(),
            network: NetPolicy::default(),
            trust: Trust::system(),
            retention: None,
            retention_interval: Duration::from_secs(3600),
            batch_size: 100,
            concurrency: 64,
            per_subscriber: 16,
            per_subscriber_min: 1,
            expand_lookback: Duration::from_secs(60),
            query_timeout: Duration::from_secs(60),
            catch_up_interval: Duration::from_secs(300),
            breaker_open_after: 0,
            resend_exhausted: false,
        }
    }
}

impl DispatcherConfig {
    /// The channel listened on.
    pub fn channel(&self) -> String {
        self.channel
            .clone()
            .unwrap_or_else(|| self.tables.default_channel())
    }

    /// Checks every setting; the first bad one is named in the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("poll-interval", self.poll_interval),
            ("delivery-timeout", self.delivery_timeout),
            ("listener-ping-interval", self.listener_ping_interval),
            // Zero would reconnect to a database that is down in a tight
            // loop.
            ("listener-max-backoff", self.listener_max_backoff),
            ("retention-interval", self.retention_interval),
            ("catch-up-interval", self.catch_up_interval),
            ("query-timeout", self.query_timeout),
        ];
        for (setting, value) in positive {
            if value.is_zero() {
                return Err(invalid(setting, "0s", "must be more than zero"));
            }
        }
        if self.visibility_timeout <= self.delivery_timeout {
            return Err(invalid(
                "visibility-timeout",
                format!("{:?}", self.visibility_timeout),
                format!(
                    "must exceed the delivery timeout ({:?}), or claims of attempts still \
                     running would be taken over",
                    self.delivery_timeout
                ),
            ));
        }
        for (setting, value) in [
            ("batch-size", self.batch_size),
            ("concurrency", self.concurrency),
            ("per-subscriber", self.per_subscriber),
        ] {
            if value == 0 {
                return Err(invalid(setting, 0, "must be at least 1"));
            }
        }
        if self.per_subscriber_min == 0 || self.per_subscriber_min > self.per_subscriber {
            return Err(invalid(
                "per-subscriber-min",
                self.per_subscriber_min,
                format!(
                    "must be at least 1 and at most the per-subscriber limit ({})",
                    self.per_subscriber
                ),
            ));
        }
        if let Some(channel) = &self.channel {
            check_channel(channel)
                .map_err(|error| invalid("notify-channel", channel, error.to_string()))?;
        }
        if let Some(name) = &self.subscriber_name
            && name.is_empty()
        {
            return Err(invalid("subscriber-name", "", "must not be empty"));
        }
        if let Some(secret) = &self.signing_secret
            && secret.is_empty()
        {
            return Err(invalid(
                "signing-secret",
                "",
                "must not be empty (leave it unset to send unsigned webhooks)",
            ));
        }
        if self.signature_scheme == WebhookSignature::StandardWebhooks {
            match &self.signing_secret {
                None => {
                    return Err(invalid(
                        "signature-scheme",
                        "standard-webhooks",
                        "needs a signing-secret (whsec_…)",
                    ));
                }
                Some(secret) => {
                    // The value is not echoed: it is a secret.
                    standard_key(secret)
                        .map_err(|reason| invalid("signing-secret", "<redacted>", reason))?;
                }
            }
        }
        if let Some(previous) = &self.previous_signing_secret {
            if self.signing_secret.is_none() || previous.is_empty() {
                return Err(invalid(
                    "previous-signing-secret",
                    "<redacted>",
                    "needs a signing-secret to replace it, and must not be empty",
                ));
            }
            if self.signature_scheme == WebhookSignature::StandardWebhooks {
                standard_key(previous)
                    .map_err(|reason| invalid("previous-signing-secret", "<redacted>", reason))?;
            }
        }
        if self.resend_exhausted && self.breaker_open_after == 0 {
            return Err(invalid(
                "resend-exhausted",
                true,
                "needs a breaker (breaker-open-after): the rows to send again are those that \
                 ran out of retries while it was open",
            ));
        }
        static_headers(&self.webhook_headers)?;
        Ok(())
    }
}

impl DispatcherConfig {
    /// The header scheme webhooks are signed under, the key they are
    /// signed with (none without a secret) and the key it replaces (none
    /// outside a rotation), worked out once: a Standard Webhooks secret is
    /// decoded here rather than for every POST.
    /// [`DispatcherConfig::validate`] has checked that it decodes.
    pub(super) fn signing(&self) -> (&'static SignatureScheme, Option<Vec<u8>>, Option<Vec<u8>>) {
        let scheme = match self.signature_scheme {
            WebhookSignature::Messaging => &MESSAGING_SCHEME,
            WebhookSignature::StandardWebhooks => &STANDARD_WEBHOOKS_SCHEME,
        };
        let key = |secret: &str| match self.signature_scheme {
            WebhookSignature::Messaging => Some(secret.as_bytes().to_vec()),
            WebhookSignature::StandardWebhooks => standard_key(secret).ok(),
        };
        (
            scheme,
            self.signing_secret.as_deref().and_then(key),
            self.previous_signing_secret.as_deref().and_then(key),
        )
    }
}

/// How an outbox feed signs its webhooks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WebhookSignature {
    /// The messaging contract's signature and event-id headers.
    #[default]
    Messaging,
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp` and
    /// `webhook-signature` over all three.
    StandardWebhooks,
}

impl std::str::FromStr for WebhookSignature {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "messaging" => Ok(Self::Messaging),
            "standard-webhooks" => Ok(Self::StandardWebhooks),
            _ => Err("must be messaging or standard-webhooks".to_owned()),
        }
    }
}

/// The configured webhook headers, checked: valid names and values, and none
/// of the headers the contract itself sets.
pub(super) fn static_headers(
    headers: &[(String, String)],
) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
    let mut checked = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid("webhook-header", name, "not a valid header name"))?;
        let reserved = [
            http::header::CONTENT_TYPE.as_str(),
            MESSAGING_SIGNATURE_HEADER,
            MESSAGING_EVENT_ID_HEADER,
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
        ];
        if reserved
            .iter()
            .any(|reserved| reserved.eq_ignore_ascii_case(name))
        {
            return Err(invalid(
                "webhook-header",
                name,
                "set by the dispatcher itself",
            ));
        }
        // The value is not echoed: headers like this often carry keys.
        let value = HeaderValue::from_str(value).map_err(|_| {
            invalid(
                "webhook-header",
                name,
                "the value is not a valid header value",
            )
        })?;
        checked.push((header, value));
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_contract_and_validate() {
        let config = DispatcherConfig::default();
        assert_eq!(config.retry, RetryPolicy::default());
        assert_eq!(config.listener_max_retries, 10);
        assert_eq!(config.listener_max_backoff, Duration::from_secs(30));
        assert_eq!(config.channel(), "outbox_events");
        config.validate().expect("the defaults are valid");
    }

    #[test]
    fn validation_names_the_bad_setting() {
        let config = DispatcherConfig {
            visibility_timeout: Duration::from_secs(5),
            ..DispatcherConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Invalid {
                setting: "visibility-timeout",
                ..
            })
        ));
        for header in [
            "Content-Type",
            "x-bootstrapify-messaging-signature",
            "bad header",
        ] {
            let config = DispatcherConfig {
                webhook_headers: vec![(header.to_owned(), "v".to_owned())],
                ..DispatcherConfig::default()
            };
            assert!(
                matches!(
                    config.validate(),
                    Err(ConfigError::Invalid {
                        setting: "webhook-header",
                        ..
                    })
                ),
                "{header}"
            );
        }
        let config = DispatcherConfig {
            webhook_headers: vec![("X-Key".to_owned(), "line\nbreak-secret".to_owned())],
            ..DispatcherConfig::default()
        };
        let error = config.validate().expect_err("a bad value");
        assert!(!error.to_string().contains("secret"), "{error}");
        for least in [0, 17] {
            let config = DispatcherConfig {
                per_subscriber_min: least,
                ..DispatcherConfig::default()
            };
            assert!(
                matches!(
                    config.validate(),
                    Err(ConfigError::Invalid {
                        setting: "per-subscriber-min",
                        ..
                    })
                ),
                "{least}"
            );
        }
    }
}
