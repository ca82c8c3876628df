//! Saving, reading and deleting one pair: replacement, absence, independence of pairs.

use chrono::Duration;
use websub_store::Subscription;

use crate::helpers::*;

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

/// `save_all` saves each of a group as `save` would: new pairs beside a
/// replaced one, every field as given (optional ones absent included), and
/// an empty group is no change.
pub async fn save_all_saves_each_as_save_would(store: SharedStore) {
    let topic = unique_topic();
    let existing = leased(&topic, &unique_callback());
    must_save(&store, &existing).await;
    let later = existing.verified_at + Duration::seconds(30);
    let replaced = Subscription {
        secret: None,
        lease_seconds: Some(60),
        verified_at: later,
        expires_at: Some(later + Duration::seconds(60)),
        owner: None,
        ..existing.clone()
    };
    let permanent = Subscription {
        lease_seconds: None,
        expires_at: None,
        ..leased(&topic, &unique_callback())
    };
    let elsewhere = leased(&unique_topic(), &unique_callback());
    let group = [permanent.clone(), replaced.clone(), elsewhere.clone()];
    store.save_all(&group).await.expect("save_all");
    store.save_all(&[]).await.expect("save_all of none");
    for subscription in &group {
        assert_eq!(
            &must_get(&store, &subscription.topic, &subscription.callback).await,
            subscription
        );
    }
    assert_eq!(callbacks_of(&store, &topic).await.len(), 2);
}

/// A store that answers is ready, with subscriptions stored or none.
pub async fn a_store_that_answers_is_ready(store: SharedStore) {
    let limit = std::time::Duration::from_secs(5);
    store.ready(limit).await.expect("ready with nothing stored");
    must_save(&store, &leased(&unique_topic(), &unique_callback())).await;
    store.ready(limit).await.expect("ready with a subscription");
}

/// `renew_all` saves each of a group as `save_all` would, except that a
/// pair already stored keeps when it was created; a new pair takes the
/// `created_at` given, and an empty group is no change.
pub async fn renew_all_keeps_when_a_pair_was_created(store: SharedStore) {
    let topic = unique_topic();
    let existing = leased(&topic, &unique_callback());
    must_save(&store, &existing).await;
    let later = existing.verified_at + Duration::seconds(30);
    let renewal = Subscription {
        secret: Some("a renewed secret".to_owned()),
        lease_seconds: Some(60),
        created_at: later,
        verified_at: later,
        expires_at: Some(later + Duration::seconds(60)),
        owner: None,
        ..existing.clone()
    };
    let fresh = Subscription {
        created_at: later,
        ..leased(&topic, &unique_callback())
    };
    store
        .renew_all(&[renewal.clone(), fresh.clone()])
        .await
        .expect("renew_all");
    store.renew_all(&[]).await.expect("renew_all of none");
    assert_eq!(
        must_get(&store, &topic, &renewal.callback).await,
        Subscription {
            created_at: existing.created_at,
            ..renewal
        },
        "every field renewed but when it was created"
    );
    assert_eq!(must_get(&store, &topic, &fresh.callback).await, fresh);
    assert_eq!(callbacks_of(&store, &topic).await.len(), 2);
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
