//! Listing by topic (whole and by pages), the existence check, and the topic list.

use std::collections::HashSet;

use websub_store::Subscription;

use crate::helpers::*;

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
    // collations place differently, query strings, unicode, a long URL,
    // characters a backend that reads pages as JSON must escape.
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
        format!("{base}/\"quoted\"\\back\tslash"),
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
