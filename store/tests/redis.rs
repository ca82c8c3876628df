//! The Redis backend runs the whole conformance suite against a real server,
//! plus the checks that only make sense for Redis: key prefixes, no TTLs,
//! conditional saves serialised across connections, and leftovers of
//! interrupted saves read around. `redis_cluster.rs` runs the same against
//! a Redis Cluster.

#![cfg(feature = "redis")]

use crate::redis_layout;

use std::sync::Arc;

use chrono::{Duration, Utc};
use redis_layout::{Layout, unique_prefix};
use websub_store::redis::RedisStore;
use websub_store::{OwnerQuota, StoreError, Subscription, SubscriptionStore};

async fn store_for_test() -> Option<Arc<dyn SubscriptionStore>> {
    let url = websub_storetest::servers::redis_url().await?;
    Some(Arc::new(
        RedisStore::connect(&url)
            .await
            .expect("connect to the test Redis"),
    ))
}

websub_storetest::suite!(store_for_test);

async fn isolated_store(url: &str) -> RedisStore {
    RedisStore::with_prefix(url, &unique_prefix())
        .await
        .expect("connect to the test Redis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_with_different_prefixes_do_not_see_each_other() {
    let Some(url) = websub_storetest::servers::redis_url().await else {
        return;
    };
    let first = isolated_store(&url).await;
    let second = isolated_store(&url).await;
    let sub = Subscription::new("https://example.com/feed", "https://sub.example/cb")
        .with_lease(Duration::days(1), Utc::now() - Duration::days(2))
        .with_owner("alice");
    first.save(&sub).await.expect("save");

    assert!(matches!(
        second.get(&sub.topic, &sub.callback).await,
        Err(StoreError::UnknownSubscription { .. })
    ));
    assert!(
        second
            .list_by_topic(&sub.topic)
            .await
            .expect("list")
            .is_empty()
    );
    assert!(second.topics().await.expect("topics").is_empty());
    assert!(
        second
            .list_expiring(Utc::now())
            .await
            .expect("expiring")
            .is_empty()
    );
    assert_eq!(second.count_by_owner("alice").await.expect("count"), 0);

    // Deleting through the other store must not touch the first one's copy.
    second
        .delete(&sub.topic, &sub.callback)
        .await
        .expect("delete");
    assert_eq!(
        first.get(&sub.topic, &sub.callback).await.expect("get"),
        sub
    );
    assert_eq!(
        first.topics().await.expect("topics"),
        vec![sub.topic.clone()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_subscriptions_stay_until_deleted() {
    let Some(url) = websub_storetest::servers::redis_url().await else {
        return;
    };
    let store = isolated_store(&url).await;
    // Expired a year ago: a store leaning on Redis TTLs would have lost it.
    let sub = Subscription::new("https://example.com/feed", "https://sub.example/cb")
        .with_lease(Duration::seconds(1), Utc::now() - Duration::days(365))
        .with_secret("s");
    store.save(&sub).await.expect("save");

    assert_eq!(
        store.get(&sub.topic, &sub.callback).await.expect("get"),
        sub
    );
    assert_eq!(
        store.list_expiring(Utc::now()).await.expect("expiring"),
        vec![sub.clone()]
    );
    assert_eq!(
        store.list_by_topic(&sub.topic).await.expect("list"),
        vec![sub.clone()]
    );

    store
        .delete(&sub.topic, &sub.callback)
        .await
        .expect("delete");
    assert!(
        store
            .list_expiring(Utc::now())
            .await
            .expect("expiring")
            .is_empty()
    );
    assert!(store.topics().await.expect("topics").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn far_future_expiry_is_still_strictly_before() {
    let Some(url) = websub_storetest::servers::redis_url().await else {
        return;
    };
    let store = isolated_store(&url).await;
    // Year 9999: beyond 2^53 microseconds, where neighbouring microseconds
    // share one sorted-set score.
    let expires = chrono::DateTime::from_timestamp(253_402_300_000, 0).expect("in range");
    let mut sub = Subscription::new("https://example.com/feed", "https://sub.example/cb");
    sub.lease_seconds = Some(u32::MAX);
    sub.expires_at = Some(expires);
    store.save(&sub).await.expect("save");

    let expiring = |before| {
        let store = store.clone();
        async move { store.list_expiring(before).await.expect("expiring").len() }
    };
    assert_eq!(expiring(expires).await, 0);
    assert_eq!(expiring(expires + Duration::microseconds(1)).await, 1);
    assert_eq!(expiring(expires - Duration::microseconds(1)).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conditional_saves_through_separate_connections_respect_the_limit() {
    let Some(url) = websub_storetest::servers::redis_url().await else {
        return;
    };
    let prefix = unique_prefix();
    let mut stores = Vec::new();
    for _ in 0..2 {
        stores.push(
            RedisStore::with_prefix(&url, &prefix)
                .await
                .expect("connect to the test Redis"),
        );
    }
    let quota = OwnerQuota::new(5);

    let mut tasks = Vec::new();
    for n in 0..50 {
        let store = stores[n % 2].clone();
        let quota = quota.clone();
        tasks.push(tokio::spawn(async move {
            let sub = Subscription::new(
                format!("https://example.com/feed/{n}"),
                "https://sub.example/cb",
            )
            .with_owner("bob");
            store.save_within_limit(&sub, &quota).await
        }));
    }
    let mut saved = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(()) => saved += 1,
            Err(StoreError::LimitReached { limit: 5, used: 5 }) => {}
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert_eq!(saved, 5);
    for store in &stores {
        assert_eq!(store.count_by_owner("bob").await.expect("count"), 5);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_hash_is_invalid() {
    let Some(url) = websub_storetest::servers::redis_url().await else {
        return;
    };
    let prefix = unique_prefix();
    let store = RedisStore::with_prefix(&url, &prefix)
        .await
        .expect("connect to the test Redis");
    let sub = Subscription::new("https://example.com/feed", "https://sub.example/cb");
    store.save(&sub).await.expect("save");

    // Corrupt the stored hash behind the store's back.
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let layout = Layout { prefix };
    let () = redis::cmd("HSET")
        .arg(layout.subscription(&sub.topic, &sub.callback))
        .arg("created_at")
        .arg("yesterday")
        .query_async(&mut connection)
        .await
        .expect("hset");

    assert!(matches!(
        store.get(&sub.topic, &sub.callback).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        store.list_by_topic(&sub.topic).await,
        Err(StoreError::Invalid(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leftovers_of_interrupted_saves_are_read_around() {
    let Some(url) = websub_storetest::servers::redis_url().await else {
        return;
    };
    let prefix = unique_prefix();
    let store = RedisStore::with_prefix(&url, &prefix)
        .await
        .expect("connect to the test Redis");
    let mut raw = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    redis_layout::leftovers_are_ignored_and_retired(&store, &mut raw, &Layout { prefix }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layout_version_is_kept_and_another_is_refused() {
    let Some(url) = websub_storetest::servers::redis_url().await else {
        return;
    };
    let prefix = unique_prefix();
    let store = RedisStore::with_prefix(&url, &prefix)
        .await
        .expect("connect to the test Redis");
    let sub = Subscription::new("https://example.com/feed", "https://sub.example/cb");
    store.save(&sub).await.expect("save");

    let mut raw = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let layout_key = format!("{}:layout", Layout { prefix }.registry());
    let version: String = redis::cmd("GET")
        .arg(&layout_key)
        .query_async(&mut raw)
        .await
        .expect("get");
    assert_eq!(version, "2");

    // A store some other layout wrote is not written over.
    let () = redis::cmd("SET")
        .arg(&layout_key)
        .arg("3")
        .query_async(&mut raw)
        .await
        .expect("set");
    let other = Subscription::new("https://example.com/other", "https://sub.example/cb");
    assert!(matches!(
        store.save(&other).await,
        Err(StoreError::Backend(_))
    ));
}
