//! Writers racing on one pair and on many.

use websub_store::Subscription;

use crate::helpers::*;

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
