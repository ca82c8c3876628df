//! The PostgreSQL backend against a real server: the shared conformance suite,
//! plus what only a database shared by several pools can show.
#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::task::JoinSet;
use websub_store::postgres::PostgresStore;
use websub_store::{OwnerQuota, StoreError, Subscription, SubscriptionStore};

async fn store_for_test() -> Option<Arc<dyn SubscriptionStore>> {
    let url = websub_storetest::servers::postgres_url().await?;
    Some(Arc::new(
        PostgresStore::connect(&url)
            .await
            .expect("connect to the test PostgreSQL"),
    ))
}

websub_storetest::suite!(store_for_test);

/// A name no other test (or run) uses.
fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Two pools stand in for two hub replicas: their connections share nothing
/// but the database, so only the advisory lock keeps 40 concurrent
/// conditional saves for one owner at the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conditional_saves_from_two_pools_respect_the_limit() {
    let Some(url) = websub_storetest::servers::postgres_url().await else {
        return;
    };
    let replicas = [
        PostgresStore::connect(&url).await.expect("first pool"),
        PostgresStore::connect(&url).await.expect("second pool"),
    ];
    let owner = unique("owner");
    let topic = format!("https://publisher.example/{}", unique("topic"));
    let quota = OwnerQuota::new(5);
    let mut tasks = JoinSet::new();
    for i in 0..40 {
        let store = replicas[i % 2].clone();
        let quota = quota.clone();
        let subscription =
            Subscription::new(&topic, format!("https://sub.example/{i}")).with_owner(&owner);
        tasks.spawn(async move { store.save_within_limit(&subscription, &quota).await });
    }
    let (mut saved, mut refused) = (0, 0);
    for result in tasks.join_all().await {
        match result {
            Ok(()) => saved += 1,
            Err(StoreError::LimitReached { limit: 5, used: 5 }) => refused += 1,
            Err(other) => panic!("unexpected error from a conditional save: {other}"),
        }
    }
    assert_eq!((saved, refused), (5, 35));
    assert_eq!(replicas[0].count_by_owner(&owner).await.expect("count"), 5);
}

/// The lock is per (quota type, owner): while one transaction holds an
/// owner's lock, a conditional save for another quota type of that owner
/// goes through, and one for the held pool waits until the holder is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lock_is_per_quota_type_and_owner() {
    let Some(url) = websub_storetest::servers::postgres_url().await else {
        return;
    };
    let store = PostgresStore::connect(&url).await.expect("connect");
    let owner = unique("owner");
    let held = OwnerQuota::new(10);
    let other = OwnerQuota {
        quota_type: "private_setups".to_owned(),
        limit: 10,
    };
    let mut holder = store.pool().begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(held.lock_key(&owner))
        .execute(&mut *holder)
        .await
        .expect("take the lock");

    let other_type =
        Subscription::new(unique("https://t.example/"), "https://sub.example/a").with_owner(&owner);
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        store.save_within_limit(&other_type, &other),
    )
    .await
    .expect("another quota type must not wait for the held lock")
    .expect("save");

    let same_pool =
        Subscription::new(unique("https://t.example/"), "https://sub.example/b").with_owner(&owner);
    let waiting = {
        let store = store.clone();
        let held = held.clone();
        tokio::spawn(async move { store.save_within_limit(&same_pool, &held).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a save into the held pool must wait for the lock"
    );
    holder.rollback().await.expect("release the lock");
    waiting
        .await
        .expect("task")
        .expect("the save proceeds once the lock is released");
    assert_eq!(store.count_by_owner(&owner).await.expect("count"), 2);
}

/// Migrations are recorded in the store's own table, and running them again
/// (as every replica does on start) changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn migrations_are_idempotent_and_in_their_own_table() {
    let Some(url) = websub_storetest::servers::postgres_url().await else {
        return;
    };
    let store = PostgresStore::connect(&url).await.expect("connect");
    let applied = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM websub_store_migrations")
            .fetch_one(store.pool())
            .await
            .expect("the store's migrations table exists")
    };
    let before = applied().await;
    assert!(before >= 1);
    store.migrate().await.expect("second run");
    store.migrate().await.expect("third run");
    assert_eq!(applied().await, before);
}

/// A `before` with a sub-microsecond part still includes a subscription
/// expiring in the microsecond it falls in, since that expiry is strictly
/// earlier; letting the driver truncate `before` would drop it.
#[tokio::test(flavor = "multi_thread")]
async fn list_expiring_with_a_sub_microsecond_bound() {
    let Some(url) = websub_storetest::servers::postgres_url().await else {
        return;
    };
    let store = PostgresStore::connect(&url).await.expect("connect");
    let topic = unique("https://t.example/");
    // Far enough ahead that no other test's subscriptions expire near it.
    let expires = chrono::DateTime::from_timestamp(32_000_000_000, 123_456_000).expect("valid");
    let mut subscription = Subscription::new(&topic, "https://sub.example/");
    subscription.expires_at = Some(expires);
    subscription.lease_seconds = Some(1);
    store.save(&subscription).await.expect("save");
    let at = |nanos: i64| expires + chrono::Duration::nanoseconds(nanos);
    let mine = |before| {
        let store = store.clone();
        let topic = topic.clone();
        async move {
            store
                .list_expiring(before)
                .await
                .expect("list")
                .iter()
                .filter(|subscription| subscription.topic == topic)
                .count()
        }
    };
    assert_eq!(mine(at(0)).await, 0);
    assert_eq!(mine(at(-1)).await, 0);
    assert_eq!(mine(at(1)).await, 1);
    assert_eq!(mine(at(999)).await, 1);
    store
        .delete(&topic, "https://sub.example/")
        .await
        .expect("delete");
}
