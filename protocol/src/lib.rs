//! WebSub on the wire, shared by the hub and by services that only
//! subscribe or receive: parsing and validation of the hub's form POSTs
//! (WebSub subscribe and unsubscribe requests, 5.1, and publish pings),
//! and the [`signature`]s a hub sends and a receiver checks. Pure
//! functions, no I/O: the HTTP adapter hands over the body, gets a
//! [`HubRequest`] or a [`ProtocolError`] whose text is the plain-text
//! reason a client reads.

use std::borrow::Cow;
use std::fmt;

use url::Url;

pub mod signature;

/// An error and its causes on one line, `outer: inner: innermost`, as the
/// hub records a failure and a subscriber reports one.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

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
mod tests;
