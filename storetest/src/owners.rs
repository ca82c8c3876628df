//! Owners: counting and listing by owner, and the quota's conditional save.

use chrono::Duration;
use websub_store::{OwnerQuota, StoreError, Subscription};

use crate::helpers::*;

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
