//! Unsubscribe answers of late, per (topic, callback): an attempt of an
//! event recorded since is dropped, whatever a cache or a lane's queue
//! still holds of the subscription. Entries go after [`KEPT`], at most
//! [`LIMIT`] of them; with none, the check costs an atomic load.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, TimeDelta, Utc};

/// How long an unsubscribe answer is remembered: far longer than a record
/// waits in a queue or a subscriber list in the cache.
const KEPT: TimeDelta = TimeDelta::minutes(10);

/// The most unsubscribe answers remembered at once.
const LIMIT: usize = 10_000;

#[derive(Debug, Default)]
pub(super) struct Unsubscribed {
    any: AtomicBool,
    answered: Mutex<HashMap<(String, String), DateTime<Utc>>>,
}

impl Unsubscribed {
    /// `callback` answered its unsubscribe verification from `topic` at
    /// `since`; `None`: it is subscribed again.
    pub(super) fn set(
        &self,
        topic: &str,
        callback: &str,
        since: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) {
        let mut answered = self.lock();
        let key = (topic.to_owned(), callback.to_owned());
        match since {
            None => {
                answered.remove(&key);
            }
            Some(since) => {
                answered.retain(|_, at| *at + KEPT > now);
                if answered.len() >= LIMIT
                    && let Some(oldest) = answered
                        .iter()
                        .min_by_key(|(_, at)| **at)
                        .map(|(key, _)| key.clone())
                {
                    answered.remove(&oldest);
                }
                answered.insert(key, since);
            }
        }
        self.any.store(!answered.is_empty(), Ordering::Release);
    }

    /// Whether an event of `topic` recorded at `recorded` was published
    /// after `callback` answered its unsubscribe verification.
    pub(super) fn covers(&self, topic: &str, callback: &str, recorded: DateTime<Utc>) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        self.lock()
            .get(&(topic.to_owned(), callback.to_owned()))
            .is_some_and(|since| recorded >= *since)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), DateTime<Utc>>> {
        self.answered
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_covers_what_was_recorded_since_until_subscribed_again() {
        let unsubscribed = Unsubscribed::default();
        let at = Utc::now();
        assert!(!unsubscribed.covers("t", "c", at));
        unsubscribed.set("t", "c", Some(at), at);
        assert!(unsubscribed.covers("t", "c", at));
        assert!(!unsubscribed.covers("t", "c", at - TimeDelta::seconds(1)));
        assert!(!unsubscribed.covers("t", "other", at));
        unsubscribed.set("t", "c", None, at);
        assert!(!unsubscribed.covers("t", "c", at));
    }
}
