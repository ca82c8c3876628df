//! Ordered delivery, as this process knows who asked for it: the
//! subscriptions whose events go out one at a time, strictly in the order
//! the hub recorded them. The requests live in the event log
//! ([`DeliveryQueue::set_ordered`]); each process keeps a copy, changed at once
//! when it takes a request and read again every [`ORDERED_REFRESH`] for the
//! ones another replica took.
//!
//! A request names a subscription by topic and callback, and applies to a
//! subscription created no later than the request (renewals keep their
//! creation time): one created after an unsubscribe starts unordered.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::warn;
use websub_store::Subscription;

use crate::storage::events::{DeliveryQueue, EventLogError};

/// How often each process reads the requests again.
pub const ORDERED_REFRESH: Duration = Duration::from_secs(5);

/// The most requests a process keeps; past it, the rest are delivered
/// unordered, with a warning.
pub const ORDERED_LIMIT: usize = 100_000;

#[derive(Debug, Default)]
pub(super) struct Ordered {
    known: RwLock<Requests>,
}

#[derive(Debug, Default)]
struct Requests {
    /// Topic, then callback: when it was asked for.
    by_topic: HashMap<String, HashMap<String, DateTime<Utc>>>,
    /// Callbacks with at least one request, and how many.
    callbacks: HashMap<String, usize>,
}

impl Requests {
    fn insert(&mut self, topic: &str, callback: &str, since: DateTime<Utc>) {
        let callbacks = self.by_topic.entry(topic.to_owned()).or_default();
        if callbacks.insert(callback.to_owned(), since).is_none() {
            *self.callbacks.entry(callback.to_owned()).or_default() += 1;
        }
    }

    fn remove(&mut self, topic: &str, callback: &str) {
        let Some(callbacks) = self.by_topic.get_mut(topic) else {
            return;
        };
        if callbacks.remove(callback).is_none() {
            return;
        }
        if callbacks.is_empty() {
            self.by_topic.remove(topic);
        }
        if let Some(count) = self.callbacks.get_mut(callback) {
            *count -= 1;
            if *count == 0 {
                self.callbacks.remove(callback);
            }
        }
    }
}

impl Ordered {
    /// Whether `subscription` gets its events in order.
    pub(super) fn is_ordered(&self, subscription: &Subscription) -> bool {
        let known = self.read();
        // The common case, no request at all, costs no hashing.
        if known.by_topic.is_empty() {
            return false;
        }
        known
            .by_topic
            .get(&subscription.topic)
            .and_then(|callbacks| callbacks.get(&subscription.callback))
            .is_some_and(|since| *since >= subscription.created_at)
    }

    /// Whether any subscription of `callback` asked for order: its line may
    /// have a record to send once another is done.
    pub(super) fn has_callback(&self, callback: &str) -> bool {
        let known = self.read();
        !known.callbacks.is_empty() && known.callbacks.contains_key(callback)
    }

    /// Takes a request (`since`: when), or its withdrawal (`None`).
    pub(super) fn set(&self, topic: &str, callback: &str, since: Option<DateTime<Utc>>) {
        let mut known = self.write();
        match since {
            Some(since) => {
                // A request already known keeps its time, as the log does.
                if !known
                    .by_topic
                    .get(topic)
                    .is_some_and(|callbacks| callbacks.contains_key(callback))
                {
                    known.insert(topic, callback, since);
                }
            }
            None => known.remove(topic, callback),
        }
    }

    /// Reads every request from `events` again.
    pub(super) async fn refresh(&self, events: &dyn DeliveryQueue) -> Result<(), EventLogError> {
        let requests = events.ordered_subscriptions(ORDERED_LIMIT + 1).await?;
        if requests.len() > ORDERED_LIMIT {
            warn!(
                limit = ORDERED_LIMIT,
                "more subscriptions asked for ordered delivery than a process keeps; the rest are delivered unordered"
            );
        }
        let mut fresh = Requests::default();
        for request in requests.iter().take(ORDERED_LIMIT) {
            fresh.insert(&request.topic, &request.callback, request.since);
        }
        *self.write() = fresh;
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Requests> {
        self.known
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Requests> {
        self.known
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_covers_the_subscription_it_was_made_for_not_a_later_one() {
        let ordered = Ordered::default();
        let subscription = Subscription::new("https://p.example/t", "http://127.0.0.1:9/cb");
        assert!(!ordered.is_ordered(&subscription));

        ordered.set(
            &subscription.topic,
            &subscription.callback,
            Some(Utc::now()),
        );
        assert!(ordered.is_ordered(&subscription));
        assert!(ordered.has_callback(&subscription.callback));

        let mut later = subscription.clone();
        later.created_at = Utc::now() + chrono::Duration::seconds(1);
        assert!(
            !ordered.is_ordered(&later),
            "subscribed again after the request"
        );

        ordered.set(&subscription.topic, &subscription.callback, None);
        assert!(!ordered.is_ordered(&subscription));
        assert!(!ordered.has_callback(&subscription.callback));
    }
}
