//! How a subscription's deliveries are signed, as this process knows it:
//! the subscriptions whose subscribers asked for the Standard Webhooks
//! scheme or are rotating their secret. The settings live in the event
//! log ([`SubscriptionSigning`]); each process keeps a copy, changed at
//! once when it takes a setting and read again with the ordered requests
//! (every [`super::ORDERED_REFRESH`]) for those another replica took. A
//! subscription with no setting, the common case, costs no hashing.
//!
//! A setting applies to the subscription created no later than it (a
//! renewal keeps its creation time): one created after an unsubscribe
//! starts with the defaults.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use tracing::warn;
use websub_store::Subscription;

use crate::storage::events::{EventLogError, Signing, SigningScheme, SubscriptionSigning};

/// The most settings a process keeps; past it, the rest are signed the
/// default way, with a warning.
pub const SIGNING_LIMIT: usize = 100_000;

/// What a delivery of one subscription is signed with, beside its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedWith {
    /// The scheme.
    pub scheme: SigningScheme,
    /// The secret a rotation replaced, while it still signs too.
    pub previous_secret: Option<Arc<str>>,
}

#[derive(Debug, Default)]
pub(super) struct Signings {
    /// Topic, then callback: the setting.
    known: RwLock<HashMap<String, HashMap<String, Signing>>>,
}

impl Signings {
    /// How `subscription`'s deliveries are signed at `now`, when anything
    /// but the default.
    pub(super) fn of(&self, subscription: &Subscription, now: DateTime<Utc>) -> Option<SignedWith> {
        let known = self.read();
        if known.is_empty() {
            return None;
        }
        let signing = known
            .get(&subscription.topic)?
            .get(&subscription.callback)
            .filter(|signing| signing.since >= subscription.created_at)?;
        Some(SignedWith {
            scheme: signing.scheme,
            previous_secret: signing
                .previous
                .as_ref()
                .filter(|(_, until)| now < *until)
                .map(|(secret, _)| Arc::from(secret.as_str())),
        })
    }

    /// The setting that covers `subscription`, if any.
    pub(super) fn setting(&self, subscription: &Subscription) -> Option<Signing> {
        self.read()
            .get(&subscription.topic)?
            .get(&subscription.callback)
            .filter(|signing| signing.since >= subscription.created_at)
            .cloned()
    }

    /// Takes a setting this process made.
    pub(super) fn set(&self, signing: Signing) {
        self.write()
            .entry(signing.topic.clone())
            .or_default()
            .insert(signing.callback.clone(), signing);
    }

    /// Reads every setting from `events` again.
    pub(super) async fn refresh(
        &self,
        events: &dyn SubscriptionSigning,
    ) -> Result<(), EventLogError> {
        let signings = events.signings(SIGNING_LIMIT + 1).await?;
        if signings.len() > SIGNING_LIMIT {
            warn!(
                limit = SIGNING_LIMIT,
                "more subscriptions have signing settings than a process keeps; the rest are signed the default way"
            );
        }
        let mut fresh: HashMap<String, HashMap<String, Signing>> = HashMap::new();
        for signing in signings.into_iter().take(SIGNING_LIMIT) {
            fresh
                .entry(signing.topic.clone())
                .or_default()
                .insert(signing.callback.clone(), signing);
        }
        *self.write() = fresh;
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, HashMap<String, Signing>>> {
        self.known
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, HashMap<String, Signing>>> {
        self.known
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl super::Distributor {
    /// Sets how the subscription of `signing` is signed: kept in the log,
    /// and in force in this process at once (in other replicas within
    /// [`ORDERED_REFRESH`](super::ORDERED_REFRESH)).
    pub async fn set_signing(&self, signing: Signing) -> Result<(), EventLogError> {
        self.inner.events.set_signing(&signing).await?;
        self.inner.signings.set(signing);
        Ok(())
    }

    /// The signing setting `subscription` has in this process, if any.
    pub fn signing_of(&self, subscription: &Subscription) -> Option<Signing> {
        self.inner.signings.setting(subscription)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_covers_its_subscription_and_a_rotation_ends_on_time() {
        let signings = Signings::default();
        let subscription = Subscription::new("https://p.example/t", "http://127.0.0.1:9/cb");
        let now = Utc::now();
        assert_eq!(signings.of(&subscription, now), None);
        signings.set(Signing {
            topic: subscription.topic.clone(),
            callback: subscription.callback.clone(),
            scheme: SigningScheme::StandardWebhooks,
            previous: Some((
                "whsec_b2xk".to_owned(),
                now + chrono::TimeDelta::seconds(60),
            )),
            since: now,
        });
        let during = signings.of(&subscription, now).expect("a setting");
        assert_eq!(during.scheme, SigningScheme::StandardWebhooks);
        assert_eq!(during.previous_secret.as_deref(), Some("whsec_b2xk"));
        let after = signings
            .of(&subscription, now + chrono::TimeDelta::seconds(61))
            .expect("a setting");
        assert_eq!(after.previous_secret, None, "the overlap ended");

        let mut later = subscription.clone();
        later.created_at = now + chrono::TimeDelta::seconds(1);
        assert_eq!(signings.of(&later, now), None, "subscribed again after it");
    }
}
