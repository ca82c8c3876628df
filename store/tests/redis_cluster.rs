//! The Redis backend on a real Redis Cluster: the whole conformance suite,
//! then what only a cluster can show — a store's keys spread over slots and
//! nodes by topic, a topic's listing still one slot, the quota held under
//! concurrency when the owner's saves land on different nodes, and
//! leftovers of interrupted saves read around.

#![cfg(feature = "redis")]

use crate::redis_layout;

use std::collections::HashSet;
use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis_layout::{Layout, unique_prefix};
use websub_store::redis::RedisStore;
use websub_store::{OwnerQuota, StoreError, Subscription, SubscriptionStore};

/// The cluster as one `redis://h1:p1,h2:p2,.../` URL, the form
/// `RedisStore::connect` (and `websubd --store`) takes.
fn cluster_url(nodes: &[String]) -> String {
    let hosts: Vec<&str> = nodes
        .iter()
        .map(|node| node.trim_start_matches("redis://").trim_end_matches('/'))
        .collect();
    format!("redis://{}/", hosts.join(","))
}

async fn store_for_test() -> Option<Arc<dyn SubscriptionStore>> {
    let nodes = websub_storetest::servers::redis_cluster_urls()?;
    Some(Arc::new(
        RedisStore::connect(&cluster_url(&nodes))
            .await
            .expect("connect to the test Redis Cluster"),
    ))
}

websub_storetest::suite!(store_for_test);

async fn isolated_store(nodes: &[String], prefix: &str) -> RedisStore {
    RedisStore::cluster_with_prefix(nodes, prefix)
        .await
        .expect("connect to the test Redis Cluster")
}

/// A connection of the test's own, routed by the cluster like the store's.
async fn raw_cluster(nodes: &[String]) -> ClusterConnection {
    ClusterClient::new(nodes.iter().map(String::as_str))
        .expect("node URLs")
        .get_async_connection()
        .await
        .expect("connect to the test Redis Cluster")
}

/// A plain connection to each node, which answers only for its own slots.
async fn each_node(nodes: &[String]) -> Vec<MultiplexedConnection> {
    let mut connections = Vec::new();
    for node in nodes {
        connections.push(
            redis::Client::open(node.as_str())
                .expect("node URL")
                .get_multiplexed_async_connection()
                .await
                .expect("connect to a cluster node"),
        );
    }
    connections
}

async fn slot_of(raw: &mut ClusterConnection, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(raw)
        .await
        .expect("cluster keyslot")
}

/// The index of the node that holds `key`: the one node that answers for
/// it rather than redirecting.
async fn node_holding(nodes: &mut [MultiplexedConnection], key: &str) -> usize {
    let mut holders = Vec::new();
    for (index, node) in nodes.iter_mut().enumerate() {
        let found: Result<u64, _> = redis::cmd("EXISTS").arg(key).query_async(node).await;
        if matches!(found, Ok(1)) {
            holders.push(index);
        }
    }
    assert_eq!(holders.len(), 1, "{key} is held by nodes {holders:?}");
    holders[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn topics_spread_over_slots_and_nodes_and_each_lists_from_one() {
    let Some(urls) = websub_storetest::servers::redis_cluster_urls() else {
        return;
    };
    let prefix = unique_prefix();
    let layout = Layout {
        prefix: prefix.clone(),
    };
    let store = isolated_store(&urls, &prefix).await;
    let mut raw = raw_cluster(&urls).await;
    let mut nodes = each_node(&urls).await;

    // Topics until two of them live on different nodes; with three masters
    // each new topic misses the first one's node two times in three.
    let callbacks = ["https://sub.example/a", "https://sub.example/b"];
    let mut placed: Vec<(String, usize)> = Vec::new();
    for n in 0..64 {
        let topic = format!("https://example.com/feed/{n}");
        for callback in callbacks {
            store
                .save(&Subscription::new(&topic, callback).with_owner("spread"))
                .await
                .expect("save");
        }
        // A topic's hashes and its id set share one slot.
        let ids_slot = slot_of(&mut raw, &layout.ids(&topic)).await;
        for callback in callbacks {
            assert_eq!(
                slot_of(&mut raw, &layout.subscription(&topic, callback)).await,
                ids_slot
            );
        }
        let node = node_holding(&mut nodes, &layout.ids(&topic)).await;
        placed.push((topic, node));
        if placed
            .iter()
            .map(|(_, node)| node)
            .collect::<HashSet<_>>()
            .len()
            > 1
        {
            break;
        }
    }
    let first = &placed[0];
    let other = placed
        .iter()
        .find(|(_, node)| *node != first.1)
        .expect("topics on two different nodes");
    assert_ne!(
        slot_of(&mut raw, &layout.ids(&first.0)).await,
        slot_of(&mut raw, &layout.ids(&other.0)).await
    );
    for (topic, _) in [first, other] {
        let mut listed: Vec<String> = store
            .list_by_topic(topic)
            .await
            .expect("list")
            .into_iter()
            .map(|sub| sub.callback)
            .collect();
        listed.sort();
        assert_eq!(listed, callbacks);
        let page = store
            .list_by_topic_page(topic, None, 1)
            .await
            .expect("page");
        assert_eq!(page.len(), 1);
    }
    let topics: HashSet<String> = store.topics().await.expect("topics").into_iter().collect();
    assert_eq!(
        topics,
        placed.iter().map(|(topic, _)| topic.clone()).collect()
    );
    assert_eq!(
        store.count_by_owner("spread").await.expect("count"),
        2 * placed.len() as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conditional_saves_across_nodes_and_connections_respect_the_limit() {
    let Some(urls) = websub_storetest::servers::redis_cluster_urls() else {
        return;
    };
    let prefix = unique_prefix();
    // Two stores with connections of their own, as two hub processes.
    let stores = [
        isolated_store(&urls, &prefix).await,
        isolated_store(&urls, &prefix).await,
    ];
    let quota = OwnerQuota::new(5);

    // Distinct topics, so the saves write to slots all over the cluster
    // while they claim from the one owner's slot.
    let mut tasks = Vec::new();
    for n in 0..50 {
        let store = stores[n % 2].clone();
        let quota = quota.clone();
        tasks.push(tokio::spawn(async move {
            let sub = Subscription::new(
                format!("https://example.com/feed/{n}"),
                "https://sub.example/cb",
            )
            .with_owner("bob");
            store.save_within_limit(&sub, &quota).await
        }));
    }
    let mut saved = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(()) => saved += 1,
            Err(StoreError::LimitReached { limit: 5, used: 5 }) => {}
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert_eq!(saved, 5);
    for store in &stores {
        assert_eq!(store.count_by_owner("bob").await.expect("count"), 5);
        assert_eq!(store.list_by_owner("bob").await.expect("list").len(), 5);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leftovers_of_interrupted_saves_are_read_around() {
    let Some(urls) = websub_storetest::servers::redis_cluster_urls() else {
        return;
    };
    let prefix = unique_prefix();
    let store = isolated_store(&urls, &prefix).await;
    let mut raw = raw_cluster(&urls).await;
    redis_layout::leftovers_are_ignored_and_retired(&store, &mut raw, &Layout { prefix }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_url_with_one_node_finds_the_others() {
    let Some(urls) = websub_storetest::servers::redis_cluster_urls() else {
        return;
    };
    let host = urls[0].trim_start_matches("redis://").trim_end_matches('/');
    let store = RedisStore::with_prefix(&format!("redis+cluster://{host}/"), &unique_prefix())
        .await
        .expect("connect through one node");
    // Enough topics that some live on nodes other than the one named.
    for n in 0..12 {
        let sub = Subscription::new(format!("https://example.com/{n}"), "https://sub.example/cb");
        store.save(&sub).await.expect("save");
        assert_eq!(
            store.get(&sub.topic, &sub.callback).await.expect("get"),
            sub
        );
    }
    assert_eq!(store.topics().await.expect("topics").len(), 12);
}
