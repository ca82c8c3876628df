//! One delivery attempt on the wire, for every channel that POSTs: the
//! request (body, content type, the channel's event-id and signature
//! headers), the POST under its timeout, the bounded drain of the answer,
//! and the classification of what came back, with one format for every
//! error text a delivery records.

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body_util::{BodyExt as _, Full};
use tokio::time::Instant;

use opentelemetry::trace::SpanContext;

use crate::direct::{BoxError, DirectClient};
use crate::traces::AttemptSpan;
use websub_protocol::signature::{sign, sign_standard};

/// How much of an answer's body an attempt keeps.
pub const RESPONSE_EXCERPT_BYTES: usize = 1024;

/// One attempt of a delivery, as its history keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// When it started.
    pub at: DateTime<Utc>,
    /// How long it took, in microseconds.
    pub duration_micros: i64,
    /// The answer's status, when one came.
    pub status: Option<u16>,
    /// Why it failed, as the delivery records it; none when delivered.
    pub error: Option<String>,
    /// The first [`RESPONSE_EXCERPT_BYTES`] of the answer's body.
    pub response: Bytes,
}

/// How much of an answer is read so its connection can be reused; a longer
/// one is abandoned with its connection (the content means nothing here).
const DRAINED_AT_MOST: usize = 64 * 1024;

/// The headers a channel names its event and its signature with, and what
/// the signature covers.
#[derive(Debug)]
pub struct SignatureScheme {
    /// Carries the event id receivers de-duplicate on.
    pub event_id: HeaderName,
    /// Carries the signature when there is a secret.
    pub signature: HeaderName,
    /// Carries the time of sending, when the signature covers it.
    pub timestamp: Option<HeaderName>,
}

/// WebSub's: `X-WebSub-Event-ID` and `X-Hub-Signature`.
pub static WEBSUB_SCHEME: SignatureScheme = SignatureScheme {
    event_id: HeaderName::from_static("x-websub-event-id"),
    signature: HeaderName::from_static("x-hub-signature"),
    timestamp: None,
};

/// The messaging contract's, for outbox webhooks.
pub static MESSAGING_SCHEME: SignatureScheme = SignatureScheme {
    event_id: HeaderName::from_static("x-bootstrapify-messaging-event-id"),
    signature: HeaderName::from_static("x-bootstrapify-messaging-signature"),
    timestamp: None,
};

/// Standard Webhooks': `webhook-id`, `webhook-timestamp` (Unix seconds) and
/// `webhook-signature: v1,<base64 HMAC over id.timestamp.body>`, which an
/// outbox feed may choose so that receivers can use the published
/// `standardwebhooks` libraries and refuse replays by their age.
pub static STANDARD_WEBHOOKS_SCHEME: SignatureScheme = SignatureScheme {
    event_id: HeaderName::from_static("webhook-id"),
    signature: HeaderName::from_static("webhook-signature"),
    timestamp: Some(HeaderName::from_static("webhook-timestamp")),
};

/// What one attempt sends.
#[derive(Debug)]
pub struct Request<'a> {
    /// Where: the exact URL, query string kept.
    pub url: &'a str,
    /// The channel's header names.
    pub scheme: &'static SignatureScheme,
    /// The body's Content-Type, exactly.
    pub content_type: HeaderValue,
    /// The event id.
    pub event_id: HeaderValue,
    /// The body, byte for byte.
    pub body: Bytes,
    /// Signs the body when present.
    pub secret: Option<&'a [u8]>,
    /// The secret `secret` replaces, during a rotation: where the scheme
    /// carries several signatures (Standard Webhooks), one with each.
    pub previous_secret: Option<&'a [u8]>,
    /// Headers of the channel or the operator besides those above (WebSub's
    /// `Link`, a webhook's configured headers).
    pub headers: &'a [(HeaderName, HeaderValue)],
    /// The span this attempt's continues (its event's intake), when tracing
    /// is on.
    pub parent: Option<SpanContext>,
    /// The failed attempts before this one.
    pub resend_count: u32,
}

/// What the target's answer means, before the retry policy has its say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A 2xx.
    Delivered,
    /// A 410: for WebSub, the subscriber wants no more.
    Gone,
    /// Anything else, with the text recorded as the delivery's last error.
    Failed(String),
    /// The hub itself lacked a resource to make the attempt (a file
    /// descriptor, memory, a client): no fault of the target's, so it is
    /// tried again soon and not counted against its retries.
    Local(String),
}

impl From<Result<(), String>> for Answer {
    fn from(result: Result<(), String>) -> Self {
        match result {
            Ok(()) => Self::Delivered,
            Err(error) => Self::Failed(error),
        }
    }
}

/// What came back from one POST: its meaning, and what the delivery's
/// history keeps of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempted {
    /// What it means.
    pub answer: Answer,
    /// The status, when an answer came.
    pub status: Option<u16>,
    /// The first [`RESPONSE_EXCERPT_BYTES`] of its body.
    pub response: Bytes,
    /// How long a `429` or `503` asked the hub to wait (`Retry-After`, in
    /// seconds or as a date), at most [`MAX_RETRY_AFTER`].
    pub retry_after: Option<Duration>,
}

/// The longest `Retry-After` honoured: a receiver cannot park its
/// deliveries for longer than this per answer.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

impl Attempted {
    /// An attempt that ended without an answer.
    fn unanswered(error: String) -> Self {
        Self {
            answer: Answer::Failed(error),
            status: None,
            response: Bytes::new(),
            retry_after: None,
        }
    }
}

/// What carries an attempt: the deliveries' own client (WebSub callbacks),
/// or a reqwest client (outbox and operator webhooks, whose clients an
/// embedding application may give).
#[derive(Debug, Clone, Copy)]
pub enum Carrier<'a> {
    /// hyper's client, without reqwest's layers.
    Direct(&'a DirectClient),
    /// A reqwest client.
    Reqwest(&'a reqwest::Client),
}

/// Why an exchange brought no answer.
enum Unanswered {
    TimedOut,
    Failed(BoxError),
}

/// POSTs `request` with `timeout` for the whole exchange, connection and
/// answer included, and gives up at `deadline` if that comes first (a claim
/// that would otherwise go stale while the attempt runs).
pub async fn post(
    carrier: Carrier<'_>,
    request: Request<'_>,
    timeout: Duration,
    deadline: Option<Instant>,
) -> Attempted {
    let url = request.url;
    let body = request.body.clone();
    let span = AttemptSpan::start(
        request.parent.as_ref(),
        url,
        request.resend_count,
        &request.event_id,
    );
    let mut headers = match headers_of(request) {
        Ok(headers) => headers,
        Err(error) => return Attempted::unanswered(format!("request failed: {error}")),
    };
    let Some(span) = span else {
        return exchanged(carrier, url, headers, body, timeout, deadline).await;
    };
    span.inject(&mut headers);
    let attempted = exchanged(carrier, url, headers, body, timeout, deadline).await;
    let error = match &attempted.answer {
        Answer::Delivered => None,
        Answer::Gone => Some("410 Gone"),
        Answer::Failed(error) | Answer::Local(error) => Some(error.as_str()),
    };
    span.end(attempted.status, error);
    attempted
}

/// The exchange of [`post`], its answer classified.
async fn exchanged(
    carrier: Carrier<'_>,
    url: &str,
    headers: HeaderMap,
    body: Bytes,
    timeout: Duration,
    deadline: Option<Instant>,
) -> Attempted {
    let exchange = tokio::time::timeout(timeout, exchange(carrier, url, headers, body));
    let answered = match deadline {
        None => exchange.await,
        Some(deadline) => match tokio::time::timeout_at(deadline, exchange).await {
            Ok(answered) => answered,
            Err(_) => {
                return Attempted::unanswered(
                    "no answer before the claim would have gone stale".into(),
                );
            }
        },
    };
    match answered.unwrap_or(Err(Unanswered::TimedOut)) {
        Ok((status, response, retry_after)) => Attempted {
            answer: classify(status),
            status: Some(status.as_u16()),
            response,
            retry_after,
        },
        Err(Unanswered::TimedOut) => Attempted::unanswered("timed out".to_owned()),
        Err(Unanswered::Failed(error)) if lacks_local_resource(error.as_ref()) => Attempted {
            answer: Answer::Local(format!(
                "the hub lacked a resource: {}",
                error_chain(error.as_ref())
            )),
            status: None,
            response: Bytes::new(),
            retry_after: None,
        },
        Err(Unanswered::Failed(error)) => {
            Attempted::unanswered(format!("request failed: {}", error_chain(error.as_ref())))
        }
    }
}

/// The headers of `request`: its content type, the channel's and the
/// operator's, the event id, and the signature when there is a secret.
fn headers_of(request: Request<'_>) -> Result<HeaderMap, http::header::InvalidHeaderValue> {
    let mut headers = HeaderMap::with_capacity(request.headers.len() + 4);
    headers.insert(http::header::CONTENT_TYPE, request.content_type);
    for (name, value) in request.headers {
        headers.append(name.clone(), value.clone());
    }
    if let Some(secret) = request.secret {
        let signature = match &request.scheme.timestamp {
            None => sign(secret, &request.body),
            Some(header) => {
                let now = chrono::Utc::now().timestamp();
                headers.insert(header.clone(), HeaderValue::from(now));
                let id = String::from_utf8_lossy(request.event_id.as_bytes());
                let signature = sign_standard(secret, &id, now, &request.body);
                match request.previous_secret {
                    None => signature,
                    Some(previous) => format!(
                        "{signature} {}",
                        sign_standard(previous, &id, now, &request.body)
                    ),
                }
            }
        };
        headers.insert(
            request.scheme.signature.clone(),
            HeaderValue::try_from(signature)?,
        );
    }
    headers.insert(request.scheme.event_id.clone(), request.event_id);
    Ok(headers)
}

/// Sends the POST and drains its answer.
async fn exchange(
    carrier: Carrier<'_>,
    url: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Bytes, Option<Duration>), Unanswered> {
    match carrier {
        Carrier::Direct(client) => {
            let mut request = http::Request::new(Full::new(body));
            *request.method_mut() = http::Method::POST;
            *request.headers_mut() = headers;
            let response = client
                .send(url, request)
                .await
                .map_err(Unanswered::Failed)?;
            drain(response).await
        }
        Carrier::Reqwest(client) => {
            let response = client
                .post(url)
                .headers(headers)
                .body(body)
                .send()
                .await
                .map_err(|error| {
                    // The client's own timeout, when shorter than the attempt's.
                    if error.is_timeout() {
                        Unanswered::TimedOut
                    } else {
                        Unanswered::Failed(error.into())
                    }
                })?;
            drain(http::Response::from(response)).await
        }
    }
}

/// Reads a small answer so its connection goes back to the pool (an empty
/// one, a 204 say, is complete already), its beginning kept, with the wait
/// a `429` or `503` asks for.
async fn drain<B>(
    response: http::Response<B>,
) -> Result<(StatusCode, Bytes, Option<Duration>), Unanswered>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let status = response.status();
    let retry_after =
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| retry_after(value, chrono::Utc::now()))
        } else {
            None
        };
    let mut body = response.into_body();
    let mut kept = Vec::new();
    if body.size_hint().exact() != Some(0) {
        let mut read = 0;
        while read < DRAINED_AT_MOST {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(chunk) = frame.into_data() {
                        let room = RESPONSE_EXCERPT_BYTES.saturating_sub(kept.len());
                        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
                        read += chunk.len();
                    }
                }
                _ => break,
            }
        }
    }
    Ok((status, Bytes::from(kept), retry_after))
}

/// Whether `error` comes from the hub's own limits (out of descriptors,
/// system-wide or its own, or out of memory) rather than from the target.
pub fn lacks_local_resource(error: &(dyn std::error::Error + 'static)) -> bool {
    use rustix::io::Errno;
    let local = [Errno::MFILE, Errno::NFILE, Errno::NOMEM, Errno::NOBUFS];
    std::iter::successors(Some(error), |error| error.source())
        .filter_map(|error| error.downcast_ref::<std::io::Error>())
        .filter_map(std::io::Error::raw_os_error)
        .any(|code| local.iter().any(|errno| errno.raw_os_error() == code))
}

/// A `Retry-After` value (RFC 9110: seconds, or an HTTP date) as a wait
/// from `now`, at most [`MAX_RETRY_AFTER`]; `None` when unreadable.
pub fn retry_after(value: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let value = value.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
            (at.with_timezone(&chrono::Utc) - now)
                .to_std()
                .unwrap_or_default()
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// What a status means for a delivery.
pub fn classify(status: StatusCode) -> Answer {
    if status.is_success() {
        Answer::Delivered
    } else if status == StatusCode::GONE {
        Answer::Gone
    } else {
        Answer::Failed(status_error(status))
    }
}

/// The recorded text of an answer that is not a success: `HTTP 502 Bad
/// Gateway`, or the code alone when it has no reason phrase.
pub fn status_error(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    }
}

/// An error and its causes on one line, for a recorded error or a log line
/// (shared with the subscriber kit, whose reasons read the same).
pub use websub_protocol::error_chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified_and_worded_once() {
        assert_eq!(classify(StatusCode::NO_CONTENT), Answer::Delivered);
        assert_eq!(classify(StatusCode::GONE), Answer::Gone);
        assert_eq!(
            classify(StatusCode::BAD_GATEWAY),
            Answer::Failed("HTTP 502 Bad Gateway".to_owned())
        );
        assert_eq!(
            classify(StatusCode::FOUND),
            Answer::Failed("HTTP 302 Found".to_owned()),
            "a redirect is a failure, never followed"
        );
        let unknown = StatusCode::from_u16(599).expect("a status");
        assert_eq!(status_error(unknown), "HTTP 599");
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_within_bounds() {
        let now = chrono::DateTime::parse_from_rfc3339("2015-10-21T07:28:00Z")
            .expect("a time")
            .with_timezone(&chrono::Utc);
        assert_eq!(retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO),
            "a date past is no wait"
        );
        assert_eq!(retry_after("86400", now), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after("soon", now), None);
    }

    #[test]
    fn the_schemes_name_the_contract_headers() {
        assert!(
            WEBSUB_SCHEME
                .signature
                .as_str()
                .eq_ignore_ascii_case(websub_protocol::signature::HUB_SIGNATURE_HEADER)
        );
        assert!(
            WEBSUB_SCHEME
                .event_id
                .as_str()
                .eq_ignore_ascii_case(websub_protocol::signature::EVENT_ID_HEADER)
        );
        assert!(
            MESSAGING_SCHEME
                .signature
                .as_str()
                .eq_ignore_ascii_case(websub_protocol::signature::MESSAGING_SIGNATURE_HEADER)
        );
        assert!(
            MESSAGING_SCHEME
                .event_id
                .as_str()
                .eq_ignore_ascii_case(websub_protocol::signature::MESSAGING_EVENT_ID_HEADER)
        );
    }
}
