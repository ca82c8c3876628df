//! Saying no to a subscriber: the deny list a subscribe request meets
//! before its verification, an operator's denial of a subscription, and
//! the `hub.mode=denied` notice both send (the quota's refusal, after
//! verification, sends it too).

use websub_store::StoreError;

use super::{ProcessError, Subscriptions};
use crate::delivery::attempt::error_chain;
use crate::protocol::SubscriptionRequest;

impl Subscriptions {
    /// Denies subscribe requests whose topic or callback a pattern of
    /// `denials` matches (once; later calls are ignored).
    pub fn deny_with(&self, denials: crate::intake::deny::Denials) {
        let _ = self.inner.denials.set(denials);
    }

    /// The deny list subscribe requests are checked against, if any.
    pub fn denials(&self) -> Option<&crate::intake::deny::Denials> {
        self.inner.denials.get()
    }

    /// Denies a subscription at an operator's request: removes it (or
    /// nothing, when there is none) and tells the callback, with `reason`,
    /// as the Recommendation's `hub.mode=denied`. Whether the callback
    /// acknowledged the notice with a 2xx.
    pub async fn deny(
        &self,
        topic: &str,
        callback: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        self.inner.store.delete(topic, callback).await?;
        self.changed(topic);
        tracing::info!(topic, callback, reason, "denied by an operator");
        Ok(self.notify_denied(topic, callback, reason).await)
    }

    /// Sends the callback `hub.mode=denied` with `reason`; whether it
    /// answered 2xx. A notice not delivered is logged, not retried.
    pub(super) async fn notify_denied(&self, topic: &str, callback: &str, reason: &str) -> bool {
        match self.inner.verifier.deny(topic, callback, reason).await {
            Ok(()) => true,
            Err(error) => {
                tracing::info!(error = %error_chain(&error), "denial notice not delivered");
                false
            }
        }
    }

    /// The reason `request` is denied, when a pattern of the deny list
    /// matches its topic or callback.
    pub(super) async fn on_the_deny_list(
        &self,
        request: &SubscriptionRequest,
    ) -> Result<Option<String>, ProcessError> {
        match self.inner.denials.get() {
            Some(denials) => denials
                .denied(&request.topic, &request.callback)
                .await
                .map_err(ProcessError::DenyList),
            None => Ok(None),
        }
    }
}
