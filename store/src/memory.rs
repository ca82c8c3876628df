//! The in-memory backend: always compiled, for tests, development and hubs
//! that run as one process and may lose their subscriptions on restart.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::{OwnerQuota, StoreError, Subscription, SubscriptionStore};

/// Subscriptions held in process memory.
///
/// One lock guards the whole state. It is a std lock on purpose: no critical
/// section awaits, each is a few map operations, and an async lock would only
/// add overhead. Because a conditional save runs under the write lock, it is
/// serialised against every other write, which covers "per owner".
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: RwLock<State>,
}

#[derive(Debug, Default)]
struct State {
    /// A topic's subscriptions by callback, in byte order of the callbacks:
    /// the order `list_by_topic_page` walks.
    by_topic: HashMap<String, BTreeMap<String, Subscription>>,
    /// (expires_at, topic, callback) of every subscription with a lease, so
    /// `list_expiring` is a range scan rather than a full one.
    expiry: BTreeSet<(DateTime<Utc>, String, String)>,
    owner_counts: HashMap<String, u64>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        // A panic inside a critical section cannot leave the maps half
        // updated in a way later readers would trip on, so poisoning is moot.
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    fn get(&self, topic: &str, callback: &str) -> Option<&Subscription> {
        self.by_topic.get(topic)?.get(callback)
    }

    fn insert(&mut self, subscription: Subscription) {
        self.remove(&subscription.topic, &subscription.callback);
        if let Some(expires_at) = subscription.expires_at {
            self.expiry.insert((
                expires_at,
                subscription.topic.clone(),
                subscription.callback.clone(),
            ));
        }
        if let Some(owner) = &subscription.owner {
            *self.owner_counts.entry(owner.clone()).or_default() += 1;
        }
        self.by_topic
            .entry(subscription.topic.clone())
            .or_default()
            .insert(subscription.callback.clone(), subscription);
    }

    fn remove(&mut self, topic: &str, callback: &str) {
        let Some(callbacks) = self.by_topic.get_mut(topic) else {
            return;
        };
        let Some(removed) = callbacks.remove(callback) else {
            return;
        };
        if callbacks.is_empty() {
            self.by_topic.remove(topic);
        }
        if let Some(expires_at) = removed.expires_at {
            self.expiry
                .remove(&(expires_at, removed.topic, removed.callback));
        }
        if let Some(owner) = removed.owner
            && let Some(count) = self.owner_counts.get_mut(&owner)
        {
            *count -= 1;
            if *count == 0 {
                self.owner_counts.remove(&owner);
            }
        }
    }

    fn owner_count(&self, owner: &str) -> u64 {
        self.owner_counts.get(owner).copied().unwrap_or(0)
    }
}

#[async_trait]
impl SubscriptionStore for MemoryStore {
    async fn save(&self, subscription: &Subscription) -> Result<(), StoreError> {
        self.write().insert(subscription.clone());
        Ok(())
    }

    async fn get(&self, topic: &str, callback: &str) -> Result<Subscription, StoreError> {
        self.read()
            .get(topic, callback)
            .cloned()
            .ok_or_else(|| StoreError::unknown(topic, callback))
    }

    async fn delete(&self, topic: &str, callback: &str) -> Result<(), StoreError> {
        self.write().remove(topic, callback);
        Ok(())
    }

    async fn list_by_topic(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        Ok(self
            .read()
            .by_topic
            .get(topic)
            .map(|callbacks| callbacks.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn list_by_topic_page(
        &self,
        topic: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Subscription>, StoreError> {
        let state = self.read();
        let Some(callbacks) = state.by_topic.get(topic) else {
            return Ok(Vec::new());
        };
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(callbacks
            .range::<str, _>((start, Bound::Unbounded))
            .take(limit)
            .map(|(_, subscription)| subscription.clone())
            .collect())
    }

    async fn has_subscriptions(&self, topic: &str) -> Result<bool, StoreError> {
        Ok(self.read().by_topic.contains_key(topic))
    }

    async fn topics(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.read().by_topic.keys().cloned().collect())
    }

    async fn list_expiring(&self, before: DateTime<Utc>) -> Result<Vec<Subscription>, StoreError> {
        let state = self.read();
        Ok(state
            .expiry
            .iter()
            .take_while(|(expires_at, _, _)| *expires_at < before)
            .filter_map(|(_, topic, callback)| state.get(topic, callback).cloned())
            .collect())
    }

    async fn count_by_owner(&self, owner: &str) -> Result<u64, StoreError> {
        Ok(self.read().owner_count(owner))
    }

    async fn list_by_owner(&self, owner: &str) -> Result<Vec<Subscription>, StoreError> {
        let state = self.read();
        if state.owner_count(owner) == 0 {
            return Ok(Vec::new());
        }
        // Owners are looked up by the subscriber API, not on a hot path: a
        // scan keeps the map of record single.
        Ok(state
            .by_topic
            .values()
            .flat_map(BTreeMap::values)
            .filter(|subscription| subscription.owner.as_deref() == Some(owner))
            .cloned()
            .collect())
    }

    async fn save_within_limit(
        &self,
        subscription: &Subscription,
        quota: &OwnerQuota,
    ) -> Result<(), StoreError> {
        let owner = subscription
            .owner
            .as_deref()
            .ok_or(StoreError::MissingOwner)?;
        let mut state = self.write();
        let holds_pair = state
            .get(&subscription.topic, &subscription.callback)
            .is_some_and(|existing| existing.owner.as_deref() == Some(owner));
        let used = state.owner_count(owner) - u64::from(holds_pair);
        if used >= quota.limit {
            return Err(StoreError::LimitReached {
                limit: quota.limit,
                used,
            });
        }
        state.insert(subscription.clone());
        Ok(())
    }
}
