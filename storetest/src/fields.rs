//! Round trips: every field, and the edge cases of each, read back as saved.

use chrono::{DateTime, Duration};
use websub_store::Subscription;

use crate::helpers::*;

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
