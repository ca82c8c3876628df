//! What the Redis store's tests share, on a single server and on a
//! cluster alike: the key layout rebuilt from the module doc (so a test
//! can plant what a crash between two steps leaves), and the check that
//! readers ignore such leftovers and later retire them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use chrono::{Duration, Utc};
use redis::aio::ConnectionLike;
use sha2::{Digest, Sha256};
use websub_store::redis::RedisStore;
use websub_store::{OwnerQuota, StoreError, Subscription, SubscriptionStore};

/// A prefix no other test (or run) uses, so a test may assert on whole
/// results without seeing anyone else's subscriptions.
pub(crate) fn unique_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    format!(
        "websub-test-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The keys of one store, as the module doc of `websub_store::redis`
/// lays them out.
pub(crate) struct Layout {
    pub(crate) prefix: String,
}

impl Layout {
    pub(crate) fn topic_digest(topic: &str) -> String {
        hex::encode(Sha256::digest(topic.as_bytes()))
    }

    pub(crate) fn id(topic: &str, callback: &str) -> String {
        let mut hasher = Sha256::new();
        for part in [topic, callback] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part.as_bytes());
        }
        hex::encode(hasher.finalize())
    }

    /// `<topic digest>:<id>`, how indexes name a subscription.
    pub(crate) fn member(topic: &str, callback: &str) -> String {
        format!(
            "{}:{}",
            Self::topic_digest(topic),
            Self::id(topic, callback)
        )
    }

    pub(crate) fn subscription(&self, topic: &str, callback: &str) -> String {
        format!(
            "{{{}:{}}}:sub:{}",
            self.prefix,
            Self::topic_digest(topic),
            Self::id(topic, callback)
        )
    }

    pub(crate) fn ids(&self, topic: &str) -> String {
        format!("{{{}:{}}}:ids", self.prefix, Self::topic_digest(topic))
    }

    pub(crate) fn owner(&self, owner: &str) -> String {
        format!(
            "{{{}:owner:{}}}",
            self.prefix,
            hex::encode(Sha256::digest(owner.as_bytes()))
        )
    }

    pub(crate) fn owner_pending(&self, owner: &str) -> String {
        format!("{}:pending", self.owner(owner))
    }

    /// The bucket of a pair and its entry there for an expiry.
    pub(crate) fn expiry_entry(
        &self,
        topic: &str,
        callback: &str,
        expires: i64,
    ) -> (String, String) {
        let id = Self::id(topic, callback);
        let bucket = &id[..1];
        (
            format!("{{{}:expiry:{bucket}}}", self.prefix),
            format!("{}:{id}:{expires}", Self::topic_digest(topic)),
        )
    }

    pub(crate) fn registry(&self) -> String {
        format!("{{{}:topics}}", self.prefix)
    }
}

/// A token as the store writes them, `age` in the past.
pub(crate) fn token_aged(age: Duration) -> String {
    (Utc::now() - age).timestamp_micros().to_string()
}

async fn run<C: ConnectionLike>(raw: &mut C, command: &mut redis::Cmd) {
    let () = command
        .query_async(raw)
        .await
        .unwrap_or_else(|error| panic!("{command:?}: {error}"));
}

async fn hexists<C: ConnectionLike>(raw: &mut C, key: &str, field: &str) -> bool {
    redis::cmd("HEXISTS")
        .arg(key)
        .arg(field)
        .query_async(raw)
        .await
        .expect("hexists")
}

/// Plants what crashes between steps leave, through `raw` (a connection of
/// its own to the same server or cluster), and checks that `store` reads
/// around each leftover, counts owners exactly, never lets a leftover past
/// a quota, and retires each leftover once it is provably one.
pub(crate) async fn leftovers_are_ignored_and_retired<C: ConnectionLike>(
    store: &RedisStore,
    raw: &mut C,
    layout: &Layout,
) {
    let topic = "https://example.com/leftover";
    let quota = OwnerQuota::new(1);

    // A save that reserved its pair for "carol" and died before writing.
    // While the reservation is young it may be a save still in flight:
    // readers ignore it, and the quota counts it.
    let dead = "https://sub.example/died-mid-save";
    let member = Layout::member(topic, dead);
    run(
        raw,
        redis::cmd("HSET")
            .arg(layout.owner("carol"))
            .arg(&member)
            .arg(token_aged(Duration::zero())),
    )
    .await;
    run(
        raw,
        redis::cmd("HSET")
            .arg(layout.owner_pending("carol"))
            .arg(&member)
            .arg(1),
    )
    .await;
    assert_eq!(store.count_by_owner("carol").await.expect("count"), 0);
    assert!(store.list_by_owner("carol").await.expect("list").is_empty());
    assert!(matches!(
        store.get(topic, dead).await,
        Err(StoreError::UnknownSubscription { .. })
    ));
    let next = Subscription::new(topic, "https://sub.example/next").with_owner("carol");
    assert!(matches!(
        store.save_within_limit(&next, &quota).await,
        Err(StoreError::LimitReached { limit: 1, used: 1 })
    ));
    assert_eq!(store.count_by_owner("carol").await.expect("count"), 0);

    // An hour later no save can still be in flight on it: the refused save
    // retires it and goes through.
    run(
        raw,
        redis::cmd("HSET")
            .arg(layout.owner("carol"))
            .arg(&member)
            .arg(token_aged(Duration::hours(1))),
    )
    .await;
    store
        .save_within_limit(&next, &quota)
        .await
        .expect("the leftover is retired");
    assert_eq!(store.count_by_owner("carol").await.expect("count"), 1);
    assert!(!hexists(raw, &layout.owner("carol"), &member).await);

    // An owner change that died before releasing the old owner: the hash
    // names "erin", "dave" still holds a settled reservation. It counts for
    // nobody, and dave's next conditional save retires it at once.
    let moved = Subscription::new(topic, "https://sub.example/moved").with_owner("dave");
    store.save(&moved).await.expect("save");
    store
        .save(&moved.clone().with_owner("erin"))
        .await
        .expect("owner change");
    let moved_member = Layout::member(topic, &moved.callback);
    run(
        raw,
        redis::cmd("HSET")
            .arg(layout.owner("dave"))
            .arg(&moved_member)
            .arg(token_aged(Duration::zero())),
    )
    .await;
    assert_eq!(store.count_by_owner("dave").await.expect("count"), 0);
    assert_eq!(store.count_by_owner("erin").await.expect("count"), 1);
    let daves = Subscription::new(topic, "https://sub.example/daves").with_owner("dave");
    store
        .save_within_limit(&daves, &quota)
        .await
        .expect("dave holds nothing");
    assert!(!hexists(raw, &layout.owner("dave"), &moved_member).await);

    // An expiry entry whose save died before writing: not expiring, and
    // retired by the pass that found it due.
    let ghost = "https://sub.example/ghost";
    let expires = (Utc::now() - Duration::hours(2)).timestamp_micros();
    let (bucket, entry) = layout.expiry_entry(topic, ghost, expires);
    run(
        raw,
        redis::cmd("ZADD").arg(&bucket).arg(expires).arg(&entry),
    )
    .await;
    run(
        raw,
        redis::cmd("HSET")
            .arg(format!("{bucket}:tokens"))
            .arg(&entry)
            .arg(token_aged(Duration::hours(2))),
    )
    .await;
    let expiring = store.list_expiring(Utc::now()).await.expect("expiring");
    assert!(expiring.iter().all(|sub| sub.callback != ghost));
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(&bucket)
        .arg(&entry)
        .query_async(raw)
        .await
        .expect("zscore");
    assert_eq!(score, None, "the due leftover is retired");

    // A topic registered by a save that died before writing: not listed,
    // and retired by the listing.
    let unborn = "https://example.com/never-written";
    run(
        raw,
        redis::cmd("HSET")
            .arg(layout.registry())
            .arg(unborn)
            .arg(token_aged(Duration::hours(1))),
    )
    .await;
    let topics = store.topics().await.expect("topics");
    assert!(!topics.iter().any(|listed| listed == unborn));
    assert!(topics.iter().any(|listed| listed == topic));
    assert!(!hexists(raw, &layout.registry(), unborn).await);

    // What was saved for real is all there.
    let ids: u64 = redis::cmd("SCARD")
        .arg(layout.ids(topic))
        .query_async(raw)
        .await
        .expect("scard");
    assert_eq!(ids, 3);
    let mut callbacks: Vec<String> = store
        .list_by_topic(topic)
        .await
        .expect("list")
        .into_iter()
        .map(|sub| sub.callback)
        .collect();
    callbacks.sort();
    assert_eq!(
        callbacks,
        vec![
            "https://sub.example/daves".to_owned(),
            "https://sub.example/moved".to_owned(),
            "https://sub.example/next".to_owned(),
        ]
    );
}
