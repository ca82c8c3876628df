//! The memory backend runs the whole conformance suite.

use std::sync::Arc;

use websub_store::SubscriptionStore;
use websub_store::memory::MemoryStore;

async fn store_for_test() -> Option<Arc<dyn SubscriptionStore>> {
    Some(Arc::new(MemoryStore::new()))
}

websub_storetest::suite!(store_for_test);

/// One store for every check in turn: each check isolates itself, so they
/// must also pass against a store the others have already filled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_all_on_one_store() {
    websub_storetest::run_all(Arc::new(MemoryStore::new())).await;
}
