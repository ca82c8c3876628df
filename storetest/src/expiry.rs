//! `list_expiring`: its bound, permanent subscriptions, renewals and deletes.

use chrono::{DateTime, Duration};
use websub_store::Subscription;

use crate::helpers::*;

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
