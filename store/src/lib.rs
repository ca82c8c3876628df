//! Subscription storage for websub-hub.
//!
//! A hub keeps every verified WebSub subscription behind [`SubscriptionStore`].
//! This crate owns that contract, the [`Subscription`] value it stores, the
//! [`StoreError`] a backend reports, and the backends themselves, one module
//! each:
//!
//! | backend | feature | for |
//! |---|---|---|
//! | [`memory`] | always | tests, development, single-process hubs |
//! | `sqlite` | `sqlite` | the embedded default: one file, one process |
//! | `postgres` | `postgres` | production hubs, several replicas on one database |
//! | `redis` | `redis` | subscription state shared through Redis |
//!
//! Every backend passes the conformance suite in `websub-storetest`; a new
//! backend is proven the same way (see the README's "Writing a backend").
//!
//! ```
//! use chrono::{Duration, Utc};
//! use websub_store::{memory::MemoryStore, StoreError, Subscription, SubscriptionStore};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let sub = Subscription::new("https://example.com/feed", "https://sub.example/cb")
//!     .with_lease(Duration::days(10), Utc::now());
//! store.save(&sub).await?;
//!
//! let found = store.get(&sub.topic, &sub.callback).await?;
//! assert_eq!(found, sub);
//!
//! store.delete(&sub.topic, &sub.callback).await?;
//! assert!(matches!(
//!     store.get(&sub.topic, &sub.callback).await,
//!     Err(StoreError::UnknownSubscription { .. })
//! ));
//! # Ok::<(), StoreError>(())
//! # }).unwrap();
//! ```

#[cfg(feature = "sql")]
mod bounded;
mod error;
pub mod memory;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod migrations;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[macro_use]
mod sql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod subscription;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[cfg(feature = "sql")]
pub use bounded::bounded;
pub use error::StoreError;
pub use subscription::{OwnerQuota, Subscription, expiry_bound_micros, to_micros};

/// Where a hub keeps its verified subscriptions.
///
/// # Contract
///
/// Every backend keeps every rule below; the `websub-storetest` suite checks
/// each of them, boundaries included. A backend documents only what it adds.
///
/// - **Identity.** A subscription is identified by the pair (topic, callback),
///   compared byte for byte. Neither half is unique on its own: one callback
///   may subscribe to many topics and one topic may have many callbacks.
/// - **`save` replaces.** Saving a pair that exists overwrites every field
///   with the new value. It never creates a second entry and never fails
///   because the pair exists: re-subscribing is legal in WebSub.
/// - **`get` of a missing pair** fails with
///   [`StoreError::UnknownSubscription`], never a default value.
/// - **`delete` is idempotent.** Deleting a missing pair succeeds, because
///   unsubscribing is idempotent and a hub may retry it.
/// - **`list_by_topic` is the hot path**: it runs on every publish, so it is
///   served from an index on the topic, never a scan.
/// - **`list_by_topic_page` walks a topic in pages.** A backend orders a
///   topic's callbacks in an order of its own, the same on every call (byte
///   order, a database collation, a digest of the pair). A page holds the
///   first `limit` subscriptions whose callbacks come after `after` in that
///   order (from the start when `after` is `None`), in that order. `after`
///   need not be subscribed any more: a walk goes on past a callback deleted
///   under it. Walking from `None`, each call passing the previous page's
///   last callback, returns every subscription that exists for the whole walk
///   exactly once; one saved or deleted during the walk may or may not be
///   returned. A page shorter than `limit` is the last one.
/// - **`has_subscriptions`** answers from the topic's index alone: one
///   existence check, whatever the number of subscriptions.
/// - **`topics`** lists each topic that has at least one subscription, once.
///   A topic disappears with its last subscription.
/// - **`list_expiring(before)` is strictly before**: a subscription expiring
///   exactly at `before` is not returned, and a permanent subscription (no
///   `expires_at`) never is. Results come in no particular order.
/// - **Timestamps** round-trip at microsecond precision: a value saved with
///   whole microseconds reads back equal.
/// - **`save_within_limit`** counts the owner's subscriptions *other than this
///   pair* and saves only if that count is below the limit; the count and the
///   save are one atomic step, serialised against every other conditional save
///   for the same owner and quota type — across processes for backends that
///   are shared between processes, across tasks for in-process ones. A
///   re-save of a pair the owner already holds therefore never counts as new.
///   Refusal is [`StoreError::LimitReached`] carrying the count it saw.
/// - **Concurrency.** Every method is safe to call from many tasks at once;
///   concurrent saves of one pair leave exactly one entry holding one of the
///   written values.
#[async_trait]
pub trait SubscriptionStore: Send + Sync + std::fmt::Debug {
    /// Inserts the subscription, or replaces the one with the same pair.
    async fn save(&self, subscription: &Subscription) -> Result<(), StoreError>;

    /// [`save`](Self::save)s each of `subscriptions`, no two of which name
    /// the same pair, in one write where the backend has one: all of them
    /// or, on an error, none. The provided method saves them one by one,
    /// so an error may leave the first saved.
    async fn save_all(&self, subscriptions: &[Subscription]) -> Result<(), StoreError> {
        for subscription in subscriptions {
            self.save(subscription).await?;
        }
        Ok(())
    }

    /// [`save_all`](Self::save_all)s `subscriptions`, except that one
    /// replacing a subscription of its pair keeps that one's `created_at`:
    /// a renewal, of a subscription that has existed since then. The hub
    /// saves what it verified this way. The provided method reads each pair
    /// first; the SQL backends need no read.
    async fn renew_all(&self, subscriptions: &[Subscription]) -> Result<(), StoreError> {
        let mut renewed = Vec::with_capacity(subscriptions.len());
        for subscription in subscriptions {
            renewed.push(as_renewal(self, subscription.clone()).await?);
        }
        self.save_all(&renewed).await
    }

    /// Returns the subscription of the pair, or
    /// [`StoreError::UnknownSubscription`].
    async fn get(&self, topic: &str, callback: &str) -> Result<Subscription, StoreError>;

    /// Removes the subscription of the pair; a missing pair is not an error.
    async fn delete(&self, topic: &str, callback: &str) -> Result<(), StoreError>;

    /// Every subscription of the topic, in no particular order.
    async fn list_by_topic(&self, topic: &str) -> Result<Vec<Subscription>, StoreError>;

    /// Up to `limit` subscriptions of the topic whose callbacks come after
    /// `after` in the backend's order (see the contract), in that order: one
    /// page of a walk that starts at `None` and passes each page's last
    /// callback on to the next call. A page shorter than `limit` is the last.
    ///
    /// Every backend of this crate serves a page from an index, without
    /// reading the rest of the topic (Redis reads the topic's member ids, not
    /// their subscriptions). The provided body is for stores outside this
    /// crate, such as wrappers around one of these: it is correct, in byte
    /// order of the callbacks, but reads the whole topic for every page.
    async fn list_by_topic_page(
        &self,
        topic: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Subscription>, StoreError> {
        let mut page: Vec<Subscription> = self
            .list_by_topic(topic)
            .await?
            .into_iter()
            .filter(|subscription| after.is_none_or(|after| subscription.callback.as_str() > after))
            .collect();
        page.sort_unstable_by(|a, b| a.callback.cmp(&b.callback));
        page.truncate(limit);
        Ok(page)
    }

    /// Whether the topic has at least one subscription: what a ping asks
    /// before anything is fetched, so it must not read the subscriptions.
    ///
    /// The provided body reads one page of one; every backend of this crate
    /// answers with an existence check on its topic index instead.
    async fn has_subscriptions(&self, topic: &str) -> Result<bool, StoreError> {
        Ok(!self.list_by_topic_page(topic, None, 1).await?.is_empty())
    }

    /// Every topic with at least one subscription, each once, in no
    /// particular order.
    async fn topics(&self) -> Result<Vec<String>, StoreError>;

    /// Subscriptions whose `expires_at` is strictly before `before`;
    /// permanent subscriptions never.
    async fn list_expiring(&self, before: DateTime<Utc>) -> Result<Vec<Subscription>, StoreError>;

    /// How many subscriptions name `owner` as their owner.
    async fn count_by_owner(&self, owner: &str) -> Result<u64, StoreError>;

    /// Whether the store answers a read within `limit`, for a readiness
    /// check. The provided method reads a count for nobody and gives up
    /// when `limit` passes; the SQL backends also close the connection of
    /// a read that does not answer ([`bounded`](crate::bounded)), so that a
    /// peer gone silent does not keep its place in the pool.
    async fn ready(&self, limit: std::time::Duration) -> Result<(), StoreError> {
        match tokio::time::timeout(limit, self.count_by_owner("")).await {
            Ok(counted) => counted.map(drop),
            Err(_) => Err(StoreError::backend(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the store did not answer within {limit:?}"),
            ))),
        }
    }

    /// Every subscription naming `owner` as its owner, in no particular
    /// order.
    async fn list_by_owner(&self, owner: &str) -> Result<Vec<Subscription>, StoreError>;

    /// Saves the subscription only if its owner holds fewer than
    /// `quota.limit` subscriptions besides this pair, atomically and
    /// serialised per (quota type, owner).
    ///
    /// Fails with [`StoreError::MissingOwner`] when the subscription has no
    /// owner, and with [`StoreError::LimitReached`] when the owner is full.
    async fn save_within_limit(
        &self,
        subscription: &Subscription,
        quota: &OwnerQuota,
    ) -> Result<(), StoreError>;
}

/// `subscription` as a renewal saves it: with the `created_at` of the
/// subscription of its pair in `store`, if there is one (see
/// [`SubscriptionStore::renew_all`]).
pub async fn as_renewal<S: SubscriptionStore + ?Sized>(
    store: &S,
    mut subscription: Subscription,
) -> Result<Subscription, StoreError> {
    match store.get(&subscription.topic, &subscription.callback).await {
        Ok(existing) => subscription.created_at = existing.created_at,
        Err(StoreError::UnknownSubscription { .. }) => {}
        Err(error) => return Err(error),
    }
    Ok(subscription)
}

#[async_trait]
impl<S: SubscriptionStore + ?Sized> SubscriptionStore for std::sync::Arc<S> {
    async fn save(&self, subscription: &Subscription) -> Result<(), StoreError> {
        (**self).save(subscription).await
    }
    async fn save_all(&self, subscriptions: &[Subscription]) -> Result<(), StoreError> {
        (**self).save_all(subscriptions).await
    }
    async fn renew_all(&self, subscriptions: &[Subscription]) -> Result<(), StoreError> {
        (**self).renew_all(subscriptions).await
    }
    async fn get(&self, topic: &str, callback: &str) -> Result<Subscription, StoreError> {
        (**self).get(topic, callback).await
    }
    async fn delete(&self, topic: &str, callback: &str) -> Result<(), StoreError> {
        (**self).delete(topic, callback).await
    }
    async fn list_by_topic(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        (**self).list_by_topic(topic).await
    }
    async fn list_by_topic_page(
        &self,
        topic: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Subscription>, StoreError> {
        (**self).list_by_topic_page(topic, after, limit).await
    }
    async fn has_subscriptions(&self, topic: &str) -> Result<bool, StoreError> {
        (**self).has_subscriptions(topic).await
    }
    async fn topics(&self) -> Result<Vec<String>, StoreError> {
        (**self).topics().await
    }
    async fn list_expiring(&self, before: DateTime<Utc>) -> Result<Vec<Subscription>, StoreError> {
        (**self).list_expiring(before).await
    }
    async fn count_by_owner(&self, owner: &str) -> Result<u64, StoreError> {
        (**self).count_by_owner(owner).await
    }
    async fn ready(&self, limit: std::time::Duration) -> Result<(), StoreError> {
        (**self).ready(limit).await
    }
    async fn list_by_owner(&self, owner: &str) -> Result<Vec<Subscription>, StoreError> {
        (**self).list_by_owner(owner).await
    }
    async fn save_within_limit(
        &self,
        subscription: &Subscription,
        quota: &OwnerQuota,
    ) -> Result<(), StoreError> {
        (**self).save_within_limit(subscription, quota).await
    }
}
