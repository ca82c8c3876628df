//! The conformance suite for [`SubscriptionStore`] backends.
//!
//! One public async check per behaviour of the contract documented on
//! [`SubscriptionStore`], boundaries included. Each check takes a built store
//! and isolates itself with random topic and callback URLs (and a random
//! owner), so checks run concurrently against one shared store and never need
//! it wiped. A backend that passes every check is correct enough to ship.
//!
//! A backend runs the whole suite from one of its own `tests/*.rs` files with
//! [`suite!`], which expands to one `#[tokio::test]` per check on a
//! multi-threaded runtime, so each check's name shows in the test output:
//!
//! ```no_run
//! use std::sync::Arc;
//! use websub_store::{memory::MemoryStore, SubscriptionStore};
//!
//! async fn store_for_test() -> Option<Arc<dyn SubscriptionStore>> {
//!     Some(Arc::new(MemoryStore::new()))
//! }
//!
//! websub_storetest::suite!(store_for_test);
//! ```
//!
//! The factory returns `None` to skip (only ever outside CI: see
//! [`servers`]). [`run_all`] runs every check in sequence on one store, for a
//! harness that is not libtest.
//!
//! Checks assert on error *variants*, never on message text.

pub mod servers;

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use rand::Rng;
use rand::distr::Alphanumeric;
use websub_store::{OwnerQuota, StoreError, Subscription, SubscriptionStore, to_micros};

/// A built store, shared between the tasks of a check.
pub type SharedStore = Arc<dyn SubscriptionStore>;

/// Calls `$callback!` with the name of every check, so the list is written
/// once for [`suite!`] and [`run_all`].
#[doc(hidden)]
#[macro_export]
macro_rules! __with_checks {
    ($callback:ident ! ($($arg:tt)*)) => {
        $crate::$callback! { ($($arg)*)
            round_trips_every_field,
            secret_absent_and_empty_are_distinct,
            timestamps_keep_microseconds,
            unicode_and_long_urls_round_trip,
            callback_query_strings_are_part_of_the_pair,
            save_replaces_every_field,
            save_twice_leaves_one_subscription,
            get_missing_is_unknown_subscription,
            get_after_delete_is_unknown_subscription,
            delete_missing_is_ok,
            delete_twice_is_ok,
            same_callback_on_many_topics_is_independent,
            same_topic_with_many_callbacks_is_independent,
            list_by_topic_of_unknown_topic_is_empty,
            list_by_topic_returns_only_that_topic,
            list_by_topic_page_walks_every_subscription_once,
            has_subscriptions_follows_the_topic,
            topics_lists_each_topic_once,
            topic_disappears_with_its_last_subscription,
            list_expiring_is_strictly_before,
            list_expiring_bound_inside_a_microsecond,
            list_expiring_never_returns_permanent,
            list_expiring_follows_renewals,
            list_expiring_forgets_deleted,
            concurrent_upserts_of_one_pair_leave_one,
            concurrent_saves_and_deletes_of_distinct_pairs_lose_nothing,
            count_by_owner_counts_only_that_owner,
            count_by_owner_follows_owner_changes,
            list_by_owner_returns_only_that_owner,
            list_by_owner_follows_owner_changes_and_deletes,
            conditional_save_below_limit_saves,
            conditional_save_at_limit_is_refused_with_count,
            conditional_resave_at_limit_succeeds,
            conditional_save_needs_an_owner,
            conditional_save_frees_slot_after_delete,
            conditional_saves_of_other_owners_do_not_count,
            concurrent_conditional_saves_respect_the_limit,
        }
    };
}

/// Expands to one `#[tokio::test(flavor = "multi_thread")]` per check.
///
/// `$make` is a path to an `async fn() -> Option<Arc<dyn SubscriptionStore>>`
/// that builds the store under test (`None` skips, outside CI only). The
/// calling crate needs `tokio` with the `macros` and `rt-multi-thread`
/// features among its dev-dependencies.
#[macro_export]
macro_rules! suite {
    ($make:path) => {
        $crate::__with_checks!(__suite_tests!($make));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    (($make:path) $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                let Some(store) = $make().await else {
                    return;
                };
                $crate::$check(store).await;
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __run_all {
    (($store:ident) $($check:ident),* $(,)?) => {
        $(
            eprintln!("storetest: {}", stringify!($check));
            $crate::$check($store.clone()).await;
        )*
    };
}

/// Runs every check in sequence against one store, printing each name.
pub async fn run_all(store: SharedStore) {
    __with_checks!(__run_all!(store));
}

// ---------------------------------------------------------------- helpers

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

fn now() -> DateTime<Utc> {
    to_micros(Utc::now())
}

/// A leased subscription of a fresh pair, with every field set.
fn leased(topic: &str, callback: &str) -> Subscription {
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

async fn must_get(store: &SharedStore, topic: &str, callback: &str) -> Subscription {
    store
        .get(topic, callback)
        .await
        .unwrap_or_else(|error| panic!("get({topic}, {callback}) failed: {error}"))
}

async fn must_save(store: &SharedStore, subscription: &Subscription) {
    store
        .save(subscription)
        .await
        .unwrap_or_else(|error| panic!("save({}) failed: {error}", subscription.callback));
}

async fn must_delete(store: &SharedStore, topic: &str, callback: &str) {
    store
        .delete(topic, callback)
        .await
        .unwrap_or_else(|error| panic!("delete({topic}, {callback}) failed: {error}"));
}

async fn callbacks_of(store: &SharedStore, topic: &str) -> Vec<String> {
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

async fn all_topics(store: &SharedStore) -> Vec<String> {
    store
        .topics()
        .await
        .unwrap_or_else(|error| panic!("topics failed: {error}"))
}

/// The callbacks of `topic` that `list_expiring(before)` returns.
async fn expiring_of(store: &SharedStore, topic: &str, before: DateTime<Utc>) -> Vec<String> {
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

fn assert_unknown(result: Result<Subscription, StoreError>, topic: &str, callback: &str) {
    match result {
        Err(StoreError::UnknownSubscription { .. }) => {}
        Err(other) => panic!("get({topic}, {callback}): expected UnknownSubscription, got {other}"),
        Ok(found) => {
            panic!("get({topic}, {callback}): expected UnknownSubscription, got {found:?}")
        }
    }
}

async fn count_of(store: &SharedStore, owner: &str) -> u64 {
    store
        .count_by_owner(owner)
        .await
        .unwrap_or_else(|error| panic!("count_by_owner({owner}) failed: {error}"))
}

async fn owned_by(store: &SharedStore, owner: &str) -> Vec<Subscription> {
    let mut owned = store
        .list_by_owner(owner)
        .await
        .unwrap_or_else(|error| panic!("list_by_owner({owner}) failed: {error}"));
    owned.sort_by(|a, b| (&a.topic, &a.callback).cmp(&(&b.topic, &b.callback)));
    owned
}

// ---------------------------------------------------------------- checks

/// Every field saved is read back equal.
pub async fn round_trips_every_field(store: SharedStore) {
    let subscription = leased(&unique_topic(), &unique_callback());
    must_save(&store, &subscription).await;
    assert_eq!(
        must_get(&store, &subscription.topic, &subscription.callback).await,
        subscription
    );
    let listed = store
        .list_by_topic(&subscription.topic)
        .await
        .expect("list_by_topic");
    assert_eq!(listed, vec![subscription]);
}

/// A secret of `None` and a secret of `Some("")` are different values, and a
/// permanent subscription without owner or lease round-trips.
pub async fn secret_absent_and_empty_are_distinct(store: SharedStore) {
    let topic = unique_topic();
    let absent = Subscription::new(&topic, unique_callback());
    let empty = Subscription::new(&topic, unique_callback()).with_secret("");
    must_save(&store, &absent).await;
    must_save(&store, &empty).await;
    let absent_back = must_get(&store, &topic, &absent.callback).await;
    let empty_back = must_get(&store, &topic, &empty.callback).await;
    assert_eq!(absent_back.secret, None);
    assert_eq!(empty_back.secret, Some(String::new()));
    assert_eq!(absent_back, absent);
    assert_eq!(empty_back, empty);
}

/// Timestamps with odd microseconds, far past and far future, read back equal.
pub async fn timestamps_keep_microseconds(store: SharedStore) {
    let topic = unique_topic();
    let at = |seconds: i64, micros: u32| {
        DateTime::from_timestamp(seconds, micros * 1_000).expect("a valid timestamp")
    };
    let cases = [
        (at(1_700_000_000, 123_457), Some(at(1_700_000_001, 999_999))),
        (at(946_684_800, 1), Some(at(4_102_444_799, 654_321))),
        (at(1, 0), None),
    ];
    for (created, expires) in cases {
        let mut subscription = Subscription::new(&topic, unique_callback());
        subscription.created_at = created;
        subscription.verified_at = created + Duration::microseconds(7);
        subscription.expires_at = expires;
        subscription.lease_seconds = expires.map(|_| 1);
        must_save(&store, &subscription).await;
        assert_eq!(
            must_get(&store, &topic, &subscription.callback).await,
            subscription
        );
    }
}

/// Unicode and 2 KB URLs are stored and found byte for byte.
pub async fn unicode_and_long_urls_round_trip(store: SharedStore) {
    let topic = format!("{}/ñandú/日本語/🦀?q=é&x=1", unique_topic());
    let long_callback = format!("{}?pad={}", unique_callback(), "x".repeat(2048));
    let long_topic = format!("{}/{}", unique_topic(), "t".repeat(2048));
    for (topic, callback) in [
        (topic.as_str(), long_callback.as_str()),
        (long_topic.as_str(), "https://sub.storetest.example/ü/回调"),
    ] {
        let subscription = leased(topic, callback);
        must_save(&store, &subscription).await;
        assert_eq!(must_get(&store, topic, callback).await, subscription);
        assert_eq!(callbacks_of(&store, topic).await, vec![callback.to_owned()]);
        assert_eq!(
            all_topics(&store)
                .await
                .iter()
                .filter(|t| t.as_str() == topic)
                .count(),
            1
        );
    }
}

/// Callbacks that differ only in their query string are different pairs.
pub async fn callback_query_strings_are_part_of_the_pair(store: SharedStore) {
    let topic = unique_topic();
    let base = unique_callback();
    let first = format!("{base}?id=1");
    let second = format!("{base}?id=2");
    must_save(&store, &leased(&topic, &first)).await;
    must_save(&store, &leased(&topic, &second)).await;
    must_save(&store, &leased(&topic, &base)).await;
    let mut expected = vec![base.clone(), first.clone(), second.clone()];
    expected.sort();
    assert_eq!(callbacks_of(&store, &topic).await, expected);
    must_delete(&store, &topic, &first).await;
    assert_unknown(store.get(&topic, &first).await, &topic, &first);
    must_get(&store, &topic, &second).await;
    must_get(&store, &topic, &base).await;
}

/// A re-save overwrites every field, including clearing optional ones.
pub async fn save_replaces_every_field(store: SharedStore) {
    let original = leased(&unique_topic(), &unique_callback());
    must_save(&store, &original).await;

    let later = original.verified_at + Duration::seconds(90);
    let changed = Subscription {
        topic: original.topic.clone(),
        callback: original.callback.clone(),
        secret: Some("another secret".to_owned()),
        lease_seconds: Some(60),
        created_at: original.created_at + Duration::microseconds(1),
        verified_at: later,
        expires_at: Some(later + Duration::seconds(60)),
        owner: Some(unique_owner()),
    };
    must_save(&store, &changed).await;
    assert_eq!(
        must_get(&store, &original.topic, &original.callback).await,
        changed
    );

    let cleared = Subscription {
        secret: None,
        lease_seconds: None,
        expires_at: None,
        owner: None,
        ..changed.clone()
    };
    must_save(&store, &cleared).await;
    assert_eq!(
        must_get(&store, &original.topic, &original.callback).await,
        cleared
    );
}

/// Saving one pair twice leaves one subscription, not two, and no error.
pub async fn save_twice_leaves_one_subscription(store: SharedStore) {
    let subscription = leased(&unique_topic(), &unique_callback());
    must_save(&store, &subscription).await;
    must_save(&store, &subscription).await;
    let listed = store
        .list_by_topic(&subscription.topic)
        .await
        .expect("list_by_topic");
    assert_eq!(listed.len(), 1, "a re-save created a second subscription");
    let owner = subscription.owner.as_deref().expect("owner set");
    assert_eq!(count_of(&store, owner).await, 1);
}

/// `get` of a pair never saved is `UnknownSubscription`.
pub async fn get_missing_is_unknown_subscription(store: SharedStore) {
    let (topic, callback) = (unique_topic(), unique_callback());
    assert_unknown(store.get(&topic, &callback).await, &topic, &callback);
    // A known topic with an unknown callback is still unknown.
    must_save(&store, &leased(&topic, &unique_callback())).await;
    assert_unknown(store.get(&topic, &callback).await, &topic, &callback);
}

/// `get` after `delete` is `UnknownSubscription`.
pub async fn get_after_delete_is_unknown_subscription(store: SharedStore) {
    let subscription = leased(&unique_topic(), &unique_callback());
    must_save(&store, &subscription).await;
    must_delete(&store, &subscription.topic, &subscription.callback).await;
    assert_unknown(
        store.get(&subscription.topic, &subscription.callback).await,
        &subscription.topic,
        &subscription.callback,
    );
    assert!(callbacks_of(&store, &subscription.topic).await.is_empty());
}

/// Deleting a pair that was never saved succeeds.
pub async fn delete_missing_is_ok(store: SharedStore) {
    must_delete(&store, &unique_topic(), &unique_callback()).await;
}

/// Deleting twice succeeds both times.
pub async fn delete_twice_is_ok(store: SharedStore) {
    let subscription = leased(&unique_topic(), &unique_callback());
    must_save(&store, &subscription).await;
    must_delete(&store, &subscription.topic, &subscription.callback).await;
    must_delete(&store, &subscription.topic, &subscription.callback).await;
    let owner = subscription.owner.as_deref().expect("owner set");
    assert_eq!(count_of(&store, owner).await, 0);
}

/// One callback subscribed to several topics holds independent subscriptions.
pub async fn same_callback_on_many_topics_is_independent(store: SharedStore) {
    let callback = unique_callback();
    let topics: Vec<String> = (0..4).map(|_| unique_topic()).collect();
    for (index, topic) in topics.iter().enumerate() {
        let mut subscription = leased(topic, &callback);
        subscription.secret = Some(format!("secret-{index}"));
        must_save(&store, &subscription).await;
    }
    must_delete(&store, &topics[0], &callback).await;
    assert_unknown(
        store.get(&topics[0], &callback).await,
        &topics[0],
        &callback,
    );
    for (index, topic) in topics.iter().enumerate().skip(1) {
        let found = must_get(&store, topic, &callback).await;
        assert_eq!(found.secret, Some(format!("secret-{index}")));
        assert_eq!(callbacks_of(&store, topic).await, vec![callback.clone()]);
    }
}

/// One topic with several callbacks holds independent subscriptions.
pub async fn same_topic_with_many_callbacks_is_independent(store: SharedStore) {
    let topic = unique_topic();
    let mut callbacks: Vec<String> = (0..5).map(|_| unique_callback()).collect();
    for callback in &callbacks {
        must_save(&store, &leased(&topic, callback)).await;
    }
    callbacks.sort();
    assert_eq!(callbacks_of(&store, &topic).await, callbacks);

    let removed = callbacks.remove(2);
    must_delete(&store, &topic, &removed).await;
    assert_eq!(callbacks_of(&store, &topic).await, callbacks);
    for callback in &callbacks {
        must_get(&store, &topic, callback).await;
    }
}

/// A topic nobody subscribed to lists nothing.
pub async fn list_by_topic_of_unknown_topic_is_empty(store: SharedStore) {
    assert!(callbacks_of(&store, &unique_topic()).await.is_empty());
}

/// `list_by_topic` returns the topic's subscriptions and nothing else, even
/// for topics that share a prefix.
pub async fn list_by_topic_returns_only_that_topic(store: SharedStore) {
    let topic = unique_topic();
    let prefixed = format!("{topic}/more");
    let own = unique_callback();
    must_save(&store, &leased(&topic, &own)).await;
    must_save(&store, &leased(&prefixed, &unique_callback())).await;
    assert_eq!(callbacks_of(&store, &topic).await, vec![own]);
}

/// One page of `topic` after `after`, checked against the page rules that
/// need no knowledge of the backend's order.
async fn page_of(
    store: &SharedStore,
    topic: &str,
    after: Option<&str>,
    limit: usize,
) -> Vec<Subscription> {
    let page = store
        .list_by_topic_page(topic, after, limit)
        .await
        .unwrap_or_else(|error| panic!("list_by_topic_page({topic}, {after:?}) failed: {error}"));
    assert!(
        page.len() <= limit,
        "a page of {limit} held {} subscriptions",
        page.len()
    );
    assert!(
        page.iter().all(|subscription| subscription.topic == topic),
        "list_by_topic_page returned another topic"
    );
    page
}

/// Every subscription of `topic`, walked in pages of `limit`.
async fn walk_topic(store: &SharedStore, topic: &str, limit: usize) -> Vec<Subscription> {
    let mut walked = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = page_of(store, topic, after.as_deref(), limit).await;
        let last = page.len() < limit;
        after = page
            .last()
            .map(|subscription| subscription.callback.clone());
        walked.extend(page);
        if last {
            return walked;
        }
    }
}

fn callbacks_in_order(subscriptions: &[Subscription]) -> Vec<&str> {
    subscriptions
        .iter()
        .map(|subscription| subscription.callback.as_str())
        .collect()
}

/// Walking a topic in pages returns each of its subscriptions once and
/// whole, in pages no longer than asked, in one order whatever the page size;
/// a short page is the last; and a walk goes on past a callback deleted
/// under it.
pub async fn list_by_topic_page_walks_every_subscription_once(store: SharedStore) {
    let topic = unique_topic();
    let base = unique_callback();
    // Prefixes of one another, punctuation that byte order and linguistic
    // collations place differently, query strings, unicode, a long URL.
    let mut callbacks = vec![
        base.clone(),
        format!("{base}?x=1"),
        format!("{base}?x=10"),
        format!("{base}/more"),
        format!("{base}-a"),
        format!("{base}_B"),
        format!("{base}.b"),
        format!("{base}/ünïcode/日本"),
        format!("{base}/{}", "long".repeat(600)),
    ];
    callbacks.extend((0..14).map(|_| unique_callback()));
    for callback in &callbacks {
        must_save(&store, &leased(&topic, callback)).await;
    }
    // A topic that extends this one must not leak into its pages.
    must_save(&store, &leased(&format!("{topic}/more"), &base)).await;

    assert!(page_of(&store, &topic, None, 0).await.is_empty());
    assert!(page_of(&store, &unique_topic(), None, 5).await.is_empty());

    let in_threes = walk_topic(&store, &topic, 3).await;
    let mut walked: Vec<String> = callbacks_in_order(&in_threes)
        .into_iter()
        .map(str::to_owned)
        .collect();
    walked.sort();
    assert_eq!(
        walked,
        callbacks_of(&store, &topic).await,
        "a walk returns every subscription of the topic exactly once"
    );
    for subscription in &in_threes {
        assert_eq!(
            subscription,
            &must_get(&store, &topic, &subscription.callback).await,
            "a page returns whole subscriptions"
        );
    }
    for limit in [1, 7, callbacks.len(), 1000] {
        assert_eq!(
            callbacks_in_order(&walk_topic(&store, &topic, limit).await),
            callbacks_in_order(&in_threes),
            "pages of {limit} walk in another order than pages of 3"
        );
    }

    // The last callback of a page is deleted before the next page is asked
    // for: the walk goes on from where it was.
    let first = page_of(&store, &topic, None, 4).await;
    let gone = first
        .last()
        .map(|subscription| subscription.callback.clone());
    let gone = gone.expect("the first page is full");
    must_delete(&store, &topic, &gone).await;
    let mut resumed = first;
    let mut after = Some(gone.clone());
    loop {
        let page = page_of(&store, &topic, after.as_deref(), 4).await;
        let last = page.len() < 4;
        after = page
            .last()
            .map(|subscription| subscription.callback.clone());
        resumed.extend(page);
        if last {
            break;
        }
    }
    assert_eq!(
        callbacks_in_order(&resumed),
        callbacks_in_order(&in_threes),
        "a walk past a deleted callback returns what follows it"
    );
    assert!(
        page_of(&store, &topic, Some(&gone), 1000)
            .await
            .iter()
            .all(|subscription| subscription.callback != gone)
    );
}

/// A topic has subscriptions from its first save to its last delete, and
/// another topic's subscriptions never count.
pub async fn has_subscriptions_follows_the_topic(store: SharedStore) {
    let (topic, neighbour) = (unique_topic(), unique_topic());
    let has = |topic: String| {
        let store = store.clone();
        async move {
            store
                .has_subscriptions(&topic)
                .await
                .expect("has_subscriptions")
        }
    };
    assert!(
        !has(topic.clone()).await,
        "a topic never saved has subscriptions"
    );
    must_save(&store, &leased(&neighbour, &unique_callback())).await;
    assert!(
        !has(topic.clone()).await,
        "another topic's subscription counted"
    );
    let (first, second) = (unique_callback(), unique_callback());
    must_save(&store, &leased(&topic, &first)).await;
    must_save(&store, &leased(&topic, &second)).await;
    assert!(has(topic.clone()).await);
    must_delete(&store, &topic, &first).await;
    assert!(
        has(topic.clone()).await,
        "gone before its last subscription"
    );
    must_delete(&store, &topic, &second).await;
    assert!(
        !has(topic.clone()).await,
        "still there after its last subscription"
    );
    assert!(has(neighbour).await);
}

/// Each topic with subscriptions is listed exactly once.
pub async fn topics_lists_each_topic_once(store: SharedStore) {
    let mine: Vec<String> = (0..3).map(|_| unique_topic()).collect();
    for topic in &mine {
        for _ in 0..3 {
            must_save(&store, &leased(topic, &unique_callback())).await;
        }
    }
    let listed = all_topics(&store).await;
    for topic in &mine {
        assert_eq!(
            listed.iter().filter(|listed| *listed == topic).count(),
            1,
            "{topic} not listed exactly once"
        );
    }
    let distinct: HashSet<&String> = listed.iter().collect();
    assert_eq!(distinct.len(), listed.len(), "topics lists duplicates");
}

/// A topic leaves `topics` with its last subscription, and not before.
pub async fn topic_disappears_with_its_last_subscription(store: SharedStore) {
    let topic = unique_topic();
    let (first, second) = (unique_callback(), unique_callback());
    must_save(&store, &leased(&topic, &first)).await;
    must_save(&store, &leased(&topic, &second)).await;
    must_delete(&store, &topic, &first).await;
    assert!(all_topics(&store).await.contains(&topic));
    must_delete(&store, &topic, &second).await;
    assert!(!all_topics(&store).await.contains(&topic));
}

/// Expiring exactly at `before` is excluded; a microsecond earlier included.
pub async fn list_expiring_is_strictly_before(store: SharedStore) {
    let topic = unique_topic();
    let boundary = now() + Duration::days(3);
    let mut expected = Vec::new();
    for (offset, included) in [(-1_000_000, true), (-1, true), (0, false), (1, false)] {
        let mut subscription = leased(&topic, &unique_callback());
        subscription.expires_at = Some(boundary + Duration::microseconds(offset));
        must_save(&store, &subscription).await;
        if included {
            expected.push(subscription.callback);
        }
    }
    expected.sort();
    assert_eq!(expiring_of(&store, &topic, boundary).await, expected);
}

/// A `before` with a sub-microsecond part includes the microsecond it falls
/// in: a subscription expiring at `t` is before `t + 0.5 µs`, not before
/// `t - 0.5 µs`.
pub async fn list_expiring_bound_inside_a_microsecond(store: SharedStore) {
    let topic = unique_topic();
    let mut subscription = leased(&topic, &unique_callback());
    let expires_at = now() + Duration::days(4);
    subscription.expires_at = Some(expires_at);
    must_save(&store, &subscription).await;
    let half = Duration::nanoseconds(500);
    assert_eq!(
        expiring_of(&store, &topic, expires_at + half).await,
        vec![subscription.callback.clone()]
    );
    assert!(
        expiring_of(&store, &topic, expires_at - half)
            .await
            .is_empty()
    );
}

/// Permanent subscriptions are never expiring, however late `before` is.
pub async fn list_expiring_never_returns_permanent(store: SharedStore) {
    let topic = unique_topic();
    let permanent = Subscription::new(&topic, unique_callback()).with_owner(unique_owner());
    must_save(&store, &permanent).await;
    let far_future = DateTime::from_timestamp(4_000_000_000, 0).expect("valid");
    assert!(expiring_of(&store, &topic, far_future).await.is_empty());
}

/// A renewal moves the expiry; making a subscription permanent removes it.
pub async fn list_expiring_follows_renewals(store: SharedStore) {
    let topic = unique_topic();
    let mut subscription = leased(&topic, &unique_callback());
    subscription.expires_at = Some(now() + Duration::seconds(10));
    must_save(&store, &subscription).await;
    let probe = now() + Duration::minutes(1);
    assert_eq!(
        expiring_of(&store, &topic, probe).await,
        vec![subscription.callback.clone()]
    );

    subscription.expires_at = Some(now() + Duration::days(1));
    must_save(&store, &subscription).await;
    assert!(expiring_of(&store, &topic, probe).await.is_empty());
    assert_eq!(
        expiring_of(&store, &topic, probe + Duration::days(2)).await,
        vec![subscription.callback.clone()]
    );

    subscription.expires_at = None;
    subscription.lease_seconds = None;
    must_save(&store, &subscription).await;
    assert!(
        expiring_of(&store, &topic, probe + Duration::days(2))
            .await
            .is_empty()
    );
}

/// A deleted subscription is no longer expiring.
pub async fn list_expiring_forgets_deleted(store: SharedStore) {
    let topic = unique_topic();
    let subscription = leased(&topic, &unique_callback());
    must_save(&store, &subscription).await;
    let probe = now() + Duration::days(30);
    assert_eq!(
        expiring_of(&store, &topic, probe).await,
        vec![subscription.callback.clone()]
    );
    must_delete(&store, &topic, &subscription.callback).await;
    assert!(expiring_of(&store, &topic, probe).await.is_empty());
}

/// 32 tasks upserting one pair at once leave one subscription holding one of
/// the written values.
pub async fn concurrent_upserts_of_one_pair_leave_one(store: SharedStore) {
    let (topic, callback) = (unique_topic(), unique_callback());
    let written: Vec<Subscription> = (0..32)
        .map(|index| {
            let mut subscription = leased(&topic, &callback);
            subscription.secret = Some(format!("writer-{index}"));
            subscription.lease_seconds = Some(100 + index);
            subscription
        })
        .collect();
    let tasks = written.iter().cloned().map(|subscription| {
        let store = store.clone();
        tokio::spawn(async move { store.save(&subscription).await })
    });
    for result in futures::future::join_all(tasks).await {
        result.expect("task").expect("concurrent save");
    }
    let listed = store.list_by_topic(&topic).await.expect("list_by_topic");
    assert_eq!(
        listed.len(),
        1,
        "concurrent upserts left {} rows",
        listed.len()
    );
    assert!(
        written.contains(&listed[0]),
        "the stored value is none of the written ones: {:?}",
        listed[0]
    );
    let owners_holding = {
        let mut total = 0;
        for subscription in &written {
            total += count_of(&store, subscription.owner.as_deref().expect("owner")).await;
        }
        total
    };
    assert_eq!(owners_holding, 1, "owner counts disagree with the one row");
}

/// Concurrent saves and deletes of distinct pairs lose nothing.
pub async fn concurrent_saves_and_deletes_of_distinct_pairs_lose_nothing(store: SharedStore) {
    let topic = unique_topic();
    let doomed: Vec<Subscription> = (0..32)
        .map(|_| leased(&topic, &unique_callback()))
        .collect();
    for subscription in &doomed {
        must_save(&store, subscription).await;
    }
    let kept: Vec<Subscription> = (0..64)
        .map(|_| leased(&topic, &unique_callback()))
        .collect();

    let saves = kept.iter().cloned().map(|subscription| {
        let store = store.clone();
        tokio::spawn(async move { store.save(&subscription).await })
    });
    let deletes = doomed.iter().cloned().map(|subscription| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .delete(&subscription.topic, &subscription.callback)
                .await
        })
    });
    let (saved, deleted) = futures::future::join(
        futures::future::join_all(saves),
        futures::future::join_all(deletes),
    )
    .await;
    for result in saved.into_iter().chain(deleted) {
        result.expect("task").expect("concurrent write");
    }

    let mut expected: Vec<String> = kept.iter().map(|s| s.callback.clone()).collect();
    expected.sort();
    assert_eq!(callbacks_of(&store, &topic).await, expected);
    for subscription in &kept {
        assert_eq!(
            &must_get(&store, &topic, &subscription.callback).await,
            subscription
        );
    }
}

/// `count_by_owner` counts the owner's subscriptions across topics and no one
/// else's.
pub async fn count_by_owner_counts_only_that_owner(store: SharedStore) {
    let (owner, other) = (unique_owner(), unique_owner());
    for _ in 0..3 {
        must_save(
            &store,
            &leased(&unique_topic(), &unique_callback()).with_owner(&owner),
        )
        .await;
    }
    must_save(
        &store,
        &leased(&unique_topic(), &unique_callback()).with_owner(&other),
    )
    .await;
    must_save(
        &store,
        &Subscription::new(unique_topic(), unique_callback()),
    )
    .await;
    assert_eq!(count_of(&store, &owner).await, 3);
    assert_eq!(count_of(&store, &other).await, 1);
    assert_eq!(count_of(&store, &unique_owner()).await, 0);
}

/// A re-save under another owner moves the subscription between counts.
pub async fn count_by_owner_follows_owner_changes(store: SharedStore) {
    let (first, second) = (unique_owner(), unique_owner());
    let subscription = leased(&unique_topic(), &unique_callback()).with_owner(&first);
    must_save(&store, &subscription).await;
    must_save(&store, &subscription.clone().with_owner(&second)).await;
    assert_eq!(count_of(&store, &first).await, 0);
    assert_eq!(count_of(&store, &second).await, 1);
    let mut ownerless = subscription;
    ownerless.owner = None;
    must_save(&store, &ownerless).await;
    assert_eq!(count_of(&store, &second).await, 0);
}

/// `list_by_owner` returns every field of the owner's subscriptions, across
/// topics, and no one else's.
pub async fn list_by_owner_returns_only_that_owner(store: SharedStore) {
    let (owner, other) = (unique_owner(), unique_owner());
    let shared_topic = unique_topic();
    let mut mine = vec![
        leased(&shared_topic, &unique_callback()).with_owner(&owner),
        leased(&unique_topic(), &unique_callback()).with_owner(&owner),
        Subscription::new(unique_topic(), unique_callback()).with_owner(&owner),
    ];
    for subscription in &mine {
        must_save(&store, subscription).await;
    }
    must_save(
        &store,
        &leased(&shared_topic, &unique_callback()).with_owner(&other),
    )
    .await;
    must_save(&store, &leased(&shared_topic, &unique_callback())).await;
    mine.sort_by(|a, b| (&a.topic, &a.callback).cmp(&(&b.topic, &b.callback)));
    assert_eq!(owned_by(&store, &owner).await, mine);
    assert_eq!(owned_by(&store, &other).await.len(), 1);
    assert!(owned_by(&store, &unique_owner()).await.is_empty());
}

/// A re-save under another owner moves the subscription between lists; a
/// delete removes it.
pub async fn list_by_owner_follows_owner_changes_and_deletes(store: SharedStore) {
    let (first, second) = (unique_owner(), unique_owner());
    let subscription = leased(&unique_topic(), &unique_callback()).with_owner(&first);
    must_save(&store, &subscription).await;
    let moved = subscription.clone().with_owner(&second);
    must_save(&store, &moved).await;
    assert!(owned_by(&store, &first).await.is_empty());
    assert_eq!(owned_by(&store, &second).await, vec![moved]);
    store
        .delete(&subscription.topic, &subscription.callback)
        .await
        .expect("delete");
    assert!(owned_by(&store, &second).await.is_empty());
}

/// Below the limit, a conditional save saves.
pub async fn conditional_save_below_limit_saves(store: SharedStore) {
    let owner = unique_owner();
    let quota = OwnerQuota::new(2);
    for _ in 0..2 {
        let subscription = leased(&unique_topic(), &unique_callback()).with_owner(&owner);
        store
            .save_within_limit(&subscription, &quota)
            .await
            .expect("a save below the limit");
        assert_eq!(
            must_get(&store, &subscription.topic, &subscription.callback).await,
            subscription
        );
    }
    assert_eq!(count_of(&store, &owner).await, 2);
}

/// At the limit, a new pair is refused with the count seen, and not saved.
pub async fn conditional_save_at_limit_is_refused_with_count(store: SharedStore) {
    let owner = unique_owner();
    let quota = OwnerQuota::new(3);
    for _ in 0..3 {
        must_save(
            &store,
            &leased(&unique_topic(), &unique_callback()).with_owner(&owner),
        )
        .await;
    }
    let refused = leased(&unique_topic(), &unique_callback()).with_owner(&owner);
    match store.save_within_limit(&refused, &quota).await {
        Err(StoreError::LimitReached { limit: 3, used: 3 }) => {}
        other => panic!("expected LimitReached {{ limit: 3, used: 3 }}, got {other:?}"),
    }
    assert_unknown(
        store.get(&refused.topic, &refused.callback).await,
        &refused.topic,
        &refused.callback,
    );
    let zero = leased(&unique_topic(), &unique_callback()).with_owner(unique_owner());
    assert!(matches!(
        store.save_within_limit(&zero, &OwnerQuota::new(0)).await,
        Err(StoreError::LimitReached { limit: 0, used: 0 })
    ));
}

/// Re-saving a pair the owner already holds succeeds at the limit, and
/// replaces the stored value.
pub async fn conditional_resave_at_limit_succeeds(store: SharedStore) {
    let owner = unique_owner();
    let quota = OwnerQuota::new(2);
    let held = leased(&unique_topic(), &unique_callback()).with_owner(&owner);
    store.save_within_limit(&held, &quota).await.expect("first");
    let other = leased(&unique_topic(), &unique_callback()).with_owner(&owner);
    store
        .save_within_limit(&other, &quota)
        .await
        .expect("second");

    let renewed = Subscription {
        secret: Some("renewed".to_owned()),
        expires_at: held.expires_at.map(|at| at + Duration::days(1)),
        ..held.clone()
    };
    store
        .save_within_limit(&renewed, &quota)
        .await
        .expect("a re-save of a held pair never counts as new");
    assert_eq!(must_get(&store, &held.topic, &held.callback).await, renewed);
    assert_eq!(count_of(&store, &owner).await, 2);
}

/// A conditional save without an owner is refused as `MissingOwner`.
pub async fn conditional_save_needs_an_owner(store: SharedStore) {
    let subscription = Subscription::new(unique_topic(), unique_callback());
    assert!(matches!(
        store
            .save_within_limit(&subscription, &OwnerQuota::new(10))
            .await,
        Err(StoreError::MissingOwner)
    ));
    assert_unknown(
        store.get(&subscription.topic, &subscription.callback).await,
        &subscription.topic,
        &subscription.callback,
    );
}

/// Deleting one of the owner's subscriptions frees a slot.
pub async fn conditional_save_frees_slot_after_delete(store: SharedStore) {
    let owner = unique_owner();
    let quota = OwnerQuota::new(1);
    let first = leased(&unique_topic(), &unique_callback()).with_owner(&owner);
    store
        .save_within_limit(&first, &quota)
        .await
        .expect("first");
    let second = leased(&unique_topic(), &unique_callback()).with_owner(&owner);
    assert!(matches!(
        store.save_within_limit(&second, &quota).await,
        Err(StoreError::LimitReached { .. })
    ));
    must_delete(&store, &first.topic, &first.callback).await;
    store
        .save_within_limit(&second, &quota)
        .await
        .expect("the slot freed by the delete");
}

/// Other owners' subscriptions, and a pair held by another owner, do not
/// count against this owner.
pub async fn conditional_saves_of_other_owners_do_not_count(store: SharedStore) {
    let (owner, other) = (unique_owner(), unique_owner());
    let quota = OwnerQuota::new(1);
    let others = leased(&unique_topic(), &unique_callback()).with_owner(&other);
    store
        .save_within_limit(&others, &quota)
        .await
        .expect("other owner");
    let taken_over = Subscription {
        owner: Some(owner.clone()),
        ..others.clone()
    };
    store
        .save_within_limit(&taken_over, &quota)
        .await
        .expect("this owner holds nothing yet");
    assert_eq!(count_of(&store, &owner).await, 1);
    assert_eq!(count_of(&store, &other).await, 0);
}

/// 50 concurrent conditional saves of distinct pairs for one owner with a
/// limit of 5 save exactly 5, and the others see `LimitReached`.
pub async fn concurrent_conditional_saves_respect_the_limit(store: SharedStore) {
    let owner = unique_owner();
    let quota = OwnerQuota::new(5);
    let topic = unique_topic();
    let tasks = (0..50).map(|_| {
        let store = store.clone();
        let quota = quota.clone();
        let subscription = leased(&topic, &unique_callback()).with_owner(&owner);
        tokio::spawn(async move { store.save_within_limit(&subscription, &quota).await })
    });
    let mut saved = 0;
    let mut refused = 0;
    for result in futures::future::join_all(tasks).await {
        match result.expect("task") {
            Ok(()) => saved += 1,
            Err(StoreError::LimitReached { limit: 5, used: 5 }) => refused += 1,
            Err(other) => panic!("unexpected error from a conditional save: {other}"),
        }
    }
    assert_eq!((saved, refused), (5, 45));
    assert_eq!(count_of(&store, &owner).await, 5);
    assert_eq!(callbacks_of(&store, &topic).await.len(), 5);
}
