//! Talking to a hub as a subscriber: subscribe and unsubscribe requests
//! (WebSub 5.1), recorded in [`Intents`] before they go out so the receiver
//! confirms the verification that follows.

use std::fmt;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use url::Url;

use super::discovery::{self, Discovery};
use super::error::ClientError;
use super::error::reason;
use super::intents::{Intents, Renewal};
use websub_protocol::MAX_SECRET_BYTES;

/// A hub's subscriber: sends subscribe and unsubscribe requests to one hub
/// and records each in its [`Intents`]. Cheap to clone.
#[derive(Clone)]
pub struct SubscriberClient {
    hub: Url,
    http: reqwest::Client,
    user_token: Option<(HeaderName, HeaderValue)>,
    intents: Intents,
}

impl fmt::Debug for SubscriberClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubscriberClient")
            .field("hub", &self.hub.as_str())
            .field(
                "user_token_header",
                &self.user_token.as_ref().map(|(name, _)| name),
            )
            .field("intents", &self.intents)
            .finish_non_exhaustive()
    }
}

impl SubscriberClient {
    /// A client of the hub at `hub_url`, with a record of its own (share one
    /// with the receiver through [`with_intents`](Self::with_intents)).
    pub fn new(hub_url: Url, http: reqwest::Client) -> Self {
        Self {
            hub: hub_url,
            http,
            user_token: None,
            intents: Intents::new(),
        }
    }

    /// Records what it asks for in `intents`, the receiver's record.
    pub fn with_intents(mut self, intents: Intents) -> Self {
        self.intents = intents;
        self
    }

    /// Sends a user token in `header` with every request, for hubs that
    /// require one. In `Authorization` it is sent as `Bearer <token>`;
    /// in any other header, as given.
    pub fn with_user_token(mut self, header: &str, token: &str) -> Result<Self, ClientError> {
        let name = HeaderName::from_bytes(header.as_bytes()).map_err(|error| {
            ClientError::InvalidToken {
                reason: error.to_string(),
            }
        })?;
        let value = if name == http::header::AUTHORIZATION && !token.starts_with("Bearer ") {
            format!("Bearer {token}")
        } else {
            token.to_owned()
        };
        let mut value = HeaderValue::from_str(&value).map_err(|_| ClientError::InvalidToken {
            reason: "the token has characters not allowed in a header".to_owned(),
        })?;
        value.set_sensitive(true);
        self.user_token = Some((name, value));
        Ok(self)
    }

    /// The hub it talks to.
    pub fn hub(&self) -> &Url {
        &self.hub
    }

    /// Its record of what it asked for.
    pub fn intents(&self) -> &Intents {
        &self.intents
    }

    /// Asks the hub to subscribe `callback` to `topic` for `lease` (the
    /// hub's default when `None`), signing deliveries with `secret` when
    /// given. `Ok` means the hub accepted the request (2xx); the
    /// subscription exists once the hub's verification was confirmed (see
    /// [`Intents::status`]).
    pub async fn subscribe(
        &self,
        topic: &str,
        callback: &str,
        lease: Option<Duration>,
        secret: Option<&str>,
    ) -> Result<(), ClientError> {
        if let Some(secret) = secret
            && secret.len() > MAX_SECRET_BYTES
        {
            return Err(ClientError::SecretTooLong {
                bytes: secret.len(),
            });
        }
        let lease_seconds = lease.map(|lease| lease.as_secs().max(1).to_string());
        let mut form = vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", callback),
        ];
        if let Some(lease_seconds) = &lease_seconds {
            form.push(("hub.lease_seconds", lease_seconds));
        }
        if let Some(secret) = secret {
            form.push(("hub.secret", secret));
        }
        let renewal = Renewal {
            hub: self.hub.clone(),
            topic: topic.to_owned(),
            callback: callback.to_owned(),
            lease,
            not_before: None,
        };
        let snapshot = self
            .intents
            .want_subscribed(topic, callback, secret, Some(renewal))?;
        let sent = self.send(&form).await;
        if sent.is_err() {
            self.intents.restore(snapshot);
        }
        sent
    }

    /// Asks the hub to unsubscribe `callback` from `topic`.
    pub async fn unsubscribe(&self, topic: &str, callback: &str) -> Result<(), ClientError> {
        let form = [
            ("hub.mode", "unsubscribe"),
            ("hub.topic", topic),
            ("hub.callback", callback),
        ];
        let snapshot = self.intents.want_unsubscribed(topic, callback)?;
        let sent = self.send(&form).await;
        if sent.is_err() {
            self.intents.restore(snapshot);
        }
        sent
    }

    /// Finds the hub and canonical URL of a topic; see [`discovery::discover`].
    pub async fn discover(&self, topic_url: &str) -> Result<Discovery, ClientError> {
        discovery::discover(&self.http, topic_url).await
    }

    async fn send(&self, form: &[(&str, &str)]) -> Result<(), ClientError> {
        let body = serde_urlencoded::to_string(form).map_err(|error| ClientError::InvalidUrl {
            url: self.hub.to_string(),
            reason: error.to_string(),
        })?;
        let mut request = self
            .http
            .post(self.hub.clone())
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body);
        if let Some((name, value)) = &self.user_token {
            request = request.header(name, value);
        }
        let response = request.send().await.map_err(ClientError::Transport)?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let reason = reason(response).await;
        if status.is_client_error() {
            Err(ClientError::Refused { status, reason })
        } else {
            Err(ClientError::Unexpected { status, reason })
        }
    }
}
