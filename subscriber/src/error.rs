//! Why a subscriber's request to a hub, or a discovery, failed, and the
//! hub's explanation taken from its answer.

use http::StatusCode;

use websub_protocol::error_chain;

use super::intents::IntentError;

/// The most of a hub's refusal kept in an error.
const MAX_REASON_BYTES: usize = 1024;

/// Why a request to a hub (or a discovery) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The hub refused the request (4xx); `reason` is its plain-text
    /// explanation.
    #[error("the hub refused the request ({status}): {reason}")]
    Refused {
        /// The status.
        status: StatusCode,
        /// The hub's explanation.
        reason: String,
    },
    /// Any other answer that is not a success (5xx, 3xx).
    #[error("unexpected answer {status}: {reason}")]
    Unexpected {
        /// The status.
        status: StatusCode,
        /// The body, as text.
        reason: String,
    },
    /// The request could not be made or its answer read.
    #[error("request failed: {}", error_chain(.0))]
    Transport(#[source] reqwest::Error),
    /// A URL is malformed.
    #[error("invalid URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The callback cannot be recorded.
    #[error(transparent)]
    Callback(#[from] IntentError),
    /// WebSub secrets are shorter than 200 bytes.
    #[error("the secret is {bytes} bytes; WebSub allows fewer than 200")]
    SecretTooLong {
        /// Its length.
        bytes: usize,
    },
    /// A user token header name or value is not valid in HTTP.
    #[error("invalid user token header: {reason}")]
    InvalidToken {
        /// Why.
        reason: String,
    },
    /// The topic announces no hub.
    #[error("{topic} announces no rel=\"hub\" link")]
    NoHub {
        /// The topic URL.
        topic: String,
    },
}

/// The body of an answer as text, cut to a sane length.
pub(crate) async fn reason(response: reqwest::Response) -> String {
    let body = response.bytes().await.unwrap_or_default();
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_REASON_BYTES)]);
    text.trim().to_owned()
}
