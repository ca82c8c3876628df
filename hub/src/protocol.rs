//! Parsing and validation of the hub's form POSTs: WebSub subscribe and
//! unsubscribe requests (WebSub 5.1) and publish pings. Pure functions, no
//! I/O: the HTTP adapter hands over the body, gets a [`HubRequest`] or a
//! [`ProtocolError`] whose text is the plain-text reason a client reads.

use std::borrow::Cow;
use std::fmt;

use url::Url;

/// What a subscription request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `hub.mode=subscribe`.
    Subscribe,
    /// `hub.mode=unsubscribe`.
    Unsubscribe,
}

impl Mode {
    /// The literal `hub.mode` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Subscribe => "subscribe",
            Self::Unsubscribe => "unsubscribe",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated subscribe or unsubscribe request.
///
/// `topic` and `callback` are kept as sent, except that percent-encoded
/// unreserved characters are decoded, which WebSub requires of hubs; the
/// store compares both byte for byte.
#[derive(Clone, PartialEq, Eq)]
pub struct SubscriptionRequest {
    /// Subscribe or unsubscribe.
    pub mode: Mode,
    /// `hub.topic`.
    pub topic: String,
    /// `hub.callback`, its own query string included.
    pub callback: String,
    /// `hub.lease_seconds` as asked; always `None` for unsubscribe, where
    /// WebSub says it must be ignored.
    pub lease_seconds: Option<u64>,
    /// `hub.secret`; `None` when absent or empty (an empty key authenticates
    /// nothing), and always `None` for unsubscribe.
    pub secret: Option<String>,
    /// The subscriber the subscription counts against. Filled in by
    /// authentication, never from the form.
    pub owner: Option<String>,
}

// The secret must not reach logs through `{:?}`.
impl fmt::Debug for SubscriptionRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubscriptionRequest")
            .field("mode", &self.mode)
            .field("topic", &self.topic)
            .field("callback", &self.callback)
            .field("lease_seconds", &self.lease_seconds)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("owner", &self.owner)
            .finish()
    }
}

/// A validated publish ping: the topics that changed, each once, in the
/// order first given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishRequest {
    /// Every `hub.url` and `hub.topic` value.
    pub topics: Vec<String>,
}

/// Any request the hub URL accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubRequest {
    /// `hub.mode=subscribe` or `hub.mode=unsubscribe`.
    Subscription(SubscriptionRequest),
    /// `hub.mode=publish`.
    Publish(PublishRequest),
}

/// Why a form was refused. Every variant is a client error (400); the
/// `Display` text is the plain-text body the client gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The body is not `application/x-www-form-urlencoded` UTF-8.
    #[error("the request body is not a UTF-8 application/x-www-form-urlencoded form")]
    Malformed,
    /// A required parameter is absent or empty.
    #[error("missing parameter {name}")]
    MissingParameter {
        /// The parameter, e.g. `hub.callback`.
        name: &'static str,
    },
    /// `hub.mode` is none of subscribe, unsubscribe, publish.
    #[error("unknown hub.mode {mode:?}: expected subscribe, unsubscribe or publish")]
    UnknownMode {
        /// The mode given (shortened if long).
        mode: String,
    },
    /// A topic or callback that is not an absolute http(s) URL.
    #[error("{name} must be an absolute http or https URL: {reason}")]
    InvalidUrl {
        /// The parameter, e.g. `hub.topic`.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// `hub.secret` of 200 bytes or more.
    #[error("hub.secret must be shorter than 200 bytes; it is {length} bytes")]
    SecretTooLong {
        /// The secret's length in bytes.
        length: usize,
    },
    /// `hub.lease_seconds` that is not a positive decimal integer.
    #[error("hub.lease_seconds must be a positive integer, not {value:?}")]
    InvalidLeaseSeconds {
        /// The value given (shortened if long).
        value: String,
    },
    /// A parameter given more than once where only one is allowed.
    #[error("parameter {name} must be given at most once")]
    Duplicate {
        /// The parameter.
        name: &'static str,
    },
}

impl ProtocolError {
    /// The HTTP status to answer with: always 400 Bad Request.
    pub fn status(&self) -> http::StatusCode {
        http::StatusCode::BAD_REQUEST
    }
}

/// WebSub 5.1: a secret "MUST be less than 200 bytes in length".
pub const MAX_SECRET_BYTES: usize = 199;

const MODE: &str = "hub.mode";
const TOPIC: &str = "hub.topic";
const CALLBACK: &str = "hub.callback";
const LEASE_SECONDS: &str = "hub.lease_seconds";
const SECRET: &str = "hub.secret";
const URL: &str = "hub.url";

/// Parses and validates a form-encoded body sent to the hub URL.
///
/// Parameters the hub does not understand (`hub.verify`,
/// `hub.verify_token`, …) are ignored, as WebSub requires.
pub fn parse_form(body: &[u8]) -> Result<HubRequest, ProtocolError> {
    // The form decoder replaces invalid UTF-8 silently, which would alter a
    // URL without anyone noticing; refuse such a body instead.
    if !percent_decodes_to_utf8(body) {
        return Err(ProtocolError::Malformed);
    }
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_bytes(body).map_err(|_| ProtocolError::Malformed)?;
    let form = Form(&pairs);
    let mode = form.required(MODE)?;
    match mode {
        "subscribe" => parse_subscription(&form, Mode::Subscribe),
        "unsubscribe" => parse_subscription(&form, Mode::Unsubscribe),
        "publish" => parse_publish(&form),
        other => Err(ProtocolError::UnknownMode {
            mode: excerpt(other),
        }),
    }
}

/// Validates one topic given outside a form (e.g. a fat ping's query
/// string) by the same rules as `hub.topic`, and returns it as the hub keys
/// it: percent-encoded unreserved characters decoded.
pub fn parse_topic(topic: &str) -> Result<String, ProtocolError> {
    if topic.is_empty() {
        return Err(ProtocolError::MissingParameter { name: TOPIC });
    }
    http_url(TOPIC, topic)
}

fn parse_subscription(form: &Form<'_>, mode: Mode) -> Result<HubRequest, ProtocolError> {
    let topic = http_url(TOPIC, form.required(TOPIC)?)?;
    let callback = http_url(CALLBACK, form.required(CALLBACK)?)?;
    let (lease_seconds, secret) = match mode {
        Mode::Subscribe => (
            form.single(LEASE_SECONDS)?
                .filter(|value| !value.is_empty())
                .map(lease_seconds)
                .transpose()?,
            form.single(SECRET)?
                .filter(|value| !value.is_empty())
                .map(secret)
                .transpose()?,
        ),
        Mode::Unsubscribe => (None, None),
    };
    Ok(HubRequest::Subscription(SubscriptionRequest {
        mode,
        topic,
        callback,
        lease_seconds,
        secret,
        owner: None,
    }))
}

fn parse_publish(form: &Form<'_>) -> Result<HubRequest, ProtocolError> {
    let mut topics: Vec<String> = Vec::new();
    for (name, value) in form.0 {
        let name = match name.as_str() {
            URL => URL,
            TOPIC => TOPIC,
            _ => continue,
        };
        if value.is_empty() {
            continue;
        }
        let topic = http_url(name, value)?;
        if !topics.contains(&topic) {
            topics.push(topic);
        }
    }
    if topics.is_empty() {
        return Err(ProtocolError::MissingParameter {
            name: "hub.url or hub.topic",
        });
    }
    Ok(HubRequest::Publish(PublishRequest { topics }))
}

/// The decoded pairs, in order, repeated keys included.
struct Form<'a>(&'a [(String, String)]);

impl<'a> Form<'a> {
    /// The one value of `name`, if given; two or more is an error.
    fn single(&self, name: &'static str) -> Result<Option<&'a str>, ProtocolError> {
        let mut values = self
            .0
            .iter()
            .filter(|(key, _)| key == name)
            .map(|(_, value)| value.as_str());
        let first = values.next();
        if values.next().is_some() {
            return Err(ProtocolError::Duplicate { name });
        }
        Ok(first)
    }

    /// The one non-empty value of `name`.
    fn required(&self, name: &'static str) -> Result<&'a str, ProtocolError> {
        self.single(name)?
            .filter(|value| !value.is_empty())
            .ok_or(ProtocolError::MissingParameter { name })
    }
}

/// Validates an absolute http(s) URL and returns it as sent, with only the
/// percent-encoded unreserved characters decoded.
fn http_url(name: &'static str, value: &str) -> Result<String, ProtocolError> {
    let invalid = |reason: String| ProtocolError::InvalidUrl { name, reason };
    let url = Url::parse(value).map_err(|error| invalid(error.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "the scheme is {:?}",
            excerpt(url.scheme())
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("it has no host".to_owned()));
    }
    Ok(decode_unreserved(value).into_owned())
}

/// Decodes `%XX` escapes of RFC 3986 unreserved characters
/// (`A-Z a-z 0-9 - . _ ~`), which WebSub requires of hubs for topic and
/// callback URLs ("Hubs MUST always decode non-reserved characters").
/// Every other escape is left exactly as written, hex case included.
fn decode_unreserved(url: &str) -> Cow<'_, str> {
    if !url.contains('%') {
        return Cow::Borrowed(url);
    }
    let bytes = url.as_bytes();
    let mut decoded = String::with_capacity(url.len());
    let mut copied_up_to = 0;
    let mut index = 0;
    while index < bytes.len() {
        if let Some(byte) = escaped_byte(bytes, index)
            && is_unreserved(byte)
        {
            decoded.push_str(&url[copied_up_to..index]);
            decoded.push(char::from(byte));
            index += 3;
            copied_up_to = index;
        } else {
            index += 1;
        }
    }
    decoded.push_str(&url[copied_up_to..]);
    Cow::Owned(decoded)
}

/// `url` as a URI (RFC 3986), for where only one may go, such as a `Link`
/// header's `<…>` (RFC 8288): every byte of a non-ASCII character, and every
/// ASCII character a URI cannot hold (controls, space, `"`, `<`, `>`, `\`,
/// `^`, `` ` ``, `{`, `|`, `}`, DEL, and a `%` that starts no escape), is
/// written as a `%XX` escape of its UTF-8 bytes (RFC 3987's mapping of an
/// IRI to a URI). Everything else, escapes already there included, stays as
/// written, so a URL that is a URI already comes back unchanged. Topics and
/// callbacks themselves stay as given; this is only how they are spelled
/// where the syntax demands it.
pub fn iri_to_uri(url: &str) -> Cow<'_, str> {
    let bytes = url.as_bytes();
    let allowed = |index: usize| match bytes[index] {
        b'%' => escaped_byte(bytes, index).is_some(),
        byte => is_unreserved(byte) || b":/?#[]@!$&'()*+,;=".contains(&byte),
    };
    if (0..bytes.len()).all(allowed) {
        return Cow::Borrowed(url);
    }
    let mut uri = String::with_capacity(url.len() + url.len() / 2);
    for (index, &byte) in bytes.iter().enumerate() {
        if allowed(index) {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    Cow::Owned(uri)
}

fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// The byte a well-formed `%XX` escape at `index` stands for.
fn escaped_byte(bytes: &[u8], index: usize) -> Option<u8> {
    match bytes.get(index..index + 3)? {
        [b'%', high, low] => Some(hex_value(*high)? << 4 | hex_value(*low)?),
        _ => None,
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|value| u8::try_from(value).ok())
}

/// Whether the body, once `%XX` escapes are decoded, is UTF-8 as WebSub
/// requires. Splitting at `&` and `=` (ASCII) cannot break a valid sequence,
/// so checking the whole body checks every name and value.
fn percent_decodes_to_utf8(body: &[u8]) -> bool {
    let mut decoded = Vec::with_capacity(body.len());
    let mut index = 0;
    while let Some(&byte) = body.get(index) {
        if let Some(escaped) = escaped_byte(body, index) {
            decoded.push(escaped);
            index += 3;
        } else {
            decoded.push(byte);
            index += 1;
        }
    }
    std::str::from_utf8(&decoded).is_ok()
}

fn lease_seconds(value: &str) -> Result<u64, ProtocolError> {
    let invalid = || ProtocolError::InvalidLeaseSeconds {
        value: excerpt(value),
    };
    if !value.bytes().all(|byte| byte.is_ascii_digit()) || value.bytes().all(|byte| byte == b'0') {
        return Err(invalid());
    }
    // A positive integer beyond u64 is still a valid request; the lease
    // policy clamps it to its maximum anyway.
    Ok(value.parse().unwrap_or(u64::MAX))
}

fn secret(value: &str) -> Result<String, ProtocolError> {
    if value.len() > MAX_SECRET_BYTES {
        return Err(ProtocolError::SecretTooLong {
            length: value.len(),
        });
    }
    Ok(value.to_owned())
}

/// A client-supplied value echoed in an error, cut short so a 64 KiB
/// parameter does not come back in full.
fn excerpt(value: &str) -> String {
    const LIMIT: usize = 64;
    match value.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPIC_URL: &str = "https://publisher.example/feed";
    const CALLBACK_URL: &str = "https://subscriber.example/cb?id=7";

    fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
        serde_urlencoded::to_string(pairs)
            .unwrap_or_else(|error| panic!("encode: {error}"))
            .into_bytes()
    }

    fn subscription(body: &[u8]) -> SubscriptionRequest {
        match parse_form(body) {
            Ok(HubRequest::Subscription(request)) => request,
            other => panic!("expected a subscription, got {other:?}"),
        }
    }

    fn publish(body: &[u8]) -> PublishRequest {
        match parse_form(body) {
            Ok(HubRequest::Publish(request)) => request,
            other => panic!("expected a publish, got {other:?}"),
        }
    }

    fn subscribe_with(extra: &[(&str, &str)]) -> Vec<u8> {
        let mut pairs = vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", TOPIC_URL),
            ("hub.callback", CALLBACK_URL),
        ];
        pairs.extend_from_slice(extra);
        form(&pairs)
    }

    #[test]
    fn iris_are_spelled_as_uris_and_uris_stay_as_written() {
        assert_eq!(
            iri_to_uri("http://127.0.0.1:8080/flux/caf\u{e9}?q=\u{2713}"),
            "http://127.0.0.1:8080/flux/caf%C3%A9?q=%E2%9C%93"
        );
        for uri in [
            TOPIC_URL,
            "https://pub.example/a%2Fb/caf%c3%a9?x=%20&y=[1]#top",
            "https://pub.example/!$&'()*+,;=:@~-._",
        ] {
            assert!(matches!(iri_to_uri(uri), Cow::Borrowed(same) if same == uri));
        }
        assert_eq!(
            iri_to_uri("https://pub.example/a b<c>\"d\"{|}\\^`\u{7f}\t%zz%4"),
            "https://pub.example/a%20b%3Cc%3E%22d%22%7B%7C%7D%5C%5E%60%7F%09%25zz%254"
        );
    }

    #[test]
    fn subscribe_with_every_parameter() {
        let request = subscription(&subscribe_with(&[
            ("hub.lease_seconds", "3600"),
            ("hub.secret", "s3cr3t"),
        ]));
        assert_eq!(
            request,
            SubscriptionRequest {
                mode: Mode::Subscribe,
                topic: TOPIC_URL.to_owned(),
                callback: CALLBACK_URL.to_owned(),
                lease_seconds: Some(3600),
                secret: Some("s3cr3t".to_owned()),
                owner: None,
            }
        );
    }

    #[test]
    fn subscribe_with_only_the_required_parameters() {
        let request = subscription(&subscribe_with(&[]));
        assert_eq!(request.lease_seconds, None);
        assert_eq!(request.secret, None);
        assert_eq!(request.owner, None);
    }

    #[test]
    fn unsubscribe_ignores_lease_and_secret_even_when_invalid() {
        let body = form(&[
            ("hub.mode", "unsubscribe"),
            ("hub.topic", TOPIC_URL),
            ("hub.callback", CALLBACK_URL),
            ("hub.lease_seconds", "-5"),
            ("hub.lease_seconds", "abc"),
            ("hub.secret", &"x".repeat(300)),
        ]);
        let request = subscription(&body);
        assert_eq!(request.mode, Mode::Unsubscribe);
        assert_eq!(request.lease_seconds, None);
        assert_eq!(request.secret, None);
    }

    #[test]
    fn unknown_parameters_are_ignored() {
        let request = subscription(&subscribe_with(&[
            ("hub.verify", "async"),
            ("hub.verify", "sync"),
            ("hub.verify_token", "tok"),
            ("other", "1"),
        ]));
        assert_eq!(request.topic, TOPIC_URL);
    }

    #[test]
    fn owner_never_comes_from_the_form() {
        let request = subscription(&subscribe_with(&[("owner", "mallory"), ("hub.owner", "m")]));
        assert_eq!(request.owner, None);
    }

    #[test]
    fn missing_parameters_are_named() {
        let cases: [(&[(&str, &str)], &str); 5] = [
            (
                &[("hub.topic", TOPIC_URL), ("hub.callback", CALLBACK_URL)],
                "hub.mode",
            ),
            (
                &[("hub.mode", "subscribe"), ("hub.callback", CALLBACK_URL)],
                "hub.topic",
            ),
            (
                &[("hub.mode", "subscribe"), ("hub.topic", TOPIC_URL)],
                "hub.callback",
            ),
            (
                &[
                    ("hub.mode", "subscribe"),
                    ("hub.topic", ""),
                    ("hub.callback", CALLBACK_URL),
                ],
                "hub.topic",
            ),
            (&[("hub.mode", "")], "hub.mode"),
        ];
        for (pairs, missing) in cases {
            assert_eq!(
                parse_form(&form(pairs)),
                Err(ProtocolError::MissingParameter { name: missing }),
                "{pairs:?}"
            );
        }
        assert_eq!(
            parse_form(b""),
            Err(ProtocolError::MissingParameter { name: "hub.mode" })
        );
    }

    #[test]
    fn unknown_mode_is_named() {
        let body = form(&[("hub.mode", "Subscribe"), ("hub.topic", TOPIC_URL)]);
        assert_eq!(
            parse_form(&body),
            Err(ProtocolError::UnknownMode {
                mode: "Subscribe".to_owned()
            })
        );
    }

    #[test]
    fn long_values_are_shortened_in_errors() {
        let mode = "m".repeat(10_000);
        let Err(ProtocolError::UnknownMode { mode: echoed }) =
            parse_form(&form(&[("hub.mode", &mode)]))
        else {
            panic!("expected UnknownMode");
        };
        assert!(echoed.len() < 100, "{} bytes echoed", echoed.len());
    }

    #[test]
    fn topic_and_callback_must_be_absolute_http_urls() {
        for bad in [
            "/relative",
            "ftp://example.com/x",
            "mailto:a@example.com",
            "not a url",
            "http://",
        ] {
            let body = form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", bad),
                ("hub.callback", CALLBACK_URL),
            ]);
            assert!(
                matches!(
                    parse_form(&body),
                    Err(ProtocolError::InvalidUrl {
                        name: "hub.topic",
                        ..
                    })
                ),
                "topic {bad:?}"
            );
            let body = form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", TOPIC_URL),
                ("hub.callback", bad),
            ]);
            assert!(
                matches!(
                    parse_form(&body),
                    Err(ProtocolError::InvalidUrl {
                        name: "hub.callback",
                        ..
                    })
                ),
                "callback {bad:?}"
            );
        }
        let request = subscription(&form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", "http://publisher.example:8080/feed"),
            ("hub.callback", "http://[2001:db8::1]/cb"),
        ]));
        assert_eq!(request.topic, "http://publisher.example:8080/feed");
        assert_eq!(request.callback, "http://[2001:db8::1]/cb");
    }

    #[test]
    fn urls_are_kept_as_sent() {
        // No host lower-casing, no trailing slash added, reserved escapes and
        // their hex case untouched, query and its order kept.
        let topic = "HTTP://Publisher.Example/Feed%2fA%3f?b=2&a=1";
        let callback = "https://Sub.Example?z=1&z=2&%2F";
        let request = subscription(&form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", callback),
        ]));
        assert_eq!(request.topic, topic);
        assert_eq!(request.callback, callback);
    }

    #[test]
    fn percent_encoded_unreserved_characters_are_decoded() {
        let request = subscription(&form(&[
            ("hub.mode", "subscribe"),
            (
                "hub.topic",
                "https://publisher.example/%7Euser/%41%62%2D%2e%5F%30",
            ),
            ("hub.callback", "https://sub.example/cb?x=%7e%20%2F%zz%4"),
        ]));
        assert_eq!(request.topic, "https://publisher.example/~user/Ab-._0");
        assert_eq!(request.callback, "https://sub.example/cb?x=~%20%2F%zz%4");
    }

    #[test]
    fn secret_must_be_shorter_than_200_bytes() {
        let longest = "s".repeat(199);
        let request = subscription(&subscribe_with(&[("hub.secret", &longest)]));
        assert_eq!(request.secret.as_deref(), Some(longest.as_str()));

        let too_long = "s".repeat(200);
        assert_eq!(
            parse_form(&subscribe_with(&[("hub.secret", &too_long)])),
            Err(ProtocolError::SecretTooLong { length: 200 })
        );
        // Bytes, not characters: 100 two-byte characters are 200 bytes.
        let multibyte = "é".repeat(100);
        assert_eq!(
            parse_form(&subscribe_with(&[("hub.secret", &multibyte)])),
            Err(ProtocolError::SecretTooLong { length: 200 })
        );
    }

    #[test]
    fn empty_secret_means_no_secret() {
        let request = subscription(&subscribe_with(&[("hub.secret", "")]));
        assert_eq!(request.secret, None);
    }

    #[test]
    fn lease_seconds_must_be_a_positive_integer() {
        for bad in ["0", "000", "-1", "+5", "1.5", "ten", " 5", "5s", "1e3"] {
            assert!(
                matches!(
                    parse_form(&subscribe_with(&[("hub.lease_seconds", bad)])),
                    Err(ProtocolError::InvalidLeaseSeconds { .. })
                ),
                "{bad:?}"
            );
        }
        let request = subscription(&subscribe_with(&[("hub.lease_seconds", "007")]));
        assert_eq!(request.lease_seconds, Some(7));
        let request = subscription(&subscribe_with(&[(
            "hub.lease_seconds",
            "99999999999999999999999999",
        )]));
        assert_eq!(request.lease_seconds, Some(u64::MAX));
        let request = subscription(&subscribe_with(&[("hub.lease_seconds", "")]));
        assert_eq!(request.lease_seconds, None);
    }

    #[test]
    fn single_valued_parameters_given_twice_are_refused() {
        let repeated: [(&'static str, &str); 5] = [
            ("hub.mode", "subscribe"),
            ("hub.topic", TOPIC_URL),
            ("hub.callback", CALLBACK_URL),
            ("hub.lease_seconds", "60"),
            ("hub.secret", "secret"),
        ];
        for (name, value) in repeated {
            assert_eq!(
                parse_form(&subscribe_with(&[(name, value), (name, value)])),
                Err(ProtocolError::Duplicate { name }),
                "{name}"
            );
        }
    }

    #[test]
    fn body_that_is_not_utf8_is_malformed() {
        assert_eq!(
            parse_form(b"hub.mode=subscribe&hub.topic=%FF"),
            Err(ProtocolError::Malformed)
        );
        assert_eq!(parse_form(b"hub.mode=\xff"), Err(ProtocolError::Malformed));
        // A stray percent sign is not an escape and stays literal.
        let request = subscription(&subscribe_with(&[("hub.verify_token", "100%")]));
        assert_eq!(request.topic, TOPIC_URL);
    }

    #[test]
    fn publish_collects_hub_url_and_hub_topic_in_order_without_duplicates() {
        let body = form(&[
            ("hub.mode", "publish"),
            ("hub.url", "https://a.example/1"),
            ("hub.topic", "https://a.example/2"),
            ("hub.url", "https://a.example/1"),
            ("hub.url", "https://a.example/3"),
            ("hub.topic", "https://a.example/%32"),
            ("hub.callback", "ignored"),
        ]);
        assert_eq!(
            publish(&body).topics,
            [
                "https://a.example/1",
                "https://a.example/2",
                "https://a.example/3"
            ]
        );
    }

    #[test]
    fn publish_needs_a_valid_topic() {
        assert!(matches!(
            parse_form(&form(&[("hub.mode", "publish")])),
            Err(ProtocolError::MissingParameter { .. })
        ));
        assert!(matches!(
            parse_form(&form(&[("hub.mode", "publish"), ("hub.url", "")])),
            Err(ProtocolError::MissingParameter { .. })
        ));
        assert!(matches!(
            parse_form(&form(&[
                ("hub.mode", "publish"),
                ("hub.url", "https://a.example/1"),
                ("hub.topic", "file:///etc/passwd"),
            ])),
            Err(ProtocolError::InvalidUrl {
                name: "hub.topic",
                ..
            })
        ));
        assert!(matches!(
            parse_form(&form(&[("hub.mode", "publish"), ("hub.url", "nope")])),
            Err(ProtocolError::InvalidUrl {
                name: "hub.url",
                ..
            })
        ));
    }

    #[test]
    fn a_single_topic_is_validated_like_hub_topic() {
        assert_eq!(
            parse_topic("https://a.example/%7Efeed").ok().as_deref(),
            Some("https://a.example/~feed")
        );
        assert!(matches!(
            parse_topic("ftp://a.example/"),
            Err(ProtocolError::InvalidUrl {
                name: "hub.topic",
                ..
            })
        ));
        assert_eq!(
            parse_topic(""),
            Err(ProtocolError::MissingParameter { name: "hub.topic" })
        );
    }

    #[test]
    fn every_error_is_a_bad_request() {
        assert_eq!(
            ProtocolError::Malformed.status(),
            http::StatusCode::BAD_REQUEST
        );
        assert_eq!(
            ProtocolError::Duplicate { name: "hub.mode" }.status(),
            http::StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn debug_output_hides_the_secret() {
        let request = subscription(&subscribe_with(&[("hub.secret", "hunter2")]));
        assert!(!format!("{request:?}").contains("hunter2"));
    }
}
