//! What the checks share: unique names, a leased subscription, and
//! assertions that name what they read.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use rand::Rng;
use rand::distr::Alphanumeric;
use websub_store::{StoreError, Subscription, SubscriptionStore, to_micros};

/// A built store, shared between the tasks of a check.
pub type SharedStore = Arc<dyn SubscriptionStore>;

fn random_token() -> String {
    rand::rng()
        .sample_iter(&Alphanumeric)
        .take(16)
        .map(char::from)
        .collect()
}

/// A topic URL no other check (or run) uses.
pub fn unique_topic() -> String {
    format!(
        "https://publisher.storetest.example/{}/feed",
        random_token()
    )
}

/// A callback URL no other check (or run) uses.
pub fn unique_callback() -> String {
    format!(
        "https://subscriber.storetest.example/{}/callback",
        random_token()
    )
}

/// An owner id no other check (or run) uses.
pub fn unique_owner() -> String {
    format!("owner-{}", random_token())
}

pub(crate) fn now() -> DateTime<Utc> {
    to_micros(Utc::now())
}

/// A leased subscription of a fresh pair, with every field set.
pub(crate) fn leased(topic: &str, callback: &str) -> Subscription {
    let verified = now();
    Subscription {
        topic: topic.to_owned(),
        callback: callback.to_owned(),
        secret: Some("s3cret".to_owned()),
        lease_seconds: Some(864_000),
        created_at: verified - Duration::hours(1),
        verified_at: verified,
        expires_at: Some(verified + Duration::days(10)),
        owner: Some(unique_owner()),
    }
}

pub(crate) async fn must_get(store: &SharedStore, topic: &str, callback: &str) -> Subscription {
    store
        .get(topic, callback)
        .await
        .unwrap_or_else(|error| panic!("get({topic}, {callback}) failed: {error}"))
}

pub(crate) async fn must_save(store: &SharedStore, subscription: &Subscription) {
    store
        .save(subscription)
        .await
        .unwrap_or_else(|error| panic!("save({}) failed: {error}", subscription.callback));
}

pub(crate) async fn must_delete(store: &SharedStore, topic: &str, callback: &str) {
    store
        .delete(topic, callback)
        .await
        .unwrap_or_else(|error| panic!("delete({topic}, {callback}) failed: {error}"));
}

pub(crate) async fn callbacks_of(store: &SharedStore, topic: &str) -> Vec<String> {
    let mut callbacks: Vec<String> = store
        .list_by_topic(topic)
        .await
        .unwrap_or_else(|error| panic!("list_by_topic({topic}) failed: {error}"))
        .into_iter()
        .map(|subscription| {
            assert_eq!(
                subscription.topic, topic,
                "list_by_topic returned another topic"
            );
            subscription.callback
        })
        .collect();
    callbacks.sort();
    callbacks
}

pub(crate) async fn all_topics(store: &SharedStore) -> Vec<String> {
    store
        .topics()
        .await
        .unwrap_or_else(|error| panic!("topics failed: {error}"))
}

/// The callbacks of `topic` that `list_expiring(before)` returns.
pub(crate) async fn expiring_of(
    store: &SharedStore,
    topic: &str,
    before: DateTime<Utc>,
) -> Vec<String> {
    let mut callbacks: Vec<String> = store
        .list_expiring(before)
        .await
        .unwrap_or_else(|error| panic!("list_expiring failed: {error}"))
        .into_iter()
        .filter(|subscription| subscription.topic == topic)
        .map(|subscription| subscription.callback)
        .collect();
    callbacks.sort();
    callbacks
}

pub(crate) fn assert_unknown(
    result: Result<Subscription, StoreError>,
    topic: &str,
    callback: &str,
) {
    match result {
        Err(StoreError::UnknownSubscription { .. }) => {}
        Err(other) => panic!("get({topic}, {callback}): expected UnknownSubscription, got {other}"),
        Ok(found) => {
            panic!("get({topic}, {callback}): expected UnknownSubscription, got {found:?}")
        }
    }
}

pub(crate) async fn count_of(store: &SharedStore, owner: &str) -> u64 {
    store
        .count_by_owner(owner)
        .await
        .unwrap_or_else(|error| panic!("count_by_owner({owner}) failed: {error}"))
}

pub(crate) async fn owned_by(store: &SharedStore, owner: &str) -> Vec<Subscription> {
    let mut owned = store
        .list_by_owner(owner)
        .await
        .unwrap_or_else(|error| panic!("list_by_owner({owner}) failed: {error}"));
    owned.sort_by(|a, b| (&a.topic, &a.callback).cmp(&(&b.topic, &b.callback)));
    owned
}
