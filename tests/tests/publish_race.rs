//! A publish that comes between a subscriber's answer to the verification
//! and the save of its subscription reaches that subscription: the hub
//! received the answer before it acknowledged the publish, so the publish
//! is the new subscription's, whichever commits first. The store here is a
//! real one whose saves wait at a gate the test opens, so the publish lands
//! in that window every time, on SQLite and on PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::{Notify, Semaphore};
use websub_hub::storage::backlog::Listing;
use websub_store::memory::MemoryStore;
use websub_store::{OwnerQuota, StoreError, Subscription, SubscriptionStore};
use websub_tests::{Backend, TestHub, TestPublisher, TestSubscriber, test_config};

/// A memory store whose saves first say they started, then wait for the
/// gate.
#[derive(Debug)]
struct GatedStore {
    store: MemoryStore,
    saving: Notify,
    gate: Semaphore,
}

impl Default for GatedStore {
    fn default() -> Self {
        Self {
            store: MemoryStore::new(),
            saving: Notify::new(),
            gate: Semaphore::new(0),
        }
    }
}

impl GatedStore {
    async fn held_at_the_gate(&self) {
        self.saving.notify_one();
        // The gate is never closed; a permit, once given, lets every later
        // save through.
        if let Ok(permit) = self.gate.acquire().await {
            permit.forget();
            self.gate.add_permits(1);
        }
    }
}

#[async_trait]
impl SubscriptionStore for GatedStore {
    async fn save(&self, subscription: &Subscription) -> Result<(), StoreError> {
        self.held_at_the_gate().await;
        self.store.save(subscription).await
    }
    async fn get(&self, topic: &str, callback: &str) -> Result<Subscription, StoreError> {
        self.store.get(topic, callback).await
    }
    async fn delete(&self, topic: &str, callback: &str) -> Result<(), StoreError> {
        self.store.delete(topic, callback).await
    }
    async fn list_by_topic(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        self.store.list_by_topic(topic).await
    }
    async fn list_by_topic_page(
        &self,
        topic: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Subscription>, StoreError> {
        self.store.list_by_topic_page(topic, after, limit).await
    }
    async fn topics(&self) -> Result<Vec<String>, StoreError> {
        self.store.topics().await
    }
    async fn list_expiring(&self, before: DateTime<Utc>) -> Result<Vec<Subscription>, StoreError> {
        self.store.list_expiring(before).await
    }
    async fn count_by_owner(&self, owner: &str) -> Result<u64, StoreError> {
        self.store.count_by_owner(owner).await
    }
    async fn list_by_owner(&self, owner: &str) -> Result<Vec<Subscription>, StoreError> {
        self.store.list_by_owner(owner).await
    }
    async fn save_within_limit(
        &self,
        subscription: &Subscription,
        quota: &OwnerQuota,
    ) -> Result<(), StoreError> {
        self.held_at_the_gate().await;
        self.store.save_within_limit(subscription, quota).await
    }
}

async fn a_publish_between_answer_and_save_reaches_the_new_subscription(backend: Backend) {
    let Some(mut config) = test_config(backend).await else {
        return;
    };
    config.internal_api_key = Some(websub_tests::INTERNAL_KEY.to_owned());
    let store = Arc::new(GatedStore::default());
    let hub = TestHub::start_with_store(config, store.clone()).await;
    let subscriber = TestSubscriber::start().await;
    let publisher = TestPublisher::start().await;
    let topic = publisher.topic_url("news");
    publisher.set_topic("news", "text/plain", "thin: fetched in the window", None);
    let callback = subscriber.callback("racer");

    let (status, _) = hub
        .post_form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", &topic),
            ("hub.callback", &callback),
        ])
        .await;
    assert_eq!(status, 202);
    tokio::time::timeout(Duration::from_secs(10), store.saving.notified())
        .await
        .expect("the subscriber answered and the save began");
    assert_eq!(
        subscriber.verifications().len(),
        1,
        "the verification was answered"
    );

    // Both kinds of publish, acknowledged after the answer, before the save.
    let (status, _) = hub.publish(&[&topic]).await;
    assert_eq!(status, 202);
    let (status, _) = hub
        .fat_ping(&topic, "text/plain", "fat: recorded in the window")
        .await;
    assert_eq!(status, 202);
    // The thin ping's fetch is done (its row left the backlog) while the
    // subscription is still unsaved.
    let backlog = websub_hub::storage::backlog::connect(&hub.database_url)
        .await
        .expect("backlog");
    tokio::time::timeout(Duration::from_secs(10), async {
        while !backlog
            .fetches(Listing::default(), 10)
            .await
            .expect("list fetches")
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the thin ping's fetch finished");
    assert!(
        store
            .store
            .list_by_topic(&topic)
            .await
            .expect("list")
            .is_empty(),
        "the subscription was saved before the publishes; the test proves nothing"
    );

    store.gate.add_permits(1);
    let delivered = subscriber
        .wait_for_deliveries("racer", 2, Duration::from_secs(15))
        .await;
    let mut bodies: Vec<String> = delivered
        .iter()
        .map(|delivery| String::from_utf8_lossy(&delivery.body).into_owned())
        .collect();
    bodies.sort();
    assert_eq!(
        bodies,
        ["fat: recorded in the window", "thin: fetched in the window"],
        "both publishes reach the subscription saved after them"
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_between_answer_and_save_reaches_the_new_subscription_on_sqlite() {
    a_publish_between_answer_and_save_reaches_the_new_subscription(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_between_answer_and_save_reaches_the_new_subscription_on_postgres() {
    a_publish_between_answer_and_save_reaches_the_new_subscription(Backend::Postgres).await;
}
