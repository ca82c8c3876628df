//! The receiving end: an axum router that answers verifications of intent,
//! takes WebSub content deliveries and outbox webhooks, checks their
//! signatures over the raw body, drops duplicates, and hands the rest to the
//! service's [`NotificationHandler`].
//!
//! Two kinds of route:
//! - WebSub callbacks. A verification is confirmed only for what
//!   [`Intents`] says this service asked for (404 otherwise, as WebSub
//!   requires); a denial is acknowledged and recorded. A delivery whose
//!   signature does not match is acknowledged with a 2xx and ignored, as
//!   WebSub 7.1 requires, so a forger learns nothing.
//! - Outbox webhooks (the messaging contract): a private endpoint, so a
//!   missing or bad signature is a plain 401.
//!
//! Every outcome is counted ([`Receiver::stats`]), sent to
//! [`Receiver::events`] listeners, logged, and counted in `metrics`.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use futures::FutureExt;
use tokio::sync::broadcast;
use tracing::{Instrument, debug, info, warn};

use super::dedup::{Claim, DedupStore, MemoryDedup};
use super::discovery::parse_link_header;
use super::intents::{CallbackKey, IntentError, Intents, Secret, Target};
use super::report::{Counters, NOTIFICATIONS, ReceiverEvent, ReceiverStats, VERIFICATIONS, bump};
use websub_protocol::Mode;
use websub_protocol::error_chain;
use websub_protocol::signature::{
    self, EVENT_ID_HEADER, HUB_SIGNATURE_HEADER, MESSAGING_EVENT_ID_HEADER,
    MESSAGING_SIGNATURE_HEADER,
};

/// What a handler may fail with.
pub type NotificationError = Box<dyn std::error::Error + Send + Sync>;

/// Where a notification came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// A WebSub content delivery.
    WebSub,
    /// An outbox webhook (the messaging contract).
    Webhook,
}

/// Content that passed the signature check and was not seen before.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Notification {
    /// The topic: the subscription's for WebSub; the envelope's
    /// `event_name` for a webhook (the route's path when the body has none).
    pub topic: String,
    /// The `Content-Type` it came with.
    pub content_type: Option<String>,
    /// The body, byte for byte.
    pub body: Bytes,
    /// The event id header, when present.
    pub event_id: Option<String>,
    /// Every header of the request.
    pub headers: HeaderMap,
    /// WebSub or webhook.
    pub source: Source,
}

/// The service's code for content that arrives. An error answers 500, so
/// the sender retries, and the event is not marked processed.
///
/// Any `Fn(Notification) -> impl Future<Output = Result<(), E>>` closure is
/// a handler.
#[async_trait]
pub trait NotificationHandler: Send + Sync + 'static {
    /// Processes one notification.
    async fn handle(&self, notification: Notification) -> Result<(), NotificationError>;
}

#[async_trait]
impl<F, Fut, E> NotificationHandler for F
where
    F: Fn(Notification) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<NotificationError> + 'static,
{
    async fn handle(&self, notification: Notification) -> Result<(), NotificationError> {
        (self)(notification).await.map_err(Into::into)
    }
}

struct Shared {
    intents: Intents,
    handler: Arc<dyn NotificationHandler>,
    dedup: Arc<dyn DedupStore>,
    counters: Counters,
    events: broadcast::Sender<ReceiverEvent>,
}

impl Shared {
    fn emit(&self, event: ReceiverEvent) {
        // No listener is fine: events are offered, not queued.
        let _ = self.events.send(event);
    }
}

/// Why a receiver could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No handler was given.
    #[error("a receiver needs a handler")]
    MissingHandler,
    /// A callback or webhook path is malformed.
    #[error(transparent)]
    Callback(#[from] IntentError),
    /// A webhook path carries a query string or an empty secret.
    #[error("webhook {path:?}: {reason}")]
    Webhook {
        /// The path given.
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// One path was declared both a WebSub callback and a webhook.
    #[error("{path:?} is both a WebSub callback and a webhook")]
    PathConflict {
        /// The path.
        path: String,
    },
}

/// How a [`Receiver`] is put together; see [`Receiver::builder`].
pub struct ReceiverBuilder {
    intents: Intents,
    callbacks: Vec<String>,
    expects: Vec<(String, String, Option<String>)>,
    webhooks: Vec<(String, String)>,
    handler: Option<Arc<dyn NotificationHandler>>,
    dedup: Option<Arc<dyn DedupStore>>,
    max_body_bytes: usize,
}

impl fmt::Debug for ReceiverBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiverBuilder")
            .field("callbacks", &self.callbacks)
            .field("expects", &self.expects.len())
            .field(
                "webhooks",
                &self
                    .webhooks
                    .iter()
                    .map(|(path, _)| path)
                    .collect::<Vec<_>>(),
            )
            .field("max_body_bytes", &self.max_body_bytes)
            .finish_non_exhaustive()
    }
}

/// The largest body a receiver reads by default (the hub's own limit).
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

impl ReceiverBuilder {
    /// Shares `intents` with a [`SubscriberClient`](super::SubscriberClient)
    /// so verifications of what it asks for are confirmed. By default the
    /// receiver has a record of its own.
    pub fn intents(mut self, intents: Intents) -> Self {
        self.intents = intents;
        self
    }

    /// Serves a WebSub callback at this path (or at the path of this URL).
    /// Which topics it accepts comes from the intents.
    pub fn callback(mut self, callback: impl Into<String>) -> Self {
        self.callbacks.push(callback.into());
        self
    }

    /// Serves `callback` and expects content for `topic` there, signed with
    /// `secret` when given: for subscriptions made elsewhere. See
    /// [`Intents::expect`].
    pub fn expect(
        mut self,
        topic: impl Into<String>,
        callback: impl Into<String>,
        secret: Option<&str>,
    ) -> Self {
        self.expects
            .push((topic.into(), callback.into(), secret.map(str::to_owned)));
        self
    }

    /// Serves an outbox webhook at `path`, signed with `secret` (the
    /// messaging contract's `X-Bootstrapify-Messaging-Signature`). Called
    /// again for the same path with another secret, a request signed with
    /// either is accepted: how a receiver follows a feed whose signing
    /// secret is replaced (add the new secret, let the feed switch, then
    /// drop the old one).
    pub fn webhook(mut self, path: impl Into<String>, secret: impl Into<String>) -> Self {
        self.webhooks.push((path.into(), secret.into()));
        self
    }

    /// The service's handler.
    pub fn handler(mut self, handler: impl NotificationHandler) -> Self {
        self.handler = Some(Arc::new(handler));
        self
    }

    /// Where processed event ids are remembered; by default a
    /// [`MemoryDedup`] of 100 000 ids.
    pub fn dedup(mut self, store: Arc<dyn DedupStore>) -> Self {
        self.dedup = Some(store);
        self
    }

    /// The largest body read (16 MiB by default); larger ones get 413.
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        self.max_body_bytes = limit;
        self
    }

    /// Checks every path and builds the receiver.
    pub fn build(self) -> Result<Receiver, BuildError> {
        let handler = self.handler.ok_or(BuildError::MissingHandler)?;
        let mut callback_paths: Vec<String> = Vec::new();
        let mut add_path = |path: &str| {
            if !callback_paths.iter().any(|known| known == path) {
                callback_paths.push(path.to_owned());
            }
        };
        for callback in &self.callbacks {
            add_path(CallbackKey::parse(callback)?.path());
        }
        for (topic, callback, secret) in &self.expects {
            self.intents.expect(topic, callback, secret.as_deref())?;
            add_path(CallbackKey::parse(callback)?.path());
        }
        let mut webhooks: Vec<(String, Vec<Secret>)> = Vec::new();
        for (path, secret) in &self.webhooks {
            let key = CallbackKey::parse(path)?;
            let refuse = |reason| BuildError::Webhook {
                path: path.clone(),
                reason,
            };
            if !path.starts_with('/') || path.contains('?') {
                return Err(refuse("must be a path without a query string"));
            }
            if secret.is_empty() {
                return Err(refuse("needs a secret"));
            }
            if callback_paths.iter().any(|known| known == key.path()) {
                return Err(BuildError::PathConflict {
                    path: key.path().to_owned(),
                });
            }
            match webhooks.iter_mut().find(|(known, _)| known == key.path()) {
                Some((_, secrets)) => secrets.push(Secret::new(secret)),
                None => webhooks.push((key.path().to_owned(), vec![Secret::new(secret)])),
            }
        }
        let webhooks: Vec<(String, Arc<[Secret]>)> = webhooks
            .into_iter()
            .map(|(path, secrets)| (path, secrets.into()))
            .collect();
        let (events, _) = broadcast::channel(1024);
        Ok(Receiver {
            shared: Arc::new(Shared {
                intents: self.intents,
                handler,
                dedup: self
                    .dedup
                    .unwrap_or_else(|| Arc::new(MemoryDedup::default())),
                counters: Counters::default(),
                events,
            }),
            callback_paths: callback_paths.into(),
            webhooks: webhooks.into(),
            max_body_bytes: self.max_body_bytes,
        })
    }
}

/// A built receiver: its [`router`](Self::router) serves the routes, and
/// the handle observes what they do. Cheap to clone.
#[derive(Clone)]
pub struct Receiver {
    shared: Arc<Shared>,
    callback_paths: Arc<[String]>,
    webhooks: Arc<[(String, Arc<[Secret]>)]>,
    max_body_bytes: usize,
}

impl fmt::Debug for Receiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("callbacks", &self.callback_paths)
            .field(
                "webhooks",
                &self
                    .webhooks
                    .iter()
                    .map(|(path, _)| path)
                    .collect::<Vec<_>>(),
            )
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Receiver {
    /// Starts building a receiver.
    pub fn builder() -> ReceiverBuilder {
        ReceiverBuilder {
            intents: Intents::new(),
            callbacks: Vec::new(),
            expects: Vec::new(),
            webhooks: Vec::new(),
            handler: None,
            dedup: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }

    /// The routes: GET and POST at every callback path, POST at every
    /// webhook path. Serve it at the root of a server, or merge it into the
    /// service's router; callback URLs must reach these exact paths.
    pub fn router(&self) -> Router {
        let mut router: Router<Arc<Shared>> = Router::new();
        for path in self.callback_paths.iter() {
            router = router.route(path, callback_route(Arc::from(path.as_str())));
        }
        for (path, secrets) in self.webhooks.iter() {
            router = router.route(
                path,
                webhook_route(Arc::from(path.as_str()), secrets.clone()),
            );
        }
        router
            .layer(DefaultBodyLimit::max(self.max_body_bytes))
            .with_state(self.shared.clone())
    }

    /// The record of what this service wants.
    pub fn intents(&self) -> &Intents {
        &self.shared.intents
    }

    /// Counts of what the receiver did so far.
    pub fn stats(&self) -> ReceiverStats {
        let counters = &self.shared.counters;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ReceiverStats {
            verified: read(&counters.verified),
            refused: read(&counters.refused),
            denied: read(&counters.denied),
            delivered: read(&counters.delivered),
            duplicates: read(&counters.duplicates),
            in_progress: read(&counters.in_progress),
            signature_rejected: read(&counters.signature_rejected),
            unauthorized: read(&counters.unauthorized),
            unwanted: read(&counters.unwanted),
            handler_failed: read(&counters.handler_failed),
        }
    }

    /// Every event from now on (a slow listener misses the oldest ones).
    pub fn events(&self) -> broadcast::Receiver<ReceiverEvent> {
        self.shared.events.subscribe()
    }
}

fn callback_route(path: Arc<str>) -> MethodRouter<Arc<Shared>> {
    let verify_path = path.clone();
    get(
        move |State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery| {
            let path = verify_path.clone();
            async move { verification(&shared, &path, query.as_deref()) }
        },
    )
    .post(
        move |State(shared): State<Arc<Shared>>,
              RawQuery(query): RawQuery,
              headers: HeaderMap,
              body: Bytes| {
            let path = path.clone();
            async move { delivery(shared, &path, query.as_deref(), headers, body).await }
        },
    )
}

fn webhook_route(path: Arc<str>, secrets: Arc<[Secret]>) -> MethodRouter<Arc<Shared>> {
    post(
        move |State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes| {
            let path = path.clone();
            let secrets = secrets.clone();
            async move { webhook(shared, &path, &secrets, headers, body).await }
        },
    )
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// A GET from a hub: `hub.mode` subscribe, unsubscribe or denied.
fn verification(shared: &Shared, path: &str, query: Option<&str>) -> Response {
    let callback = CallbackKey::from_parts(path, query);
    let params: Vec<(String, String)> = query
        .map(|query| {
            url::form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default();
    let param = |name: &str| {
        params
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let (Some(mode), Some(topic)) = (param("hub.mode"), param("hub.topic")) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "a verification needs hub.mode and hub.topic\n",
        );
    };
    let counters = &shared.counters;
    let mode = match mode {
        "subscribe" => Mode::Subscribe,
        "unsubscribe" => Mode::Unsubscribe,
        "denied" => {
            let reason = param("hub.reason");
            let known = shared.intents.deny(topic, &callback, reason);
            warn!(%topic, %callback, reason = reason.unwrap_or(""), known, "the hub denied a subscription");
            bump(&counters.denied, VERIFICATIONS, "denied");
            shared.emit(ReceiverEvent::Denied {
                topic: topic.to_owned(),
                callback: callback.to_string(),
                reason: reason.map(str::to_owned),
            });
            return StatusCode::OK.into_response();
        }
        other => {
            refuse(shared, other, topic, &callback);
            return StatusCode::NOT_FOUND.into_response();
        }
    };
    let Some(challenge) = param("hub.challenge").filter(|challenge| !challenge.is_empty()) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "a verification needs hub.challenge\n",
        );
    };
    // A lease beyond u32 seconds is clamped: it is 136 years either way.
    let lease_seconds = param("hub.lease_seconds")
        .and_then(|value| value.parse::<u64>().ok())
        .map(|value| u32::try_from(value).unwrap_or(u32::MAX));
    if !shared.intents.verify(mode, topic, &callback, lease_seconds) {
        refuse(shared, mode.as_str(), topic, &callback);
        return StatusCode::NOT_FOUND.into_response();
    }
    info!(%mode, %topic, %callback, ?lease_seconds, "verification of intent confirmed");
    bump(&counters.verified, VERIFICATIONS, "confirmed");
    shared.emit(ReceiverEvent::Verified {
        mode,
        topic: topic.to_owned(),
        callback: callback.to_string(),
        lease_seconds,
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        challenge.to_owned(),
    )
        .into_response()
}

fn refuse(shared: &Shared, mode: &str, topic: &str, callback: &CallbackKey) {
    info!(%mode, %topic, %callback, "verification of intent refused: not asked for");
    bump(&shared.counters.refused, VERIFICATIONS, "refused");
    shared.emit(ReceiverEvent::Refused {
        mode: mode.to_owned(),
        topic: topic.to_owned(),
        callback: callback.to_string(),
    });
}

/// The `rel="self"` target of the request's `Link` headers.
fn self_link(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::LINK)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(parse_link_header)
        .find(|link| link.has_rel("self"))
        .map(|link| link.target)
}

/// A WebSub content delivery.
async fn delivery(
    shared: Arc<Shared>,
    path: &str,
    query: Option<&str>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let callback = CallbackKey::from_parts(path, query);
    let self_link = self_link(&headers);
    let (topic, secrets) = match shared.intents.target(self_link.as_deref(), &callback) {
        Target::Wanted { topic, secrets } => (topic, secrets),
        Target::Unwanted => {
            info!(topic = ?self_link, %callback, "delivery for a subscription not wanted: 410");
            bump(&shared.counters.unwanted, NOTIFICATIONS, "unwanted");
            shared.emit(ReceiverEvent::Unwanted {
                topic: self_link,
                callback: callback.to_string(),
            });
            return plain(StatusCode::GONE, "not subscribed to this topic here\n");
        }
        Target::Ambiguous => {
            return plain(
                StatusCode::BAD_REQUEST,
                "several topics share this callback: a Link header with rel=\"self\" is needed\n",
            );
        }
    };
    let event_id = header_text(&headers, EVENT_ID_HEADER).map(str::to_owned);
    let span = tracing::info_span!("receive", %topic, %callback, event_id = event_id.as_deref().unwrap_or(""));
    let signature = header_text(&headers, HUB_SIGNATURE_HEADER);
    let signed = secrets.iter().any(|secret| match secret {
        None => true,
        Some(secret) => signature::verify(secret.as_bytes(), &body, signature),
    });
    if !signed {
        span.in_scope(|| {
            warn!(
                present = signature.is_some(),
                "delivery ignored: the signature does not match"
            );
        });
        bump(
            &shared.counters.signature_rejected,
            NOTIFICATIONS,
            "signature_rejected",
        );
        shared.emit(ReceiverEvent::SignatureRejected {
            topic,
            callback: callback.to_string(),
            event_id,
        });
        // WebSub 7.1: acknowledge, then ignore.
        return StatusCode::NO_CONTENT.into_response();
    }
    let key = event_id.as_ref().map(|id| format!("{id} {callback}"));
    let notification = Notification {
        topic,
        content_type: header_text(&headers, header::CONTENT_TYPE.as_str()).map(str::to_owned),
        body,
        event_id,
        headers,
        source: Source::WebSub,
    };
    process(shared, notification, key).instrument(span).await
}

/// An outbox webhook.
async fn webhook(
    shared: Arc<Shared>,
    path: &str,
    secrets: &[Secret],
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let event_id = header_text(&headers, MESSAGING_EVENT_ID_HEADER).map(str::to_owned);
    let span = tracing::info_span!("webhook", %path, event_id = event_id.as_deref().unwrap_or(""));
    let signature = header_text(&headers, MESSAGING_SIGNATURE_HEADER);
    if !secrets
        .iter()
        .any(|secret| signature::verify(secret.as_bytes(), &body, signature))
    {
        span.in_scope(|| warn!("webhook refused: missing or wrong signature"));
        bump(&shared.counters.unauthorized, NOTIFICATIONS, "unauthorized");
        shared.emit(ReceiverEvent::Unauthorized {
            path: path.to_owned(),
            event_id,
        });
        return plain(
            StatusCode::UNAUTHORIZED,
            "missing or invalid X-Bootstrapify-Messaging-Signature\n",
        );
    }
    // Decoded only now that the signature vouches for the bytes.
    let topic = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|envelope| {
            envelope
                .get("event_name")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| path.to_owned());
    let key = event_id.as_ref().map(|id| format!("{id} {path}"));
    let notification = Notification {
        topic,
        content_type: header_text(&headers, header::CONTENT_TYPE.as_str()).map(str::to_owned),
        body,
        event_id,
        headers,
        source: Source::Webhook,
    };
    process(shared, notification, key).instrument(span).await
}

/// Dedup, then the handler. Runs as a task of its own so the bookkeeping
/// finishes even when the sender hangs up mid-handler.
async fn process(shared: Arc<Shared>, notification: Notification, key: Option<String>) -> Response {
    let task = tokio::spawn(run_handler(shared, notification, key).in_current_span());
    match task.await {
        Ok(response) => response,
        Err(error) => {
            warn!(%error, "the delivery task failed");
            plain(StatusCode::INTERNAL_SERVER_ERROR, "processing failed\n")
        }
    }
}

async fn run_handler(
    shared: Arc<Shared>,
    notification: Notification,
    key: Option<String>,
) -> Response {
    let counters = &shared.counters;
    if let Some(key) = &key {
        match shared.dedup.claim(key).await {
            Ok(Claim::New) => {}
            Ok(Claim::Done) => {
                debug!("duplicate dropped");
                bump(&counters.duplicates, NOTIFICATIONS, "duplicate");
                shared.emit(ReceiverEvent::Duplicate {
                    topic: notification.topic,
                    event_id: notification.event_id.unwrap_or_default(),
                });
                return StatusCode::NO_CONTENT.into_response();
            }
            Ok(Claim::InProgress) => {
                // The first copy may still fail; acknowledging this one
                // would lose the event, so the sender is asked to retry.
                bump(&counters.in_progress, NOTIFICATIONS, "in_progress");
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, "1")],
                    "this event is being processed\n",
                )
                    .into_response();
            }
            Err(error) => {
                warn!(error = %error_chain(&error), "the dedup store failed");
                return plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the dedup store is unavailable\n",
                );
            }
        }
    }
    let topic = notification.topic.clone();
    let event_id = notification.event_id.clone();
    let outcome = AssertUnwindSafe(shared.handler.handle(notification))
        .catch_unwind()
        .await;
    let failure = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(error_chain(error.as_ref())),
        Err(_) => Some("the handler panicked".to_owned()),
    };
    match failure {
        None => {
            if let Some(key) = &key
                && let Err(error) = shared.dedup.complete(key).await
            {
                warn!(error = %error_chain(&error), "processed, but not recorded as processed");
            }
            debug!("processed");
            bump(&counters.delivered, NOTIFICATIONS, "delivered");
            shared.emit(ReceiverEvent::Delivered { topic, event_id });
            StatusCode::NO_CONTENT.into_response()
        }
        Some(error) => {
            if let Some(key) = &key
                && let Err(release) = shared.dedup.release(key).await
            {
                warn!(error = %error_chain(&release), "a failed claim could not be released");
            }
            warn!(%error, "the handler failed; the sender will retry");
            bump(&counters.handler_failed, NOTIFICATIONS, "handler_failed");
            shared.emit(ReceiverEvent::HandlerFailed {
                topic,
                event_id,
                error,
            });
            plain(StatusCode::INTERNAL_SERVER_ERROR, "the handler failed\n")
        }
    }
}
